# cython: language_level=3
"""The compiled request block hasher: vLLM's block hashes, computed in C.

vLLM hashes every full block of a request as
``hash_fn((parent_hash, tuple(block_token_ids), extra_keys))``, where
``hash_fn`` is SHA-256 or XXH3-128 over the pickle (protocol 5) or canonical
CBOR bytes of that tuple. This module writes those bytes in C, straight from
the token list (no tuple is built), digests them, and chains the blocks, one
call per request. The serialisers are in ``_hasher_impl.h``; SHA-256 is
``_sha256.h`` (SHA-NI when the CPU has it), XXH3 the vendored ``xxhash.h``.

A value the C serialiser does not reproduce byte for byte (see
``_hasher_impl.h``) is hashed by the caller's ``fallback`` -- inside vLLM,
vLLM's own hash function -- so a hash is never different from vLLM's, at
worst as slow. Before the first use of a serialiser, a self-check compares
it with ``pickle.dumps`` (and ``cbor2.dumps``, when importable) on sample
values; a mismatch (an interpreter whose pickler differs) turns that
serialiser off for the process, with a warning.
"""

from cpython.buffer cimport PyBUF_FORMAT, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.list cimport PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF

import pickle
import warnings

cdef extern from "Python.h":
    PyObject **PySequence_Fast_ITEMS(object)

cdef extern from "_hasher_impl.h":
    int KVH_OK
    int KVH_ERROR
    int KVH_UNSUPPORTED
    int KVH_SER_CBOR
    ctypedef struct kvh_writer:
        unsigned char *data
        Py_ssize_t len
    void kvh_writer_init(kvh_writer *w)
    void kvh_writer_free(kvh_writer *w)
    int kvh_serialize(kvh_writer *w, int algo, object obj) except -1
    int kvh_serialize_block(kvh_writer *w, int algo, object parent,
                            PyObject **tokens, Py_ssize_t n,
                            object extra, const int *values) except -1
    Py_ssize_t kvh_digest_size(int algo)
    void kvh_digest(int algo, const unsigned char *data, Py_ssize_t length,
                    unsigned char *out)
    const char *kvpool_sha256_select(int backend)

#: vLLM's names for its prefix-caching hash algorithms, in code order:
#: bit 0 of a code is the serialiser (pickle, CBOR), bit 1 the digest
#: (SHA-256, XXH3-128).
ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
ALGORITHM_CODES = {name: code for code, name in enumerate(ALGORITHMS)}

#: The SHA-256 compression function in use: "sha-ni" or "portable".
SHA256_BACKEND = kvpool_sha256_select(0).decode()

# Per serialiser (0 pickle, 1 CBOR): 0 not yet checked, 1 in use, -1 off.
cdef int _serializer_state[2]
_serializer_state[0] = 0
_serializer_state[1] = 0


def select_sha256_backend(str name) -> str:
    """Switch the SHA-256 back-end (``"best"``, ``"portable"`` or
    ``"sha-ni"``, which means best when the CPU lacks SHA-NI); returns the
    one now in use. For tests and benchmarks."""
    global SHA256_BACKEND
    code = {"best": 0, "portable": 1, "sha-ni": 2}[name]
    SHA256_BACKEND = kvpool_sha256_select(code).decode()
    return SHA256_BACKEND


cdef inline int _code(object algorithm) except -1:
    if type(algorithm) is int:
        if 0 <= <int>algorithm < 4:
            return <int>algorithm
    else:
        code = ALGORITHM_CODES.get(algorithm)
        if code is not None:
            return code
    raise ValueError(f"unknown hash algorithm {algorithm!r}; expected one of {ALGORITHMS}")


