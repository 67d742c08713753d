/* kvpool's request block hasher in C: the exact bytes of
 * pickle.dumps(x, protocol=5) and of cbor2.dumps(x, canonical=True) for the
 * values vLLM hashes (None, bool, int, bytes, str and tuples of them), and
 * the two digests vLLM uses on them (SHA-256, XXH3-128).
 *
 * Every emitter returns KVH_OK, KVH_ERROR (a Python exception is set) or
 * KVH_UNSUPPORTED (no exception): the value has a shape whose bytes this file
 * does not reproduce (a float, an int subclass, an int outside int64, a str
 * with lone surrogates, ...). The caller then hashes that value with vLLM's
 * own serialiser; a different hash is never produced.
 *
 * The pickle emitter follows CPython's C pickler (Modules/_pickle.c) step by
 * step, including what makes its bytes depend on more than the values:
 *   - framing (protocol 4+): opcodes go into FRAME-prefixed chunks; a frame is
 *     closed at the start of saving an object once it holds >= 64 KiB, a frame
 *     under 4 bytes loses its header, and a bytes/str payload >= 64 KiB is
 *     written outside any frame;
 *   - the memo: bytes, str and non-empty tuples get a MEMOIZE after them, and
 *     the same *object* met again is a BINGET of its memo index (vLLM's keys
 *     repeat objects: every ("mm", id, offset) key shares one "mm" constant).
 */
#ifndef KVPOOL_HASHER_IMPL_H
#define KVPOOL_HASHER_IMPL_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_sha256.h"

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "_vendor/xxhash/xxhash.h"

#define KVH_OK 0
#define KVH_ERROR (-1)
#define KVH_UNSUPPORTED 1

/* Algorithms: bit 0 = serialiser (0 pickle, 1 CBOR), bit 1 = digest (0 SHA-256,
 * 1 XXH3-128). The order of vLLM's names: sha256, sha256_cbor, xxhash,
 * xxhash_cbor. */
#define KVH_SER_CBOR 1
#define KVH_DIGEST_XXH3 2

#define KVH_INLINE_CAP 1024
/* Memo indices stay below 256, so a memo reference is always a 2-byte
 * BINGET; a value with more memoised objects is left to pickle itself. */
#define KVH_MEMO_MAX 256
#define KVH_MAX_DEPTH 64

#define KVH_FRAME_HEADER 9
#define KVH_FRAME_MIN 4
#define KVH_FRAME_TARGET (64 * 1024)

typedef struct {
    unsigned char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
    int framing;
    Py_ssize_t frame_start;
    int depth;
    int nmemo;
    PyObject *memo[KVH_MEMO_MAX];
    unsigned char inline_buf[KVH_INLINE_CAP];
} kvh_writer;

static void kvh_writer_init(kvh_writer *w) {
    w->data = w->inline_buf;
    w->len = 0;
    w->cap = KVH_INLINE_CAP;
    w->framing = 0;
    w->frame_start = -1;
    w->depth = 0;
    w->nmemo = 0;
}

static void kvh_writer_reset(kvh_writer *w) {
    w->len = 0;
    w->framing = 0;
    w->frame_start = -1;
    w->depth = 0;
    w->nmemo = 0;
}

static void kvh_writer_free(kvh_writer *w) {
    if (w->data != w->inline_buf) PyMem_Free(w->data);
    w->data = w->inline_buf;
    w->cap = KVH_INLINE_CAP;
}

static int kvh_reserve(kvh_writer *w, Py_ssize_t extra) {
    Py_ssize_t need = w->len + extra;
    if (need <= w->cap) return KVH_OK;
    Py_ssize_t cap = w->cap * 2;
    if (cap < need) cap = need;
    unsigned char *p;
    if (w->data == w->inline_buf) {
        p = (unsigned char *)PyMem_Malloc((size_t)cap);
        if (p) memcpy(p, w->data, (size_t)w->len);
    } else {
        p = (unsigned char *)PyMem_Realloc(w->data, (size_t)cap);
    }
    if (!p) {
        PyErr_NoMemory();
        return KVH_ERROR;
    }
    w->data = p;
    w->cap = cap;
    return KVH_OK;
}

