/* SHA-256 (FIPS 180-4) for kvpool's block hasher: a portable C compression
 * function and, on x86-64, one using the SHA extensions (SHA-NI), chosen once
 * at run time with cpuid.
 *
 * Why here and not OpenSSL: CPython's hashlib has no C API, and linking
 * libcrypto would make every wheel carry (or depend on) a shared library.
 * A block pickle is 60-140 bytes, two or three compressions: with SHA-NI that
 * is ~0.1 us, as fast as OpenSSL's assembly, and without EVP's per-call
 * context set-up. Machines without SHA-NI (older Intel, non-x86) get the
 * portable function (~15 cycles/byte).
 *
 * kvpool_sha256(data, len, out) is the whole API.
 */
#ifndef KVPOOL_SHA256_H
#define KVPOOL_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static const uint32_t kvpool_sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

typedef void (*kvpool_sha256_compress_fn)(uint32_t state[8],
                                          const unsigned char *data,
                                          size_t nblocks);

#define KVPOOL_ROTR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static uint32_t kvpool_load_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
           ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static void kvpool_sha256_compress_portable(uint32_t state[8],
                                            const unsigned char *data,
                                            size_t nblocks) {
    uint32_t w[64];
    for (; nblocks; nblocks--, data += 64) {
        int t;
        for (t = 0; t < 16; t++) w[t] = kvpool_load_be32(data + 4 * t);
        for (t = 16; t < 64; t++) {
            uint32_t s0 = KVPOOL_ROTR32(w[t - 15], 7) ^
                          KVPOOL_ROTR32(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = KVPOOL_ROTR32(w[t - 2], 17) ^
                          KVPOOL_ROTR32(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (t = 0; t < 64; t++) {
            uint32_t S1 = KVPOOL_ROTR32(e, 6) ^ KVPOOL_ROTR32(e, 11) ^
                          KVPOOL_ROTR32(e, 25);
            uint32_t ch = (e & f) ^ (~e & g);
            uint32_t t1 = h + S1 + ch + kvpool_sha256_k[t] + w[t];
            uint32_t S0 = KVPOOL_ROTR32(a, 2) ^ KVPOOL_ROTR32(a, 13) ^
                          KVPOOL_ROTR32(a, 22);
            uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
            uint32_t t2 = S0 + maj;
            h = g; g = f; f = e; e = d + t1;
            d = c; c = b; b = a; a = t1 + t2;
        }
        state[0] += a; state[1] += b; state[2] += c; state[3] += d;
        state[4] += e; state[5] += f; state[6] += g; state[7] += h;
    }
}

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define KVPOOL_HAVE_SHANI 1
#include <cpuid.h>
#include <immintrin.h>

/* The SHA extensions keep the state as two registers, ABEF and CDGH, and run
 * two rounds per sha256rnds2 on (W[t] + K[t]) for t, t+1 in the low lanes.
 * The message schedule is kept four words per register: for group i >= 4,
 * W[i] = msg2(msg1(W[i-4], W[i-3]) + W[i-1..i-2 shifted by one word], W[i-1]). */
__attribute__((target("sha,sse4.1,ssse3")))
static void kvpool_sha256_compress_shani(uint32_t state[8],
                                         const unsigned char *data,
                                         size_t nblocks) {
    const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL,
                                            0x0405060700010203ULL);
    __m128i dcba = _mm_loadu_si128((const __m128i *)&state[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *)&state[4]);
    __m128i badc = _mm_shuffle_epi32(dcba, 0xB1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
    __m128i abef = _mm_alignr_epi8(badc, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, badc, 0xF0);

    for (; nblocks; nblocks--, data += 64) {
        __m128i abef_in = abef, cdgh_in = cdgh;
        __m128i w[4];
        int i;
#if defined(__clang__)
#pragma clang loop unroll(full)
#elif defined(__GNUC__)
#pragma GCC unroll 16
#endif
        for (i = 0; i < 16; i++) {
            __m128i wi;
            if (i < 4) {
                wi = _mm_shuffle_epi8(
                    _mm_loadu_si128((const __m128i *)(data + 16 * i)), byteswap);
            } else {
                __m128i x = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
                x = _mm_add_epi32(x, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
                wi = _mm_sha256msg2_epu32(x, w[(i + 3) & 3]);
            }
            w[i & 3] = wi;
            __m128i wk = _mm_add_epi32(
                wi, _mm_loadu_si128((const __m128i *)&kvpool_sha256_k[4 * i]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
        }
        abef = _mm_add_epi32(abef, abef_in);
        cdgh = _mm_add_epi32(cdgh, cdgh_in);
    }

    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    dcba = _mm_blend_epi16(feba, dchg, 0xF0);
    hgfe = _mm_alignr_epi8(dchg, feba, 8);
    _mm_storeu_si128((__m128i *)&state[0], dcba);
    _mm_storeu_si128((__m128i *)&state[4], hgfe);
}

static int kvpool_cpu_has_shani(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (!(c & (1u << 9)) || !(c & (1u << 19))) return 0; /* SSSE3, SSE4.1 */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1; /* SHA */
}
#else
#define KVPOOL_HAVE_SHANI 0
static int kvpool_cpu_has_shani(void) { return 0; }
#endif

static kvpool_sha256_compress_fn kvpool_sha256_compress =
    kvpool_sha256_compress_portable;

/* backend: 0 = best available, 1 = portable, 2 = SHA-NI (if present).
 * Returns the name of the back-end in use. */
static const char *kvpool_sha256_select(int backend) {
#if KVPOOL_HAVE_SHANI
    if (backend != 1 && kvpool_cpu_has_shani()) {
        kvpool_sha256_compress = kvpool_sha256_compress_shani;
        return "sha-ni";
    }
#endif
    (void)backend;
    kvpool_sha256_compress = kvpool_sha256_compress_portable;
    return "portable";
}

static void kvpool_sha256(const unsigned char *data, size_t len,
                          unsigned char out[32]) {
    uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char tail[128];
    size_t full = len / 64, rest = len % 64, tail_len;
    uint64_t bits = (uint64_t)len * 8;
    int i;

    if (full) kvpool_sha256_compress(state, data, full);
    memcpy(tail, data + full * 64, rest);
    tail[rest] = 0x80;
    tail_len = rest + 9 <= 64 ? 64 : 128;
    memset(tail + rest + 1, 0, tail_len - rest - 1 - 8);
    for (i = 0; i < 8; i++) tail[tail_len - 1 - i] = (unsigned char)(bits >> (8 * i));
    kvpool_sha256_compress(state, tail, tail_len / 64);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(state[i] >> 24);
        out[4 * i + 1] = (unsigned char)(state[i] >> 16);
        out[4 * i + 2] = (unsigned char)(state[i] >> 8);
        out[4 * i + 3] = (unsigned char)state[i];
    }
}

#endif /* KVPOOL_SHA256_H */