# Values whose bytes the self-check compares: every opcode the C serialisers
# write, the memo (a repeated object), and framing around a payload of 64 KiB.
def _self_check_samples():
    mm = "mm"
    big = b"\x07" * (64 * 1024)
    return [
        (b"\x00" * 32, tuple(range(-3, 300, 7)), None),
        (b"p" * 16, (0, 255, 256, 65535, 65536, 2**31 - 1, -2**31, 2**31, -2**31 - 1,
                     2**63 - 1, -2**63, 2**40, -2**40), (("lora", "a", "b"),)),
        (b"", (1, 2), ((mm, "x" * 300, 0), (mm, "\u00e9\u4e2d", 5), True, False)),
        ("vllm-none-hash"),
        (b"h" * 32, (5,) * 16, ((big, "s"), big)),
        ((), (1,), (2, 3), (4, 5, 6), "z" * 70000, None),
    ]


def _serializer_states():
    """(pickle, CBOR) serialiser states: 0 not yet checked, 1 in use, -1 off."""
    return (_serializer_state[0], _serializer_state[1])


def _set_serializer_states(int pickle_state, int cbor_state):
    """For tests: force the states ``_serializer_states`` reports."""
    _serializer_state[0] = pickle_state
    _serializer_state[1] = cbor_state


def _pickle_reference(obj):
    return pickle.dumps(obj, protocol=5)


def _cbor_reference(obj):
    import cbor2

    return cbor2.dumps(obj, canonical=True)


cdef int _serializer_ready(int ser) except -1:
    """1 if serialiser ``ser`` (0 pickle, 1 CBOR) may be used."""
    cdef int state = _serializer_state[ser]
    if state != 0:
        return state == 1
    if ser == 0:
        reference = _pickle_reference
    else:
        try:
            import cbor2
        except ImportError:
            # Nothing to compare with; the test suite checks it instead.
            _serializer_state[ser] = 1
            return 1
        reference = _cbor_reference
    ok = all(_serialize(x, ser) == reference(x) for x in _self_check_samples())
    _serializer_state[ser] = 1 if ok else -1
    if not ok:
        warnings.warn(
            f"kvpool._hasher: the C {('pickle', 'CBOR')[ser]} serialiser does not "
            f"match this interpreter's; block hashes use the Python serialiser",
            RuntimeWarning,
            stacklevel=2,
        )
    return ok


cdef object _serialize(object obj, int algo):
    cdef kvh_writer w
    kvh_writer_init(&w)
    try:
        if kvh_serialize(&w, algo, obj) != KVH_OK:
            return None
        return PyBytes_FromStringAndSize(<char *>w.data, w.len)
    finally:
        kvh_writer_free(&w)


def serialize(obj, algorithm="sha256"):
    """The bytes ``algorithm``'s serialiser gives for ``obj``
    (``pickle.dumps(obj, protocol=5)`` or ``cbor2.dumps(obj, canonical=True)``),
    computed in C; ``None`` if ``obj`` has a shape the C serialiser does not
    reproduce. Not switched off by the self-check (it is what the check
    tests)."""
    return _serialize(obj, _code(algorithm))


def digest(data, algorithm="sha256") -> bytes:
    """``algorithm``'s digest of ``data`` (bytes-like): SHA-256 (32 bytes) or
    XXH3-128 (16 bytes, canonical big-endian, as ``xxhash.xxh3_128_digest``)."""
    cdef int algo = _code(algorithm)
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef const unsigned char *p = <const unsigned char *>b""
    if view.shape[0]:
        p = &view[0]
    out = PyBytes_FromStringAndSize(NULL, kvh_digest_size(algo))
    kvh_digest(algo, p, view.shape[0], <unsigned char *>PyBytes_AS_STRING(out))
    return out


def hash_object(obj, algorithm, fallback):
    """vLLM's ``hash_fn(obj)`` for ``algorithm``; ``fallback(obj)`` computes
    it when the C serialiser cannot."""
    cdef int algo = _code(algorithm)
    cdef kvh_writer w
    if not _serializer_ready(algo & KVH_SER_CBOR):
        return fallback(obj)
    kvh_writer_init(&w)
    try:
        if kvh_serialize(&w, algo, obj) != KVH_OK:
            return fallback(obj)
        out = PyBytes_FromStringAndSize(NULL, kvh_digest_size(algo))
        kvh_digest(algo, w.data, w.len, <unsigned char *>PyBytes_AS_STRING(out))
        return out
    finally:
        kvh_writer_free(&w)