static void kvh_put_le(unsigned char *p, uint64_t v, int n) {
    int i;
    for (i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void kvh_put_be(unsigned char *p, uint64_t v, int n) {
    int i;
    for (i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * (n - 1 - i)));
}

/* ------------------------------------------------------------------ pickle */

/* _Pickler_Write: the first write after a frame was closed opens a new one. */
static int kvh_pwrite(kvh_writer *w, const void *src, Py_ssize_t n) {
    int new_frame = w->framing && w->frame_start == -1;
    if (kvh_reserve(w, n + (new_frame ? KVH_FRAME_HEADER : 0)) < 0) return KVH_ERROR;
    if (new_frame) {
        w->frame_start = w->len;
        w->len += KVH_FRAME_HEADER;
    }
    memcpy(w->data + w->len, src, (size_t)n);
    w->len += n;
    return KVH_OK;
}

static int kvh_pwrite1(kvh_writer *w, unsigned char op) {
    if (w->framing && w->frame_start != -1 && w->len < w->cap) {
        w->data[w->len++] = op;
        return KVH_OK;
    }
    return kvh_pwrite(w, &op, 1);
}

/* _Pickler_CommitFrame */
static void kvh_commit_frame(kvh_writer *w) {
    if (!w->framing || w->frame_start == -1) return;
    Py_ssize_t frame_len = w->len - w->frame_start - KVH_FRAME_HEADER;
    unsigned char *q = w->data + w->frame_start;
    if (frame_len >= KVH_FRAME_MIN) {
        q[0] = 0x95; /* FRAME */
        kvh_put_le(q + 1, (uint64_t)frame_len, 8);
    } else {
        memmove(q, q + KVH_FRAME_HEADER, (size_t)frame_len);
        w->len -= KVH_FRAME_HEADER;
    }
    w->frame_start = -1;
}

/* _Pickler_OpcodeBoundary, run at the start of every save() */
static void kvh_opcode_boundary(kvh_writer *w) {
    if (!w->framing || w->frame_start == -1) return;
    if (w->len - w->frame_start - KVH_FRAME_HEADER >= KVH_FRAME_TARGET)
        kvh_commit_frame(w);
}

/* _Pickler_write_bytes: a large payload goes between frames. */
static int kvh_pwrite_payload(kvh_writer *w, const unsigned char *header,
                              Py_ssize_t header_len, const char *data,
                              Py_ssize_t size) {
    int bypass = size >= KVH_FRAME_TARGET;
    int framing = w->framing;
    if (bypass) {
        kvh_commit_frame(w);
        w->framing = 0;
    }
    if (kvh_pwrite(w, header, header_len) < 0) return KVH_ERROR;
    if (kvh_pwrite(w, data, size) < 0) return KVH_ERROR;
    w->framing = framing;
    return KVH_OK;
}

static int kvh_memo_find(kvh_writer *w, PyObject *obj) {
    int i;
    for (i = 0; i < w->nmemo; i++)
        if (w->memo[i] == obj) return i;
    return -1;
}

/* memo_put; obj NULL memoises a value with no Python object (the token tuple
 * built from a list slice), which nothing can refer to again. */
static int kvh_memo_put(kvh_writer *w, PyObject *obj) {
    if (w->nmemo >= KVH_MEMO_MAX) return KVH_UNSUPPORTED;
    w->memo[w->nmemo++] = obj;
    return kvh_pwrite1(w, 0x94); /* MEMOIZE */
}

/* save_long for a value that fits a long long (the opcodes pickle picks). */
static int kvh_pickle_int_value(kvh_writer *w, long long v) {
    unsigned char b[11];
    if (v >= -2147483647LL - 1 && v <= 2147483647LL) {
        uint32_t u = (uint32_t)(int32_t)v;
        kvh_put_le(b + 1, u, 4);
        if (b[3] || b[4]) {
            b[0] = 'J'; /* BININT */
            return kvh_pwrite(w, b, 5);
        }
        if (b[2]) {
            b[0] = 'M'; /* BININT2 */
            return kvh_pwrite(w, b, 3);
        }
        b[0] = 'K'; /* BININT1 */
        return kvh_pwrite(w, b, 2);
    }
    /* LONG1: little-endian two's complement, one byte more than the bits of
     * |v| need, less one if that byte is only a redundant sign (save_long). */
    uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    int nbits = 64 - __builtin_clzll(mag);
    int nbytes = (nbits >> 3) + 1;
    kvh_put_le(b + 2, (uint64_t)v, 8);
    b[10] = v < 0 ? 0xff : 0x00; /* the ninth byte, sign-extended */
    if (v < 0 && nbytes > 1 && b[2 + nbytes - 1] == 0xff &&
        (b[2 + nbytes - 2] & 0x80))
        nbytes--;
    b[0] = 0x8a; /* LONG1 */
    b[1] = (unsigned char)nbytes;
    return kvh_pwrite(w, b, 2 + nbytes);
}

static int kvh_pickle_long(kvh_writer *w, PyObject *obj) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow) return KVH_UNSUPPORTED;
    if (v == -1 && PyErr_Occurred()) return KVH_ERROR;
    return kvh_pickle_int_value(w, v);
}

static int kvh_pickle_sized(kvh_writer *w, unsigned char op1, unsigned char op4,
                            unsigned char op8, const char *data, Py_ssize_t size) {
    unsigned char h[9];
    Py_ssize_t hl;
    if (size <= 0xff) {
        h[0] = op1;
        h[1] = (unsigned char)size;
        hl = 2;
    } else if ((uint64_t)size <= 0xffffffffULL) {
        h[0] = op4;
        kvh_put_le(h + 1, (uint64_t)size, 4);
        hl = 5;
    } else {
        h[0] = op8;
        kvh_put_le(h + 1, (uint64_t)size, 8);
        hl = 9;
    }
    return kvh_pwrite_payload(w, h, hl, data, size);
}

static int kvh_pickle_save(kvh_writer *w, PyObject *obj);

/* The value of an exact int that CPython stores in a single digit (|v| <
 * 2**30: every token id), read without a call; 0 for any other int. */
static inline int kvh_compact_int(PyObject *obj, long long *v) {
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)obj)) return 0;
    *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)obj);
    return 1;
#else
    Py_ssize_t size = Py_SIZE(obj);
    if (size < -1 || size > 1) return 0;
    *v = size * (long long)((PyLongObject *)obj)->ob_digit[0];
    return 1;
#endif
}

/* The common case of a tuple element, token ids: an exact int that fits a
 * BININT* opcode, written in place while the current frame is open, below
 * its 64 KiB boundary, and the buffer has room (the caller reserved it).
 * Returns 0 when it wrote nothing: the item then takes kvh_pickle_save. */
static inline int kvh_pickle_in_place(kvh_writer *w) {
    return w->frame_start != -1 && w->framing && w->cap - w->len >= 5 &&
           w->len - w->frame_start - KVH_FRAME_HEADER < KVH_FRAME_TARGET;
}

/* BININT1 / BININT2 / BININT of v (|v| < 2**31), written in place: the
 * caller checked kvh_pickle_in_place. */
static inline void kvh_pickle_int32_in_place(kvh_writer *w, int32_t v) {
    uint32_t u = (uint32_t)v;
    unsigned char *p = w->data + w->len;
    if (u <= 0xff) {
        p[0] = 'K';
        p[1] = (unsigned char)u;
        w->len += 2;
    } else if (u <= 0xffff) {
        p[0] = 'M';
        p[1] = (unsigned char)u;
        p[2] = (unsigned char)(u >> 8);
        w->len += 3;
    } else {
        p[0] = 'J';
        kvh_put_le(p + 1, u, 4);
        w->len += 5;
    }
}

static int kvh_pickle_small_int(kvh_writer *w, PyObject *obj) {
    long long v;
    if (!PyLong_CheckExact(obj) || !kvh_pickle_in_place(w) || !kvh_compact_int(obj, &v))
        return 0;
    kvh_pickle_int32_in_place(w, (int32_t)v);
    return 1;
}