def hash_blocks(algorithm, object parent, list token_ids not None, Py_ssize_t block_size,
                Py_ssize_t num_blocks, list extra_keys, fallback, Py_ssize_t start=0):
    """The chained hashes of ``num_blocks`` blocks of ``block_size`` tokens
    of ``token_ids`` from index ``start``: block ``i`` is
    ``hash_fn((prev, tuple(block_i_tokens), extra_keys[i]))`` with ``prev``
    the previous block's hash, ``parent`` for the first (the caller resolves
    vLLM's ``None -> NONE_HASH``). ``extra_keys`` is ``None`` (no extra keys)
    or a list with one entry (a tuple or ``None``) per block. A block the C
    serialiser cannot reproduce is hashed by ``fallback(tuple)``, whose
    result continues the chain."""
    return _hash_blocks(_code(algorithm), parent, token_ids, NULL, PyList_GET_SIZE(token_ids),
                        start, block_size, num_blocks, extra_keys, fallback)


cdef list _hash_blocks(int algo, object parent, object token_ids, const int *values,
                       Py_ssize_t num_tokens, Py_ssize_t start, Py_ssize_t block_size,
                       Py_ssize_t num_blocks, list extra_keys, object fallback):
    # The tokens: ``token_ids``, a list, or (``values`` not NULL) the
    # ``num_tokens`` C ints of ``token_ids``' buffer, which the caller holds.
    cdef Py_ssize_t i, first, dsize = kvh_digest_size(algo)
    cdef int r, use_c
    cdef PyObject **items
    cdef kvh_writer w
    cdef object extra = None
    cdef object out
    if block_size < 1 or num_blocks < 0 or start < 0:
        raise ValueError("block_size must be >= 1, num_blocks and start >= 0")
    if num_tokens - start < num_blocks * block_size:
        raise ValueError(
            f"token_ids holds {num_tokens - start} tokens from "
            f"{start}, fewer than {num_blocks} blocks of {block_size}"
        )
    if extra_keys is not None and PyList_GET_SIZE(extra_keys) < num_blocks:
        raise ValueError("extra_keys must have one entry per block")
    use_c = _serializer_ready(algo & KVH_SER_CBOR)
    result = PyList_New(num_blocks)
    kvh_writer_init(&w)
    try:
        for i in range(num_blocks):
            if extra_keys is not None:
                extra = extra_keys[i]
            first = start + i * block_size
            r = KVH_UNSUPPORTED
            if use_c and values != NULL:
                r = kvh_serialize_block(&w, algo, parent, NULL, block_size, extra,
                                        values + first)
            elif use_c:
                # Fetched per block: a fallback runs Python code.
                items = PySequence_Fast_ITEMS(token_ids)
                r = kvh_serialize_block(&w, algo, parent, items + first, block_size, extra,
                                        NULL)
            if r == KVH_OK:
                out = PyBytes_FromStringAndSize(NULL, dsize)
                kvh_digest(algo, w.data, w.len,
                           <unsigned char *>PyBytes_AS_STRING(out))
            else:
                out = fallback((parent, tuple(token_ids[first:first + block_size]), extra))
            Py_INCREF(out)
            PyList_SET_ITEM(result, i, out)
            parent = out
    finally:
        kvh_writer_free(&w)
    return result