/* The items of a tuple: n objects, or (items NULL) n int32 values, as
 * pickle saves a tuple of those ints. */
static int kvh_pickle_items(kvh_writer *w, PyObject *const *items, Py_ssize_t n,
                            PyObject *self, const int32_t *values) {
    Py_ssize_t i;
    int r;
    if (n == 0) return kvh_pwrite1(w, ')'); /* EMPTY_TUPLE, not memoised */
    if (n > 3 && (r = kvh_pwrite1(w, '(')) != KVH_OK) return r; /* MARK */
    if (n <= 1 << 20 && kvh_reserve(w, 5 * n + 16) < 0) return KVH_ERROR;
    for (i = 0; i < n; i++) {
        if (items == NULL) {
            if (kvh_pickle_in_place(w)) {
                kvh_pickle_int32_in_place(w, values[i]);
                continue;
            }
            kvh_opcode_boundary(w); /* save(int) */
            if ((r = kvh_pickle_int_value(w, values[i])) != KVH_OK) return r;
            continue;
        }
        if (kvh_pickle_small_int(w, items[i])) continue;
        if ((r = kvh_pickle_save(w, items[i])) != KVH_OK) return r;
    }
    /* TUPLE1..3 or TUPLE */
    if ((r = kvh_pwrite1(w, n <= 3 ? (unsigned char)(0x85 + n - 1) : 't')) != KVH_OK)
        return r;
    return kvh_memo_put(w, self);
}

static int kvh_pickle_save(kvh_writer *w, PyObject *obj) {
    PyTypeObject *type = Py_TYPE(obj);
    int r, idx;
    kvh_opcode_boundary(w);
    if (obj == Py_None) return kvh_pwrite1(w, 'N');
    if (obj == Py_True) return kvh_pwrite1(w, 0x88);  /* NEWTRUE */
    if (obj == Py_False) return kvh_pwrite1(w, 0x89); /* NEWFALSE */
    if (type == &PyLong_Type) return kvh_pickle_long(w, obj);
    if (type != &PyBytes_Type && type != &PyUnicode_Type && type != &PyTuple_Type)
        return KVH_UNSUPPORTED;
    if ((idx = kvh_memo_find(w, obj)) >= 0) {
        unsigned char b[2] = {'h', (unsigned char)idx}; /* BINGET */
        return kvh_pwrite(w, b, 2);
    }
    if (type == &PyBytes_Type) {
        r = kvh_pickle_sized(w, 'C', 'B', 0x8e, PyBytes_AS_STRING(obj),
                             PyBytes_GET_SIZE(obj));
        return r != KVH_OK ? r : kvh_memo_put(w, obj);
    }
    if (type == &PyUnicode_Type) {
        Py_ssize_t size;
        const char *s = PyUnicode_AsUTF8AndSize(obj, &size);
        if (!s) {
            /* lone surrogates: pickle retries with "surrogatepass" */
            PyErr_Clear();
            return KVH_UNSUPPORTED;
        }
        r = kvh_pickle_sized(w, 0x8c, 'X', 0x8d, s, size);
        return r != KVH_OK ? r : kvh_memo_put(w, obj);
    }
    if (++w->depth > KVH_MAX_DEPTH) return KVH_UNSUPPORTED;
    r = kvh_pickle_items(w, &PyTuple_GET_ITEM(obj, 0), PyTuple_GET_SIZE(obj), obj, NULL);
    w->depth--;
    return r;
}

static int kvh_pickle_begin(kvh_writer *w) {
    static const unsigned char proto[2] = {0x80, 5};
    kvh_writer_reset(w);
    if (kvh_pwrite(w, proto, 2) < 0) return KVH_ERROR;
    w->framing = 1;
    return KVH_OK;
}

static int kvh_pickle_end(kvh_writer *w) {
    if (kvh_pwrite1(w, '.') < 0) return KVH_ERROR; /* STOP */
    kvh_commit_frame(w);
    w->framing = 0;
    return KVH_OK;
}

/* -------------------------------------------------------------------- CBOR */

static int kvh_cbor_head(kvh_writer *w, unsigned char major, uint64_t n) {
    unsigned char b[9];
    int len;
    major <<= 5;
    if (n < 24) {
        b[0] = major | (unsigned char)n;
        len = 1;
    } else if (n <= 0xff) {
        b[0] = major | 24;
        b[1] = (unsigned char)n;
        len = 2;
    } else if (n <= 0xffff) {
        b[0] = major | 25;
        kvh_put_be(b + 1, n, 2);
        len = 3;
    } else if (n <= 0xffffffffULL) {
        b[0] = major | 26;
        kvh_put_be(b + 1, n, 4);
        len = 5;
    } else {
        b[0] = major | 27;
        kvh_put_be(b + 1, n, 8);
        len = 9;
    }
    if (kvh_reserve(w, len) < 0) return KVH_ERROR;
    memcpy(w->data + w->len, b, (size_t)len);
    w->len += len;
    return KVH_OK;
}

static int kvh_cbor_raw(kvh_writer *w, const char *data, Py_ssize_t n) {
    if (kvh_reserve(w, n) < 0) return KVH_ERROR;
    memcpy(w->data + w->len, data, (size_t)n);
    w->len += n;
    return KVH_OK;
}

static int kvh_cbor_save(kvh_writer *w, PyObject *obj);

/* A non-negative int below 2**32, written in place (the caller made room
 * for 5 bytes). */
static inline void kvh_cbor_uint32_in_place(kvh_writer *w, uint32_t v) {
    unsigned char *p = w->data + w->len;
    if (v < 24) {
        p[0] = (unsigned char)v;
        w->len += 1;
    } else if (v <= 0xff) {
        p[0] = 24;
        p[1] = (unsigned char)v;
        w->len += 2;
    } else if (v <= 0xffff) {
        p[0] = 25;
        kvh_put_be(p + 1, (uint64_t)v, 2);
        w->len += 3;
    } else {
        p[0] = 26;
        kvh_put_be(p + 1, (uint64_t)v, 4);
        w->len += 5;
    }
}

/* An int that fits a long long, as cbor2 writes it. */
static int kvh_cbor_int_value(kvh_writer *w, long long v) {
    if (v >= 0) return kvh_cbor_head(w, 0, (uint64_t)v);
    return kvh_cbor_head(w, 1, (uint64_t)(-(v + 1)));
}

/* An array of n objects, or (items NULL) of n int32 values. */
static int kvh_cbor_items(kvh_writer *w, PyObject *const *items, Py_ssize_t n,
                          const int32_t *values) {
    Py_ssize_t i;
    int r;
    long long v;
    if ((r = kvh_cbor_head(w, 4, (uint64_t)n)) != KVH_OK) return r;
    if (n <= 1 << 20 && kvh_reserve(w, 5 * n) < 0) return KVH_ERROR;
    for (i = 0; i < n; i++) {
        if (items == NULL) {
            v = values[i];
            if (v >= 0 && w->cap - w->len >= 5) {
                kvh_cbor_uint32_in_place(w, (uint32_t)v);
                continue;
            }
            if ((r = kvh_cbor_int_value(w, v)) != KVH_OK) return r;
            continue;
        }
        /* fast path: a non-negative int below 2**30 with room reserved */
        if (PyLong_CheckExact(items[i]) && w->cap - w->len >= 5 &&
            kvh_compact_int(items[i], &v) && v >= 0) {
            kvh_cbor_uint32_in_place(w, (uint32_t)v);
            continue;
        }
        if ((r = kvh_cbor_save(w, items[i])) != KVH_OK) return r;
    }
    return KVH_OK;
}