cdef class RequestBlockHasher:
    """vLLM's ``request_block_hasher(request)`` (what its
    ``get_request_block_hasher`` returns), for one of vLLM's four hash
    functions: the hashes of the request's new full blocks, computed in one
    call. Built by ``kvpool.vllm.hasher``; reads of a request only what
    vLLM's hasher reads.

    ``none_hash_holder.NONE_HASH`` is read at call time (vLLM's
    ``kv_cache_utils`` module). ``extra_keys(request, start, num_blocks)`` is
    called only for a request that has extra inputs (LoRA, cache salt,
    multimodal, prompt embeds) or with lookahead; it returns one extra-key
    entry per new block, or ``None`` to hand the request to
    ``vllm_hasher(request)``. A ``token_list_type`` object (vLLM's read-only
    ``ConstantList``) is read through what it wraps, without a copy: a list,
    or a ``token_buffer_type`` object (vLLM 0.34's ``TokenBuffer``, an
    ``array('i')``), whose C ints are serialised straight from its buffer.
    """

    cdef readonly int algorithm
    cdef readonly Py_ssize_t block_size
    cdef readonly Py_ssize_t lookahead
    cdef object none_hash_holder
    cdef object token_list_type
    cdef object extra_keys
    cdef object fallback
    cdef object vllm_hasher
    cdef object token_buffer_type

    def __init__(self, algorithm, Py_ssize_t block_size, Py_ssize_t lookahead,
                 none_hash_holder, token_list_type, extra_keys, fallback, vllm_hasher,
                 token_buffer_type=None):
        if block_size < 1 or lookahead < 0:
            raise ValueError("block_size must be >= 1 and lookahead >= 0")
        self.algorithm = _code(algorithm)
        self.block_size = block_size
        self.lookahead = lookahead
        self.none_hash_holder = none_hash_holder
        self.token_list_type = token_list_type
        self.extra_keys = extra_keys
        self.fallback = fallback
        self.vllm_hasher = vllm_hasher
        self.token_buffer_type = token_buffer_type

    @property
    def kvpool(self):
        """Marks kvpool's hasher (vLLM's is a plain function)."""
        return True

    def __call__(self, request):
        cdef Py_ssize_t start, num_tokens, num_blocks
        cdef Py_ssize_t block_size = self.block_size
        cdef Py_ssize_t num_hashed
        cdef list extra = None
        cdef Py_buffer view
        cdef bint buffered
        block_hashes = request.block_hashes
        num_hashed = len(block_hashes)
        start = num_hashed * block_size
        # Most calls (decode steps) end here, so the token count is read the
        # cheapest way: vLLM's num_tokens is len(_all_token_ids), the list
        # all_token_ids wraps.
        tokens = request.all_token_ids
        if type(tokens) is self.token_list_type:
            tokens = tokens._x
        buffered = type(tokens) is self.token_buffer_type and tokens is not None
        if type(tokens) is list:
            num_tokens = PyList_GET_SIZE(tokens) - self.lookahead
        elif buffered:
            num_tokens = len(tokens) - self.lookahead
        else:
            num_tokens = request.num_tokens - self.lookahead
        if start + block_size > num_tokens:
            return []
        num_blocks = (num_tokens - start) // block_size
        # (wraparound is off in this module: no negative index)
        parent = block_hashes[num_hashed - 1] if num_hashed else None
        if not parent:
            parent = self.none_hash_holder.NONE_HASH
        if (
            self.lookahead
            or request.lora_request
            or request.cache_salt
            or request.mm_features
            or request.prompt_embeds is not None
        ):
            keys = self.extra_keys(request, start, num_blocks)
            if keys is None:
                return self.vllm_hasher(request)
            extra = keys
        if buffered:
            # Held while hashing: the buffer cannot be resized under us.
            PyObject_GetBuffer(tokens, &view, PyBUF_FORMAT)
            try:
                if view.itemsize == sizeof(int) and view.format != NULL and (
                        view.format[0] == b"i" and view.format[1] == 0):
                    return _hash_blocks(self.algorithm, parent, tokens, <const int *>view.buf,
                                        view.len // sizeof(int), start, block_size,
                                        num_blocks, extra, self.fallback)
            finally:
                PyBuffer_Release(&view)
        if type(tokens) is not list:
            tokens = list(tokens[start:start + num_blocks * block_size])
            start = 0
        return _hash_blocks(self.algorithm, parent, tokens, NULL, PyList_GET_SIZE(tokens),
                            start, block_size, num_blocks, extra, self.fallback)