static int kvh_cbor_save(kvh_writer *w, PyObject *obj) {
    PyTypeObject *type = Py_TYPE(obj);
    int r;
    if (obj == Py_None) return kvh_cbor_head(w, 7, 22);
    if (obj == Py_True) return kvh_cbor_head(w, 7, 21);
    if (obj == Py_False) return kvh_cbor_head(w, 7, 20);
    if (type == &PyLong_Type) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow) return KVH_UNSUPPORTED; /* cbor2 may use a bignum tag */
        if (v == -1 && PyErr_Occurred()) return KVH_ERROR;
        return kvh_cbor_int_value(w, v);
    }
    if (type == &PyBytes_Type) {
        Py_ssize_t n = PyBytes_GET_SIZE(obj);
        if ((r = kvh_cbor_head(w, 2, (uint64_t)n)) != KVH_OK) return r;
        return kvh_cbor_raw(w, PyBytes_AS_STRING(obj), n);
    }
    if (type == &PyUnicode_Type) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(obj, &n);
        if (!s) {
            PyErr_Clear();
            return KVH_UNSUPPORTED; /* cbor2 raises; let it */
        }
        if ((r = kvh_cbor_head(w, 3, (uint64_t)n)) != KVH_OK) return r;
        return kvh_cbor_raw(w, s, n);
    }
    if (type == &PyTuple_Type) {
        if (++w->depth > KVH_MAX_DEPTH) return KVH_UNSUPPORTED;
        r = kvh_cbor_items(w, &PyTuple_GET_ITEM(obj, 0), PyTuple_GET_SIZE(obj), NULL);
        w->depth--;
        return r;
    }
    return KVH_UNSUPPORTED;
}

/* ------------------------------------------------------------------ entry */

/* The bytes vLLM's serialiser would give for obj. */
static int kvh_serialize(kvh_writer *w, int algo, PyObject *obj) {
    int r;
    if (algo & KVH_SER_CBOR) {
        kvh_writer_reset(w);
        return kvh_cbor_save(w, obj);
    }
    if ((r = kvh_pickle_begin(w)) != KVH_OK) return r;
    if ((r = kvh_pickle_save(w, obj)) != KVH_OK) return r;
    return kvh_pickle_end(w);
}

/* The bytes of the block tuple (parent, tuple(tokens), extra) without
 * building it: tokens are n items of a list, or (tokens NULL) n int32
 * values of a buffer (vLLM 0.34's TokenBuffer). */
static int kvh_serialize_block(kvh_writer *w, int algo, PyObject *parent,
                               PyObject *const *tokens, Py_ssize_t n,
                               PyObject *extra, const int32_t *values) {
    int r;
    if (algo & KVH_SER_CBOR) {
        kvh_writer_reset(w);
        if ((r = kvh_cbor_head(w, 4, 3)) != KVH_OK) return r;
        if ((r = kvh_cbor_save(w, parent)) != KVH_OK) return r;
        w->depth = 1;
        if ((r = kvh_cbor_items(w, tokens, n, values)) != KVH_OK) return r;
        w->depth = 0;
        return kvh_cbor_save(w, extra);
    }
    if ((r = kvh_pickle_begin(w)) != KVH_OK) return r;
    kvh_opcode_boundary(w); /* save(outer tuple) */
    if ((r = kvh_pickle_save(w, parent)) != KVH_OK) return r;
    kvh_opcode_boundary(w); /* save(token tuple) */
    w->depth = 1;
    if ((r = kvh_pickle_items(w, tokens, n, NULL, values)) != KVH_OK) return r;
    w->depth = 0;
    if ((r = kvh_pickle_save(w, extra)) != KVH_OK) return r;
    if ((r = kvh_pwrite1(w, 0x87)) != KVH_OK) return r; /* TUPLE3 */
    if ((r = kvh_memo_put(w, NULL)) != KVH_OK) return r;
    return kvh_pickle_end(w);
}

static Py_ssize_t kvh_digest_size(int algo) {
    return (algo & KVH_DIGEST_XXH3) ? 16 : 32;
}

static void kvh_digest(int algo, const unsigned char *data, Py_ssize_t len,
                       unsigned char *out) {
    if (algo & KVH_DIGEST_XXH3) {
        XXH128_hash_t h = XXH3_128bits(data, (size_t)len);
        XXH128_canonicalFromHash((XXH128_canonical_t *)out, h);
    } else {
        kvpool_sha256(data, (size_t)len, out);
    }
}

#endif /* KVPOOL_HASHER_IMPL_H */
