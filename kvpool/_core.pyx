# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled core of kvpool: the free queue, reference counts, hash keys and
the prefix-cache map of a block pool.

Why this shape:

* Per-block state lives in C arrays of a ``_Store`` indexed by block id:
  the free list's prev/next indices (head and tail sentinels at ``n`` and
  ``n+1``, ``-1`` meaning "not in the list"), reference counts, flags and the
  hash key. Bulk operations walk these arrays in C and touch no Python object
  per block beyond filling the result list.
* A ``KVCacheBlock`` is a 32-byte handle (store pointer, index, id). A pool's
  handles are created lazily, the first time a block is handed out, and then
  kept by the store, so ``pool.blocks[i]`` is always the same object and a
  million-block pool costs ~30 bytes per block until its blocks are used.
* No reference cycles: the store owns its handles, a handle only *borrows*
  its store. No class here needs the cycle collector (``no_gc``), so a pool of
  any size adds nothing to ``gc.collect()``. When a store dies, every handle
  still referenced elsewhere is moved to a one-block store of its own with its
  last state, so a block that outlives its pool stays safe to use.
* Every public entry point validates all of its input before it mutates
  anything: a call that raises has changed nothing (no ``assert``).
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_DelItem, PyDict_GetItem, PyDict_Next, PyDict_SetItem, PyDict_Size
from cpython.list cimport PyList_Append, PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromUnsignedLong, PyLong_FromUnsignedLongLong
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.sequence cimport PySequence_Fast, PySequence_Fast_GET_ITEM, PySequence_Fast_GET_SIZE, PySequence_Fast_ITEMS
from libc.stdint cimport INT32_MAX, INT64_MIN, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

cdef extern from "Python.h":
    Py_ssize_t Py_REFCNT(object o)
    const Py_ssize_t PY_SSIZE_T_MAX
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1
    # Borrowed-pointer forms of bytes/dict macros, for loops that must not
    # touch reference counts.
    const char *_bytes_str "PyBytes_AS_STRING"(PyObject *o)
    Py_ssize_t _bytes_size "PyBytes_GET_SIZE"(PyObject *o)
    bint _is_bytes "PyBytes_Check"(PyObject *o)
    bint _is_dict_exact "PyDict_CheckExact"(PyObject *o)
    void PyObject_GC_UnTrack(PyObject *o)
    void Py_SET_SIZE(object o, Py_ssize_t size)
    bint PyList_CheckExact(object o)
    bint PyTuple_CheckExact(object o)
    object PyObject_Vectorcall(object callable, PyObject **args, size_t nargsf, object kwnames)

cdef enum:
    _NULL = 1       # the pool's null block
    _ADOPTED = 2    # a stand-alone block this store adopted (its `pool` stays None)

# Rule _kvpool_free_caching_off (see PoolCore): the codes of
# kvpool._rules.FREE_CACHING_OFF, which checks the names for both cores.
cdef enum:
    _FREE_OFF_FRONT = 0
    _FREE_OFF_BY_HASH = 1
    _FREE_OFF_BACK = 2

from kvpool._rules import free_caching_off_rule as _free_caching_off_rule

# The keywords of a BlockRemoved event (PoolCore._removed_events).
cdef tuple _REMOVED_KW = ("block_hashes", "medium")
cdef tuple _REMOVED_GROUP_KW = ("block_hashes", "medium", "group_idx")

DEF GROUP_ID_BYTES = 4
# ``block_hash_num_tokens`` of a block without one (vLLM's None).
cdef int64_t NTOK_NONE = INT64_MIN
# Lowest ref_cnt of a null block whose count is kept (_kvpool_counts_null):
# each free takes one, so it may go negative, but never overflow.
cdef int32_t NULL_REF_CNT_MIN = -INT32_MAX
# Largest pool: indices, sentinels included, must fit an int32.
cdef Py_ssize_t MAX_BLOCKS = INT32_MAX - 2


@cython.final
@cython.no_gc
cdef class _Store:
    """C arrays holding the state of ``n`` blocks plus two sentinels."""

    def __cinit__(self, Py_ssize_t n, bint private=False, bint v33=False):
        cdef Py_ssize_t size = n + 2, i
        self.n = 0  # until the arrays exist: __dealloc__ walks n + 2 slots
        if not (0 <= n <= MAX_BLOCKS):
            raise ValueError(f"a store holds 0..{MAX_BLOCKS} blocks, not {n}")
        self.private = private
        self.v33 = v33
        if v33:
            # Only the 0.33 line pays for the token counts.
            self.ntok = <int64_t *> PyMem_Malloc(size * sizeof(int64_t))
            if self.ntok == NULL:
                raise MemoryError(f"cannot allocate the state of {n} blocks")
            for i in range(size):
                self.ntok[i] = NTOK_NONE
        self.prev = <int32_t *> PyMem_Malloc(size * sizeof(int32_t))
        self.next = <int32_t *> PyMem_Malloc(size * sizeof(int32_t))
        self.ref_cnt = <int32_t *> PyMem_Calloc(size, sizeof(int32_t))
        self.flags = <uint8_t *> PyMem_Calloc(size, sizeof(uint8_t))
        self.stamp = <uint32_t *> PyMem_Calloc(size, sizeof(uint32_t))
        self.hash = <PyObject **> PyMem_Calloc(size, sizeof(PyObject *))
        self.objs = <PyObject **> PyMem_Calloc(size, sizeof(PyObject *))
        if (self.prev == NULL or self.next == NULL or self.ref_cnt == NULL
                or self.flags == NULL or self.stamp == NULL or self.hash == NULL
                or self.objs == NULL):
            raise MemoryError(f"cannot allocate the state of {n} blocks")
        self.n = n
        self.cap = size
        for i in range(size):
            self.prev[i] = -1
            self.next[i] = -1
        # An empty list: the head's next is the tail and back.
        self.next[n] = <int32_t> (n + 1)
        self.prev[n + 1] = <int32_t> n

    def __dealloc__(self):
        cdef Py_ssize_t i, size = self.n + 2 + self.nadopt
        cdef PyObject *o
        cdef KVCacheBlock b
        if self.objs != NULL and not self.private:
            for i in range(size):
                o = self.objs[i]
                if o == NULL:
                    continue
                self.objs[i] = NULL
                b = <KVCacheBlock> o
                if Py_REFCNT(b) > 2:  # referenced beyond `b` and our slot
                    _detach(b, self, i)
                else:
                    b._st = NULL
                Py_DECREF(b)  # our slot's reference; `b` still holds one
        if self.hash != NULL:
            for i in range(size):
                Py_XDECREF(self.hash[i])
        if self.private:
            Py_XDECREF(self.pool)
        self.pool = NULL
        PyMem_Free(self.ntok)
        PyMem_Free(self.prev)
        PyMem_Free(self.next)
        PyMem_Free(self.ref_cnt)
        PyMem_Free(self.flags)
        PyMem_Free(self.stamp)
        PyMem_Free(self.hash)
        PyMem_Free(self.objs)

    cdef object block(self, Py_ssize_t i):
        """The handle of block ``i`` (0 <= i < n + 2), created on first use."""
        if self.objs[i] == NULL:
            self.materialise(i, 1)
        return <object> self.objs[i]

    cdef int materialise(self, Py_ssize_t first, Py_ssize_t count) except -1:
        cdef Py_ssize_t i
        cdef KVCacheBlock b
        for i in range(first, first + count):
            if self.objs[i] != NULL:
                continue
            if self.no_pool:
                b = KVCacheBlock24.__new__(KVCacheBlock24)
            elif self.v34:
                b = KVCacheBlock34.__new__(KVCacheBlock34)
            elif self.v33:
                b = KVCacheBlock33.__new__(KVCacheBlock33)
            else:
                b = KVCacheBlock.__new__(KVCacheBlock)
            b._st = <PyObject *> self
            b._idx = <int32_t> i
            b._bid = <int32_t> i if i < self.n else -1
            Py_INCREF(b)
            self.objs[i] = <PyObject *> b
            if i < self.n:  # sentinels do not count: num_objs == n means "all blocks"
                self.num_objs += 1
        return 0

    cdef uint32_t new_epoch(self) noexcept:
        """A fresh stamp value: ``stamp[i] == epoch`` means "block i was seen
        earlier in this call", with nothing to clear afterwards."""
        self.epoch += 1
        if self.epoch == 0:  # wrapped after 2**32 calls: forget old stamps
            memset(self.stamp, 0, self.cap * sizeof(uint32_t))
            self.epoch = 1
        return self.epoch

    cdef void unlink(self, Py_ssize_t i) noexcept:
        cdef int32_t p = self.prev[i], nx = self.next[i]
        self.next[p] = nx
        self.prev[nx] = p
        self.prev[i] = -1
        self.next[i] = -1
        self.num_free -= 1

    cdef Py_ssize_t add_slot(self) except -1:
        """A new slot after the sentinels (for an adopted block), the arrays
        grown as needed; all its state zero/None, out of the list."""
        cdef Py_ssize_t used = self.n + 2 + self.nadopt, new_cap, i
        if used == self.cap:
            new_cap = self.cap + max(8, self.nadopt)
            if new_cap > <Py_ssize_t> INT32_MAX:
                new_cap = <Py_ssize_t> INT32_MAX
            if used >= new_cap:
                raise ValueError("no room to adopt another block")
            if not (_grow(<void **> &self.prev, new_cap * sizeof(int32_t))
                    and _grow(<void **> &self.next, new_cap * sizeof(int32_t))
                    and _grow(<void **> &self.ref_cnt, new_cap * sizeof(int32_t))
                    and _grow(<void **> &self.flags, new_cap * sizeof(uint8_t))
                    and _grow(<void **> &self.stamp, new_cap * sizeof(uint32_t))
                    and _grow(<void **> &self.hash, new_cap * sizeof(PyObject *))
                    and _grow(<void **> &self.objs, new_cap * sizeof(PyObject *))
                    and (self.ntok == NULL
                         or _grow(<void **> &self.ntok, new_cap * sizeof(int64_t)))):
                raise MemoryError("cannot grow the block store")
            for i in range(self.cap, new_cap):
                self.prev[i] = -1
                self.next[i] = -1
                self.ref_cnt[i] = 0
                self.flags[i] = 0
                self.stamp[i] = 0
                self.hash[i] = NULL
                self.objs[i] = NULL
                if self.ntok != NULL:
                    self.ntok[i] = NTOK_NONE
            self.cap = new_cap
        self.nadopt += 1
        return used

    cdef void link_tail(self, Py_ssize_t i) noexcept:
        cdef Py_ssize_t tail = self.n + 1
        cdef int32_t last = self.prev[tail]
        self.next[last] = <int32_t> i
        self.prev[i] = last
        self.next[i] = <int32_t> tail
        self.prev[tail] = <int32_t> i
        self.num_free += 1


cdef inline bint _grow(void **p, size_t size) noexcept:
    """Reallocate ``*p`` to ``size`` bytes; False (``*p`` unchanged) on failure."""
    cdef void *q = PyMem_Realloc(p[0], size)
    if q == NULL:
        return False
    p[0] = q
    return True


cdef Py_ssize_t _adopt(_Store st, object o) except -2:
    """Take the stand-alone block ``o`` (made with ``KVCacheBlock(...)``, in
    no pool or queue yet) into a new slot of ``st``, with its state, and
    return the slot; -1 if ``o`` is not such a block. vLLM's pure-Python
    design lets any block object join any pool or queue; adopting it keeps
    each block in one store, so it can never be linked into two lists."""
    cdef KVCacheBlock b
    cdef _Store old
    cdef Py_ssize_t i
    if not _is_block(o):
        return -1
    b = <KVCacheBlock> o
    if b._st == NULL:
        return -1
    old = <_Store> b._st
    if old is st or not old.private:
        return -1
    if old.pool != NULL and <object> old.pool is not _store_pool(st):
        return -1  # made for another pool: that pool's, not ours
    if st.unsettled:
        _settle_kind(st, type(b))
    if _block_kind(type(b)) != _store_kind(st):
        raise TypeError(
            f"block {b._bid} is a {_block_kind(type(b))} block; this pool or queue holds "
            f"{_store_kind(st)} blocks"
        )
    i = st.add_slot()
    st.ref_cnt[i] = old.ref_cnt[0]
    st.flags[i] = (old.flags[0] & _NULL) | _ADOPTED
    st.hash[i] = old.hash[0]
    old.hash[0] = NULL
    if st.ntok != NULL:
        st.ntok[i] = old.ntok[0]
    Py_INCREF(b)
    st.objs[i] = <PyObject *> b
    old.objs[0] = NULL
    b._st = <PyObject *> st
    b._idx = <int32_t> i
    Py_DECREF(old)  # the private store the block owned
    return i


cdef int _give_private_store(KVCacheBlock b, int32_t ref_cnt, uint8_t flags,
                             PyObject *owned_hash, int64_t ntok=NTOK_NONE,
                             object pool=None) except -1:
    """Bind ``b`` to a one-block store of its own holding this state (the
    store takes over the reference ``owned_hash``, which may be NULL)."""
    cdef _Store mine
    try:
        mine = _Store(1, True, isinstance(b, KVCacheBlock33))
    except BaseException:
        Py_XDECREF(owned_hash)
        raise
    _set_handle_class(mine, type(b))
    mine.ref_cnt[0] = ref_cnt
    mine.flags[0] = flags
    mine.hash[0] = owned_hash
    if mine.v33:
        mine.ntok[0] = ntok
        if pool is not None:
            Py_INCREF(pool)
            mine.pool = <PyObject *> pool
    mine.objs[0] = <PyObject *> b  # borrowed: the block owns its private store
    mine.num_objs = 1
    Py_INCREF(mine)
    b._st = <PyObject *> mine
    b._idx = 0
    return 0


cdef int _detach(KVCacheBlock b, _Store st, Py_ssize_t i) except -1:
    """Give ``b`` a private store with its last state (its store is dying)."""
    cdef PyObject *h = st.hash[i]
    st.hash[i] = NULL
    return _give_private_store(b, st.ref_cnt[i], st.flags[i] & _NULL, h,
                               st.ntok[i] if st.ntok != NULL else NTOK_NONE)


cdef inline Py_ssize_t _check_count(object n, str what) except -1:
    cdef int overflow = 0
    cdef long long v
    if not isinstance(n, int):
        raise TypeError(f"{what} must be an int, got {type(n).__name__}")
    v = PyLong_AsLongLongAndOverflow(n, &overflow)  # no exception to save
    if overflow:
        v = -1 if overflow < 0 else PY_SSIZE_T_MAX
    if v < 0:
        raise ValueError(f"{what} must be >= 0, got {n}")
    return v


cdef inline uint32_t _check_group(object g) except? 0xFFFFFFFF:
    cdef int overflow = 0
    cdef long long v
    if not isinstance(g, int):
        raise TypeError(f"kv_cache_group_id must be an int, got {type(g).__name__}")
    v = PyLong_AsLongLongAndOverflow(g, &overflow)
    if overflow or v < 0 or v > 0xFFFFFFFF:
        raise OverflowError(f"kv_cache_group_id {g} does not fit in 4 bytes")
    return <uint32_t> v


cdef inline object _check_hash(object h):
    if not PyBytes_Check(h):
        raise TypeError(f"a block hash must be bytes, got {type(h).__name__}")
    return h


cdef inline bytes _make_key(object h, uint32_t group):
    """``h + group.to_bytes(4, "big")`` without intermediate objects."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(h)
    cdef bytes key = PyBytes_FromStringAndSize(NULL, size + GROUP_ID_BYTES)
    cdef char *buf = PyBytes_AS_STRING(key)
    memcpy(buf, PyBytes_AS_STRING(h), size)
    buf[size] = <char> ((group >> 24) & 0xFF)
    buf[size + 1] = <char> ((group >> 16) & 0xFF)
    buf[size + 2] = <char> ((group >> 8) & 0xFF)
    buf[size + 3] = <char> (group & 0xFF)
    return key


cdef inline Py_ssize_t _index_in(_Store st, object o) except -1:
    """Index of block ``o`` in ``st``; raises unless it is one of its blocks."""
    cdef Py_ssize_t i = _index_in_or_none(st, o)
    if i >= 0:
        return i
    i = _adopt(st, o)
    if i >= 0:
        return i
    if not _is_block(o):
        raise TypeError(f"expected a KVCacheBlock, got {type(o).__name__}")
    raise ValueError(f"block {(<KVCacheBlock> o)._bid} does not belong to this pool")


cdef inline bint _is_block(object o) noexcept:
    """Exactly one of the handle classes (pointer compares)."""
    return (type(o) is KVCacheBlock or type(o) is KVCacheBlock33 or type(o) is KVCacheBlock24
            or type(o) is KVCacheBlock34)


cdef inline bint _store33_class(object cls) noexcept:
    """Whether handles of ``cls`` live on a 0.33-style store (token counts)."""
    return cls is KVCacheBlock33 or cls is KVCacheBlock24 or cls is KVCacheBlock34


cdef inline void _set_handle_class(_Store st, object cls) noexcept:
    """Which of the 0.33-style handle classes ``st`` hands out: ``cls``'s."""
    st.no_pool = cls is KVCacheBlock24
    st.v34 = cls is KVCacheBlock34


cdef int _settle_kind(_Store st, object cls) except -1:
    """A queue built from an empty list (``FreeKVCacheBlockQueue([])``, as
    vLLM's tests build one) takes the vLLM line of the first block it adopts:
    the empty list could not name it. Only while the store holds no block."""
    cdef Py_ssize_t i
    st.unsettled = False
    # Sentinel objects already handed out keep their class (KVCacheBlock33
    # adds no C field, so they read the store alike).
    if st.nadopt or st.num_objs:
        return 0
    if _store33_class(cls):
        if st.ntok == NULL:
            st.ntok = <int64_t *> PyMem_Malloc(st.cap * sizeof(int64_t))
            if st.ntok == NULL:
                raise MemoryError("cannot allocate the block store")
            for i in range(st.cap):
                st.ntok[i] = NTOK_NONE
        st.v33 = True
        _set_handle_class(st, cls)
    return 0


cdef str _block_kind(object cls):
    """The line a handle class belongs to, in messages."""
    if cls is KVCacheBlock34:
        return "0.34"
    return "0.24-0.29" if cls is KVCacheBlock24 else ("0.33" if cls is KVCacheBlock33 else "0.15")


cdef str _store_kind(_Store st):
    if st.v34:
        return "0.34"
    return "0.24-0.29" if st.no_pool else ("0.33" if st.v33 else "0.15")


cdef inline _Store _live_store(KVCacheBlock b):
    if b._st == NULL:
        raise RuntimeError("KVCacheBlock was not initialised")
    return <_Store> b._st


@cython.no_gc
cdef class KVCacheBlock:
    """Metadata of one KV-cache block (the tensors live on the GPU).

    A handle onto a slot of a store: reading an attribute reads the pool's C
    arrays. Compares and hashes by identity.
    """

    def __cinit__(self, *args, **kwargs):
        self._st = NULL

    def __init__(
        self,
        block_id,
        ref_cnt=0,
        _block_hash=None,
        prev_free_block=None,
        next_free_block=None,
        is_null=False,
    ):
        _init_standalone(self, block_id, ref_cnt, _block_hash, prev_free_block,
                         next_free_block, is_null, NTOK_NONE, None)

    def __dealloc__(self):
        cdef _Store st
        if self._st != NULL:
            st = <_Store> self._st
            if st.private:
                st.objs[0] = NULL
                self._st = NULL
                Py_DECREF(st)

    @property
    def block_id(self):
        return self._bid

    @property
    def ref_cnt(self):
        return _live_store(self).ref_cnt[self._idx]

    @ref_cnt.setter
    def ref_cnt(self, value):
        cdef _Store st = _live_store(self)
        _check_ref_cnt(value, st.flags[self._idx] & _NULL)
        st.ref_cnt[self._idx] = value

    @property
    def is_null(self):
        return bool(_live_store(self).flags[self._idx] & _NULL)

    @is_null.setter
    def is_null(self, value):
        cdef _Store st = _live_store(self)
        if value:
            st.flags[self._idx] |= _NULL
        else:
            st.flags[self._idx] &= ~_NULL

    @property
    def block_hash(self):
        cdef _Store st = _live_store(self)
        cdef PyObject *h = st.hash[self._idx]
        return None if h == NULL else <object> h

    @block_hash.setter
    def block_hash(self, value):
        cdef _Store st = _live_store(self)
        if value is not None:
            _check_hash(value)
        if st.hash[self._idx] != NULL:
            raise RuntimeError(
                f"block {self._bid} already has a hash; reset_hash() it first"
            )
        if value is not None:
            Py_INCREF(value)
            st.hash[self._idx] = <PyObject *> value

    @property
    def _block_hash(self):
        return self.block_hash

    @_block_hash.setter
    def _block_hash(self, value):
        # vLLM's connectors write the field directly (SimpleCPUOffload, from
        # 0.19, on a block fresh from get_new_blocks): the setter's rules.
        self.block_hash = value

    def reset_hash(self):
        """Forget the block's hash key (when its cache entry is evicted)."""
        cdef _Store st = _live_store(self)
        cdef PyObject *h = st.hash[self._idx]
        st.hash[self._idx] = NULL
        if st.ntok != NULL:
            st.ntok[self._idx] = NTOK_NONE
        Py_XDECREF(h)

    @property
    def prev_free_block(self):
        cdef _Store st = _live_store(self)
        cdef int32_t p = st.prev[self._idx]
        return None if p < 0 else st.block(p)

    @property
    def next_free_block(self):
        cdef _Store st = _live_store(self)
        cdef int32_t nx = st.next[self._idx]
        return None if nx < 0 else st.block(nx)

    def __repr__(self):
        return _block_repr(self, "")

    def __reduce__(self):
        raise TypeError("KVCacheBlock cannot be pickled: it is a view of its pool")


@cython.no_gc
cdef class KVCacheBlock33(KVCacheBlock):
    """A block of the vLLM 0.33 line (``kvpool.v0_33.KVCacheBlock``).

    The same handle as ``KVCacheBlock`` with 0.33's additions: the number of
    prefix tokens its hash covers (``block_hash_num_tokens``), the pool it
    belongs to (``pool``), ``set_block_hash`` and 0.33's constructor and
    ``repr``. A subclass rather than a flag, so that ``isinstance`` against
    either line's class works and each line's repr is its release's.
    """

    def __init__(
        self,
        block_id,
        ref_cnt=0,
        _block_hash=None,
        _block_hash_num_tokens=None,
        prev_free_block=None,
        next_free_block=None,
        is_null=False,
        *,
        pool=None,
    ):
        _init_standalone(self, block_id, ref_cnt, _block_hash, prev_free_block,
                         next_free_block, is_null, _check_ntok(_block_hash_num_tokens), pool)

    @property
    def block_hash_num_tokens(self):
        cdef _Store st = _live_store(self)
        cdef int64_t v = st.ntok[self._idx]
        return None if v == NTOK_NONE else v

    @property
    def _block_hash_num_tokens(self):
        return self.block_hash_num_tokens

    @property
    def pool(self):
        """The pool this block belongs to (None for a standalone block, or
        once its pool is gone)."""
        cdef _Store st = _live_store(self)
        if st.flags[self._idx] & _ADOPTED:
            return None  # an adopted stand-alone block keeps pool None, as in vLLM
        return _store_pool(st)

    def set_block_hash(self, block_hash, num_tokens=None):
        """Give the block its (first) hash key and the number of prefix
        tokens it covers; the block must have none yet."""
        cdef _Store st = _live_store(self)
        _check_hash(block_hash)
        cdef int64_t ntok = _check_ntok(num_tokens)
        if st.hash[self._idx] != NULL or st.ntok[self._idx] != NTOK_NONE:
            raise RuntimeError(
                f"block {self._bid} already has a hash; reset_hash() it first"
            )
        Py_INCREF(block_hash)
        st.hash[self._idx] = <PyObject *> block_hash
        st.ntok[self._idx] = ntok

    def __repr__(self):
        return _block_repr(self, f"_block_hash_num_tokens={self.block_hash_num_tokens}, ")


@cython.final
@cython.no_gc
cdef class KVCacheBlock24(KVCacheBlock33):
    """A block of vLLM 0.24-0.29: ``KVCacheBlock33`` without ``pool`` (the
    field and the constructor argument came in 0.30). The pool a block
    belongs to is still known to the core (cross-pool frees), just not
    shown."""

    def __init__(
        self,
        block_id,
        ref_cnt=0,
        _block_hash=None,
        _block_hash_num_tokens=None,
        prev_free_block=None,
        next_free_block=None,
        is_null=False,
    ):
        _init_standalone(self, block_id, ref_cnt, _block_hash, prev_free_block,
                         next_free_block, is_null, _check_ntok(_block_hash_num_tokens), None)

    @property
    def pool(self):
        raise AttributeError("'KVCacheBlock' object has no attribute 'pool'")


@cython.final
@cython.no_gc
cdef class KVCacheBlock34(KVCacheBlock33):
    """A block of vLLM 0.34: ``KVCacheBlock33`` whose hash fields are plain
    ``block_hash`` / ``block_hash_num_tokens`` (no ``_block_hash``), and
    whose ``pool`` is a weak reference to its pool, as 0.34's blocks hold
    (``weakref.ref(pool)`` is the pool's own ``_weak_self``: CPython hands
    out one plain reference per object, so ``block.pool is
    pool._weak_self`` holds as in vLLM)."""

    def __init__(
        self,
        block_id,
        ref_cnt=0,
        block_hash=None,
        block_hash_num_tokens=None,
        prev_free_block=None,
        next_free_block=None,
        is_null=False,
        *,
        pool=None,
    ):
        # vLLM passes its pool's weak reference; the stand-alone block keeps
        # the pool itself (a stand-alone block is never one of a pool's).
        if isinstance(pool, _weakref):
            pool = pool()
        _init_standalone(self, block_id, ref_cnt, block_hash, prev_free_block,
                         next_free_block, is_null, _check_ntok(block_hash_num_tokens), pool)

    @property
    def block_hash_num_tokens(self):
        cdef _Store st = _live_store(self)
        cdef int64_t v = st.ntok[self._idx]
        return None if v == NTOK_NONE else v

    @block_hash_num_tokens.setter
    def block_hash_num_tokens(self, value):
        # A plain field in 0.34; the count is bookkeeping only (the map does
        # not depend on it), so any int or None is taken.
        cdef int64_t v = _check_ntok(value)
        _live_store(self).ntok[self._idx] = v

    @property
    def _block_hash(self):
        raise AttributeError("'KVCacheBlock' object has no attribute '_block_hash'")

    @property
    def _block_hash_num_tokens(self):
        raise AttributeError("'KVCacheBlock' object has no attribute '_block_hash_num_tokens'")

    @property
    def pool(self):
        """A weak reference to the pool this block belongs to (None for a
        stand-alone block)."""
        cdef _Store st = _live_store(self)
        if st.flags[self._idx] & _ADOPTED:
            return None
        owner = _store_pool(st)
        return None if owner is None else _weakref(owner)

    def __repr__(self):
        return _block_repr(
            self, f"block_hash_num_tokens={self.block_hash_num_tokens}, ", "block_hash"
        )


cdef int _init_standalone(KVCacheBlock self, object block_id, object ref_cnt,
                          object block_hash, object prev_free_block,
                          object next_free_block, object is_null, int64_t ntok,
                          object pool) except -1:
    """Both lines' constructor: check everything, then give the block a
    private store with this state."""
    if self._st != NULL:
        raise RuntimeError("KVCacheBlock is already initialised")
    if isinstance(block_id, bool) or not isinstance(block_id, int):
        raise TypeError(f"block_id must be an int, got {type(block_id).__name__}")
    if not (-2**31 <= block_id < 2**31):
        raise ValueError(f"block_id {block_id} is out of range [-2**31, 2**31)")
    if prev_free_block is not None or next_free_block is not None:
        raise ValueError("a new block cannot be linked to a free list")
    _check_ref_cnt(ref_cnt)
    cdef PyObject *h = NULL
    if block_hash is not None:
        _check_hash(block_hash)
        Py_INCREF(block_hash)
        h = <PyObject *> block_hash
    _give_private_store(self, ref_cnt, _NULL if is_null else 0, h, ntok, pool)
    self._bid = block_id
    return 0


cdef inline int64_t _check_ntok(object value) except? -1:
    """A ``num_tokens`` argument: None, or an int that fits int64."""
    cdef int overflow = 0
    cdef long long v
    if value is None:
        return NTOK_NONE
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"num_tokens must be an int or None, got {type(value).__name__}")
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow or v == NTOK_NONE:
        raise OverflowError(f"num_tokens {value} does not fit in 64 bits")
    return v


cdef str _block_repr(KVCacheBlock b, str extra, str hash_field="_block_hash"):
    """Every line's repr: neighbours by id only (printing them whole would
    recurse along the list); ``extra``: the 0.33 line's token-count field;
    ``hash_field``: the hash's field name (0.34: ``block_hash``)."""
    cdef _Store st = _live_store(b)
    cdef int32_t p = st.prev[b._idx], nx = st.next[b._idx]
    return (
        f"KVCacheBlock(block_id={b._bid}, "
        f"ref_cnt={st.ref_cnt[b._idx]}, "
        f"{hash_field}={b.block_hash!r}, "
        f"{extra}"
        f"prev_free_block={_neighbour_id(st, p)}, "
        f"next_free_block={_neighbour_id(st, nx)})"
    )


cdef object _neighbour_id(_Store st, int32_t i):
    if i < 0:
        return None
    if st.n <= i <= st.n + 1:
        return -1  # a sentinel
    if st.objs[i] != NULL:
        return (<KVCacheBlock> st.objs[i])._bid
    return i  # a pool block not handed out yet: its id is its index


cdef inline int _check_ref_cnt(object value, bint null=False) except -1:
    """A ref_cnt a block may be given; the null block's may be below 0, as
    vLLM before 0.33 drives it (down to NULL_REF_CNT_MIN)."""
    cdef long long v
    cdef long long low = NULL_REF_CNT_MIN if null else 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"ref_cnt must be an int, got {type(value).__name__}")
    try:
        v = value
    except OverflowError:
        v = low - 1
    if not (low <= v <= INT32_MAX):
        raise ValueError(f"ref_cnt must be in [{low}, {INT32_MAX}], got {value}")
    return 0


cdef FreeKVCacheBlockQueue _queue_over(_Store st):
    cdef FreeKVCacheBlockQueue q = FreeKVCacheBlockQueue.__new__(FreeKVCacheBlockQueue)
    q.st = st
    return q


@cython.final
@cython.no_gc
cdef class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: least recently freed at the head.

    A doubly linked list, not a ``deque``, because a prefix-cache hit must pull
    a block out of the middle in O(1). The links are int32 indices in the
    store's arrays, so linking and unlinking allocate nothing.
    """

    def __cinit__(self, *args, **kwargs):
        self.st = _Store(0)

    def __init__(self, blocks):
        if self.st.owned:
            raise RuntimeError("FreeKVCacheBlockQueue is already initialised")
        cdef object seq = PySequence_Fast(blocks, "blocks must be a sequence of KVCacheBlock")
        cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i
        cdef KVCacheBlock b
        cdef _Store old, st
        if n > MAX_BLOCKS:
            raise ValueError(f"too many blocks: {n} > {MAX_BLOCKS}")
        seen = set()
        cls = type(<object> PySequence_Fast_GET_ITEM(seq, 0)) if n else KVCacheBlock
        for i in range(n):
            o = <object> PySequence_Fast_GET_ITEM(seq, i)
            if not _is_block(o):
                raise TypeError(f"expected a KVCacheBlock, got {type(o).__name__}")
            if type(o) is not cls:
                raise TypeError("blocks of different vLLM lines cannot share a queue")
            b = <KVCacheBlock> o
            if b._st == NULL:
                raise RuntimeError("KVCacheBlock was not initialised")
            if not (<_Store> b._st).private or (<_Store> b._st).owned:
                raise ValueError(f"block {b._bid} already belongs to a pool or queue")
            if id(b) in seen:
                raise ValueError(f"block {b._bid} appears twice")
            seen.add(id(b))
        st = _Store(n, False, _store33_class(cls))
        _set_handle_class(st, cls)
        st.unsettled = n == 0
        st.owned = True
        # Blocks made with pool=P (vLLM builds a pool's queue from its
        # blocks this way) keep P as their pool: weakly, as the pool owns
        # the queue.
        pools = {<object> (<_Store> (<KVCacheBlock> PySequence_Fast_GET_ITEM(seq, i))._st).pool
                 for i in range(n)
                 if (<_Store> (<KVCacheBlock> PySequence_Fast_GET_ITEM(seq, i))._st).pool != NULL}
        if len(pools) > 1:
            raise ValueError("blocks of different pools cannot share a queue")
        if pools:
            st.pool_wr = _weakref(pools.pop())
        for i in range(n):
            b = <KVCacheBlock> PySequence_Fast_GET_ITEM(seq, i)
            old = <_Store> b._st
            st.ref_cnt[i] = old.ref_cnt[0]
            st.flags[i] = old.flags[0]
            st.hash[i] = old.hash[0]
            old.hash[0] = NULL
            if st.v33:
                st.ntok[i] = old.ntok[0]
            old.objs[0] = NULL
            Py_INCREF(b)
            st.objs[i] = <PyObject *> b
            b._st = <PyObject *> st
            b._idx = <int32_t> i
            Py_DECREF(old)  # the private store the block owned
            st.link_tail(i)
        st.num_objs = n
        self.st = st

    @property
    def num_free_blocks(self):
        return self.st.num_free

    @property
    def fake_free_list_head(self):
        return self.st.block(self.st.n)

    @property
    def fake_free_list_tail(self):
        return self.st.block(self.st.n + 1)

    def popleft(self):
        """Pop the block at the head (the next eviction candidate)."""
        cdef _Store st = self.st
        if st.num_free == 0:
            raise ValueError("No free blocks available")
        cdef int32_t i = st.next[st.n]
        b = st.block(i)
        st.unlink(i)
        return b

    def popleft_n(self, n):
        """Pop the ``n`` blocks at the head, in order."""
        cdef Py_ssize_t k = _check_count(n, "n")
        cdef _Store st = self.st
        if k > st.num_free:
            raise ValueError(f"Cannot pop {k} blocks: only {st.num_free} are free")
        return _popleft_n(st, k)

    def remove(self, block):
        """Take ``block`` out of the queue, wherever it is (O(1))."""
        cdef _Store st = self.st
        cdef Py_ssize_t i = _index_in(st, block)
        if st.prev[i] < 0:
            raise RuntimeError(f"remove() called on block {i}, which is not in the free queue")
        st.unlink(i)

    def append(self, block):
        """Put ``block`` at the tail (evicted last)."""
        cdef _Store st = self.st
        cdef Py_ssize_t i = _index_in(st, block)
        if st.prev[i] >= 0:
            raise ValueError(f"block {(<KVCacheBlock> block)._bid} is already in the free queue")
        st.link_tail(i)

    def append_n(self, blocks):
        """Put ``blocks`` at the tail, in order."""
        cdef object seq = PySequence_Fast(blocks, "blocks must be a sequence of KVCacheBlock")
        _link_n(self.st, seq, False)

    def prepend_n(self, blocks):
        """Put ``blocks`` at the head, in order: ``blocks[0]`` is evicted
        first (vLLM 0.33 frees blocks that cannot be a prefix hit this way)."""
        cdef object seq = PySequence_Fast(blocks, "blocks must be a sequence of KVCacheBlock")
        _link_n(self.st, seq, True)

    def iter_blocks_after(self, cursor):
        """The free blocks after ``cursor`` (a block of this queue or a
        sentinel; None: from the head), in eviction order. Lazy: each step
        follows the cursor's link as it is then; a cursor that is no longer
        queued ends the walk."""
        cdef _Store st = self.st
        cdef Py_ssize_t i
        if cursor is None:
            i = st.next[st.n]
        else:
            if not _is_block(cursor) or (<KVCacheBlock> cursor)._st != <PyObject *> st:
                _index_in(st, cursor)  # raises the precise error
            i = st.next[(<KVCacheBlock> cursor)._idx]
        return _iter_after(self, i)

    def get_all_free_blocks(self):
        """The free blocks from head to tail."""
        cdef _Store st = self.st
        cdef Py_ssize_t k = st.num_free, j
        cdef int32_t i = st.next[st.n]
        ret = PyList_New(k)
        for j in range(k):
            o = st.block(i)
            Py_INCREF(o)
            PyList_SET_ITEM(ret, j, o)
            i = st.next[i]
        return ret


cdef list _popleft_n(_Store st, Py_ssize_t k, bint allocate=False,
                     bint evict=False, BlockHashToBlockMap cache=None, list removed=None,
                     dict by_block=None):
    """Pop ``k <= num_free`` blocks from the head, in one walk and with no
    per-block Python call. With ``allocate`` each popped block gets
    ``ref_cnt = 1`` and, with ``evict``, loses its cached hash (the evicted
    keys are appended to ``removed``)."""
    cdef Py_ssize_t j
    cdef int32_t i, nx, head = <int32_t> st.n
    cdef PyObject *o
    # Read once: a block without a hash has nothing to evict unless some
    # block has further keys (0.33 only).
    cdef bint extra_keys = by_block is not None and PyDict_Size(by_block) != 0
    if st.num_objs < st.n:
        # Create missing handles first, so nothing below can fail midway.
        i = st.next[head]
        for j in range(k):
            if st.objs[i] == NULL:
                st.materialise(i, 1)
            i = st.next[i]
    if evict and extra_keys:
        # 0.33 with further keys somewhere: a block without a hash may still
        # have keys, so every popped block goes through eviction, in order,
        # before the walk (which then evicts nothing): the walk below stays
        # the 0.15 loop.
        i = st.next[head]
        for j in range(k):
            _evict_one(st, cache, i, removed, by_block)
            i = st.next[i]
        evict = False
    ret = PyList_New(k)
    i = st.next[head]
    for j in range(k):
        o = st.objs[i]
        Py_INCREF(<object> o)
        PyList_SET_ITEM(ret, j, <object> o)
        if allocate:
            st.ref_cnt[i] = 1
            if evict and st.hash[i] != NULL:  # the common case, a block with no hash, stays inline
                _evict_one(st, cache, i, removed, by_block)
        nx = st.next[i]
        st.prev[i] = -1
        st.next[i] = -1
        i = nx
    st.next[head] = i
    st.prev[i] = head
    st.num_free -= k
    return ret


cdef list _allocate(_Store st, object num_blocks, bint evict,
                    BlockHashToBlockMap cache, list removed, dict by_block):
    """get_new_blocks' work: check the count, then pop and allocate."""
    cdef Py_ssize_t k = _check_count(num_blocks, "num_blocks")
    if k > st.num_free:
        raise ValueError(
            f"Cannot get {k} free blocks from the pool ({st.num_free} free)"
        )
    return _popleft_n(st, k, True, evict, cache, removed, by_block)


def _iter_after(FreeKVCacheBlockQueue q, Py_ssize_t i):
    # A generator over the store's links; `q` keeps the store alive.
    cdef _Store st = q.st
    while 0 <= i < st.n:
        yield st.block(i)
        i = st.next[i]


cdef int _link_n(_Store st, object seq, bint front) except -1:
    """Link every block of ``seq`` (a PySequence_Fast) in order at the tail
    (or, with ``front``, at the head), in one pass; if a block is foreign,
    already queued or repeated, the run linked so far is cut off again and
    nothing has changed."""
    cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), j, i, bad = -1
    cdef PyObject **items = PySequence_Fast_ITEMS(seq)
    cdef int32_t tail = <int32_t> (st.n + 1)
    cdef int32_t last0 = <int32_t> st.n if front else st.prev[tail], last = last0
    cdef int32_t after = st.next[last0]  # the tail, unless prepending
    cdef uint32_t ep = st.new_epoch()
    for j in range(n):
        i = _index_in_or_none(st, <object> items[j])
        if i < 0:
            i = _adopt(st, <object> items[j])
        if i < 0 or st.stamp[i] == ep or st.prev[i] >= 0:
            bad = j
            break
        st.stamp[i] = ep
        st.next[last] = <int32_t> i
        st.prev[i] = last
        last = <int32_t> i
    if bad >= 0:
        for j in range(bad):
            i = (<KVCacheBlock> items[j])._idx
            st.prev[i] = -1
            st.next[i] = -1
        st.next[last0] = after
        o = <object> items[bad]
        i = _index_in(st, o)  # raises for a foreign block
        if st.stamp[i] == ep:
            raise ValueError(f"block {(<KVCacheBlock> o)._bid} appears twice")
        raise ValueError(f"block {(<KVCacheBlock> o)._bid} is already in the free queue")
    st.next[last] = after
    st.prev[after] = last
    st.num_free += n
    return 0


cdef extern from *:
    """
    typedef unsigned __int128 kvpool_u128;
    """
    ctypedef unsigned long long kvpool_u128  # only its conversions are used


cdef inline uint64_t _mum(uint64_t a, uint64_t b) noexcept:
    """64x64 -> 128-bit multiply, folded (wyhash's mixing step)."""
    cdef kvpool_u128 r = <kvpool_u128> a * <kvpool_u128> b
    return <uint64_t> r ^ <uint64_t> (r >> 64)


cdef inline uint64_t _hash_parts(const char *p, Py_ssize_t size, uint32_t suffix) noexcept:
    """Hash of ``p[:size] + suffix.to_bytes(4, "big")``.

    Each 16-byte chunk is mixed on its own (one wide multiply) and the chunks
    are combined at the end, so the multiplies of a 32-byte block hash run in
    parallel instead of in a chain. Block hashes are already uniformly
    distributed (sha256 or xxhash); the chunk index and a per-process seed
    keep reordered or crafted keys from colliding.
    """
    cdef uint64_t acc = _SEED ^ (<uint64_t> size * <uint64_t> 0x9E3779B97F4A7C15)
    cdef uint64_t a, b, k = 0
    cdef Py_ssize_t j = 0
    while j + 16 <= size:
        memcpy(&a, p + j, 8)
        memcpy(&b, p + j + 8, 8)
        acc ^= _mum(a ^ <uint64_t> 0xA0761D6478BD642F ^ k, b ^ _SEED)
        k += <uint64_t> 0xE7037ED1A0B428DB
        j += 16
    a = 0
    b = 0
    if size - j > 8:
        memcpy(&a, p + j, 8)
        memcpy(&b, p + j + 8, size - j - 8)
    elif size > j:
        memcpy(&a, p + j, size - j)
    acc ^= _mum(a ^ <uint64_t> 0x8EBC6AF09C88C6E3 ^ k, b ^ suffix ^ _SEED)
    return _mum(acc ^ <uint64_t> 0x589965CC75374CC3, <uint64_t> suffix ^ <uint64_t> 0x1D8E4E27C47D124F)


cdef inline uint32_t _group_id_at(const unsigned char *p) noexcept:
    """The group id a hash key ends with: its last four bytes at ``p``,
    unsigned big-endian (kvpool.hashing.make_block_hash_with_group_id)."""
    return ((<uint32_t> p[0] << 24) | (<uint32_t> p[1] << 16)
            | (<uint32_t> p[2] << 8) | <uint32_t> p[3])


cdef inline uint64_t _hash_key(bytes key) noexcept:
    """The table hash of a whole key: the part before the last four bytes,
    then those four bytes as the group id (consistent with _hash_parts)."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(key)
    cdef const unsigned char *p = <const unsigned char *> PyBytes_AS_STRING(key)
    if size < GROUP_ID_BYTES:
        # Too short to carry a group id: hash it all, tagged by its length.
        return _hash_parts(<const char *> p, size, 0xFFFFFFFF) ^ <uint64_t> 0x5555
    cdef Py_ssize_t q = size - GROUP_ID_BYTES
    return _hash_parts(<const char *> p, q, _group_id_at(p + q))


cdef inline bint _bytes_equal(const unsigned char *a, const unsigned char *b, Py_ssize_t size) noexcept:
    """``memcmp(a, b, size) == 0``, inline: block hashes are a few words
    long, and a libc call costs more than comparing them."""
    cdef uint64_t x, y
    cdef Py_ssize_t j = 0
    while j + 8 <= size:
        memcpy(&x, a + j, 8)
        memcpy(&y, b + j, 8)
        if x != y:
            return False
        j += 8
    while j < size:
        if a[j] != b[j]:
            return False
        j += 1
    return True


cdef inline bint _key_equals(object stored, const char *p, Py_ssize_t size, uint32_t g) noexcept:
    cdef const unsigned char *s
    if PyBytes_GET_SIZE(stored) != size + GROUP_ID_BYTES:
        return False
    s = <const unsigned char *> PyBytes_AS_STRING(stored)
    if not _bytes_equal(s, <const unsigned char *> p, size):
        return False
    return (s[size] == ((g >> 24) & 0xFF) and s[size + 1] == ((g >> 16) & 0xFF)
            and s[size + 2] == ((g >> 8) & 0xFF) and s[size + 3] == (g & 0xFF))


cdef uint64_t _SEED = 0


# Not final: vLLM 0.34's map (BlockHashToBlockMap34) extends it; its cdef
# methods are final in _core.pxd, so they are still called directly.
@cython.no_gc
cdef class BlockHashToBlockMap:
    """Prefix-cache index: hash key -> block, or -> {block_id: block} when
    several blocks share a key (keys are never de-duplicated, so a block id
    handed to a request never changes). Storing a lone block directly keeps
    the common case free of inner dicts.

    An open-addressing table in C (linear probing, backward-shift deletion)
    rather than a dict: a lookup by ``(block_hash, group_id)`` then hashes
    and compares the bytes in place, without building the key object.
    """

    def __cinit__(self):
        self._alloc(8)

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.keys != NULL:
            for i in range(self.cap):
                Py_XDECREF(self.keys[i])
                Py_XDECREF(self.vals[i])
        PyMem_Free(self.keys)
        PyMem_Free(self.vals)
        PyMem_Free(self.hashes)

    cdef int _alloc(self, Py_ssize_t cap) except -1:
        self.keys = <PyObject **> PyMem_Calloc(cap, sizeof(PyObject *))
        self.vals = <PyObject **> PyMem_Calloc(cap, sizeof(PyObject *))
        self.hashes = <uint64_t *> PyMem_Calloc(cap, sizeof(uint64_t))
        if self.keys == NULL or self.vals == NULL or self.hashes == NULL:
            PyMem_Free(self.keys)
            PyMem_Free(self.vals)
            PyMem_Free(self.hashes)
            self.keys = NULL
            self.vals = NULL
            self.hashes = NULL
            self.cap = 0
            raise MemoryError()
        self.cap = cap
        self.used = 0
        return 0

    cdef int _grow(self) except -1:
        cdef PyObject **keys = self.keys
        cdef PyObject **vals = self.vals
        cdef uint64_t *hashes = self.hashes
        cdef Py_ssize_t cap = self.cap, used = self.used, i, j, mask
        self._alloc(cap * 2)
        mask = self.cap - 1
        for i in range(cap):
            if keys[i] != NULL:
                j = <Py_ssize_t> (hashes[i] & <uint64_t> mask)
                while self.keys[j] != NULL:
                    j = (j + 1) & mask
                self.keys[j] = keys[i]
                self.vals[j] = vals[i]
                self.hashes[j] = hashes[i]
        self.used = used
        PyMem_Free(keys)
        PyMem_Free(vals)
        PyMem_Free(hashes)
        return 0

    cdef Py_ssize_t find(self, const char *p, Py_ssize_t size, uint32_t g, uint64_t h) noexcept:
        """Slot of key ``p[:size] + g`` (hash ``h``), or -1."""
        cdef Py_ssize_t mask = self.cap - 1
        cdef Py_ssize_t j = <Py_ssize_t> (h & <uint64_t> mask)
        while self.keys[j] != NULL:
            if self.hashes[j] == h and _key_equals(<object> self.keys[j], p, size, g):
                return j
            j = (j + 1) & mask
        return -1

    cdef Py_ssize_t find_key(self, bytes key) noexcept:
        cdef Py_ssize_t size = PyBytes_GET_SIZE(key), j, mask
        cdef uint64_t h
        cdef const unsigned char *p
        if size >= GROUP_ID_BYTES:
            p = <const unsigned char *> PyBytes_AS_STRING(key) + size - GROUP_ID_BYTES
            return self.find(PyBytes_AS_STRING(key), size - GROUP_ID_BYTES,
                             _group_id_at(p), _hash_key(key))
        # A short key (only through the public API): compare whole bytes.
        h = _hash_key(key)
        mask = self.cap - 1
        j = <Py_ssize_t> (h & <uint64_t> mask)
        while self.keys[j] != NULL:
            if self.hashes[j] == h and PyBytes_GET_SIZE(<object> self.keys[j]) == size \
                    and memcmp(PyBytes_AS_STRING(<object> self.keys[j]),
                               PyBytes_AS_STRING(key), size) == 0:
                return j
            j = (j + 1) & mask
        return -1

    cdef PyObject *first_ptr(self, Py_ssize_t j) noexcept:
        """The earliest-inserted block of slot ``j`` (borrowed; NULL for -1)."""
        cdef PyObject *v
        cdef PyObject *k
        cdef PyObject *first
        cdef Py_ssize_t pos = 0
        if j < 0:
            return NULL
        v = self.vals[j]
        if _is_dict_exact(v):
            PyDict_Next(<object> v, &pos, &k, &first)
            return first
        return v

    cdef object first_at(self, Py_ssize_t j):
        """``first_ptr`` as a new reference, or None."""
        cdef PyObject *b = self.first_ptr(j)
        return None if b == NULL else <object> b

    cdef PyObject *get_hg_ptr(self, PyObject *block_hash, uint32_t g) noexcept:
        """``get_hg`` for the hot loops: a borrowed reference, NULL on a miss
        (``block_hash`` must be bytes)."""
        cdef const char *p = _bytes_str(block_hash)
        cdef Py_ssize_t size = _bytes_size(block_hash)
        return self.first_ptr(self.find(p, size, g, _hash_parts(p, size, g)))

    cdef object get_hg(self, object block_hash, uint32_t g):
        """``get_one_block(block_hash + g.to_bytes(4, "big"))`` without
        building the key."""
        cdef const char *p = PyBytes_AS_STRING(block_hash)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(block_hash)
        return self.first_at(self.find(p, size, g, _hash_parts(p, size, g)))

    cdef int insert_key(self, bytes key, KVCacheBlock block) except -1:
        return self._insert(key, self.find_key(key), _hash_key(key), block)

    cdef int insert_hg(self, bytes key, object block_hash, uint32_t g, KVCacheBlock block) except -1:
        """``insert_key`` for ``key == block_hash + g`` (hashed once)."""
        cdef const char *p = PyBytes_AS_STRING(block_hash)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(block_hash)
        cdef uint64_t h = _hash_parts(p, size, g)
        return self._insert(key, self.find(p, size, g, h), h, block)

    cdef int _insert(self, bytes key, Py_ssize_t j, uint64_t h, KVCacheBlock block) except -1:
        """Add ``block`` under ``key`` (hash ``h``), found at slot ``j`` or -1."""
        cdef Py_ssize_t mask
        if j >= 0:
            v = <object> self.vals[j]
            if type(v) is dict:
                (<dict> v)[block._bid] = block
            else:
                d = {(<KVCacheBlock> v)._bid: v, block._bid: block}
                self.vals[j] = <PyObject *> d
                Py_INCREF(d)
                Py_DECREF(v)
            return 0
        if 2 * (self.used + 1) > self.cap:
            self._grow()
        mask = self.cap - 1
        j = <Py_ssize_t> (h & <uint64_t> mask)
        while self.keys[j] != NULL:
            j = (j + 1) & mask
        Py_INCREF(key)
        Py_INCREF(block)
        self.keys[j] = <PyObject *> key
        self.vals[j] = <PyObject *> block
        self.hashes[j] = h
        self.used += 1
        return 0

    cdef void delete_at(self, Py_ssize_t i) noexcept:
        """Empty slot ``i`` and shift later entries of its run back, so that
        probing never needs tombstones."""
        cdef Py_ssize_t mask = self.cap - 1, j = i, home
        cdef PyObject *k = self.keys[i]
        cdef PyObject *v = self.vals[i]
        while True:
            j = (j + 1) & mask
            if self.keys[j] == NULL:
                break
            home = <Py_ssize_t> (self.hashes[j] & <uint64_t> mask)
            # Leave entry j if its home slot lies cyclically in (i, j].
            if (i < j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            self.keys[i] = self.keys[j]
            self.vals[i] = self.vals[j]
            self.hashes[i] = self.hashes[j]
            i = j
        self.keys[i] = NULL
        self.vals[i] = NULL
        self.used -= 1
        Py_DECREF(<object> k)
        Py_DECREF(<object> v)

    cdef object pop_id(self, Py_ssize_t j, object block_id):
        """vLLM's ``pop``: remove ``block_id`` from slot ``j`` (-1: absent)."""
        if j < 0:
            return None
        v = <object> self.vals[j]
        if type(v) is dict:
            block = (<dict> v).pop(block_id, None)
            if not v:
                self.delete_at(j)
            return block
        if (<KVCacheBlock> v)._bid == block_id:
            self.delete_at(j)
            return v
        return None

    cdef bint pop_block(self, bytes key, KVCacheBlock b) except -1:
        """``pop(key, b.block_id) is not None``, without boxing the id in the
        common (single block) case."""
        cdef Py_ssize_t j = self.find_key(key)
        if j < 0:
            return False
        v = <object> self.vals[j]
        if type(v) is dict:
            return self.pop_id(j, b._bid) is not None
        if (<KVCacheBlock> v)._bid == b._bid:
            self.delete_at(j)
            return True
        return False

    cdef bint slot_has_id(self, Py_ssize_t j, int32_t block_id) noexcept:
        """Whether slot ``j`` (-1: absent) holds a block with this id."""
        cdef PyObject *v
        cdef PyObject *k
        cdef PyObject *b
        cdef Py_ssize_t pos = 0
        if j < 0:
            return False
        v = self.vals[j]
        if _is_dict_exact(v):
            while PyDict_Next(<object> v, &pos, &k, &b):
                if (<KVCacheBlock> b)._bid == block_id:
                    return True
            return False
        return (<KVCacheBlock> v)._bid == block_id

    def get_one_block(self, key):
        """The earliest-inserted block cached under ``key``, or ``None``."""
        _check_key(key)
        return self.first_at(self.find_key(key))

    def contain(self, key, block_id):
        """Whether the block ``block_id`` is cached under ``key``."""
        _check_key(key)
        cdef Py_ssize_t j = self.find_key(key)
        if j < 0:
            return False
        v = <object> self.vals[j]
        if type(v) is dict:
            return block_id in <dict> v
        return (<KVCacheBlock> v)._bid == block_id

    @property
    def _cache(self):
        """vLLM's private dict, as a live mapping over this table: key ->
        block, or ``{block_id: block}`` (insertion order) for a shared key.
        Reading, ``pop``, ``del``, ``clear`` and assigning an entry (a block,
        or a non-empty dict of blocks) act on the table, so code that evicts
        entries by hand (vLLM's tests do) works; assigning the attribute
        replaces every entry. ``copy.copy`` gives a plain dict snapshot."""
        return _CacheView(self)

    @_cache.setter
    def _cache(self, entries):
        new = {}
        for key, value in dict(entries).items():
            _check_key(key)
            new[key] = _entry_blocks(value)
        self._clear()
        for key, blocks in new.items():
            for b in blocks:
                self.insert_key(key, b)

    def _snapshot_py(self):
        cdef Py_ssize_t j
        ret = {}
        for j in range(self.cap):
            if self.keys[j] != NULL:
                v = <object> self.vals[j]
                ret[<object> self.keys[j]] = dict(v) if type(v) is dict else v
        return ret

    def _entry(self, key):
        """The entry under ``key`` (KeyError if none), as ``_cache[key]``."""
        _check_key(key)
        cdef Py_ssize_t j = self.find_key(key)
        if j < 0:
            raise KeyError(key)
        return <object> self.vals[j]

    def _set_entry(self, key, value):
        _check_key(key)
        cdef list blocks = _entry_blocks(value)
        self._del_entry(key, False)
        for b in blocks:
            self.insert_key(key, b)

    def _del_entry(self, key, bint must_exist=True):
        _check_key(key)
        cdef Py_ssize_t j = self.find_key(key)
        if j < 0:
            if must_exist:
                raise KeyError(key)
            return
        self.delete_at(j)

    def _clear(self):
        cdef Py_ssize_t j = 0
        while self.used:
            if self.keys[j] != NULL:
                self.delete_at(j)  # shifts later entries back into j
            else:
                j += 1

    def insert(self, key, block):
        """Cache ``block`` under ``key`` (after any block already there)."""
        _check_key(key)
        if not isinstance(block, KVCacheBlock):
            raise TypeError(f"expected a KVCacheBlock, got {type(block).__name__}")
        self.insert_key(key, block)

    def pop(self, key, block_id):
        """Remove and return the block ``block_id`` cached under ``key``, or
        ``None`` (and change nothing)."""
        _check_key(key)
        return self.pop_id(self.find_key(key), block_id)

    def __len__(self):
        return self.used


@cython.final
@cython.no_gc
cdef class BlockHashToBlockMap34(BlockHashToBlockMap):
    """vLLM 0.34's ``BlockHashToBlockMap(blocks)``: the same table, shown as
    0.34 shows its map -- ``_cache`` maps a key to the id of the earliest
    block cached under it, ``_dup_ids`` lists the ids of keys cached by
    several blocks, ``clear()`` empties it in place. ``blocks`` is the list
    ids index into (vLLM: the pool's ``blocks``); a block given to
    ``insert`` must be the one at its id there, or the map would later hand
    out another block under its id (``ValueError``)."""

    def __init__(self, blocks):
        self._block_list = blocks

    cdef object block_of(self, object block_id):
        """The block ``block_id`` names: ``TypeError`` for a non-int,
        ``IndexError`` outside ``[0, len(blocks))`` (a negative id names no
        block, whatever the list's indexing would give)."""
        cdef Py_ssize_t i
        cdef Py_ssize_t n = self._st.n if self._st is not None else len(self._block_list)
        if isinstance(block_id, bool) or not isinstance(block_id, int):
            raise TypeError(f"a block id must be an int, got {type(block_id).__name__}")
        if not 0 <= block_id < n:
            raise IndexError(f"block id {block_id} is out of range [0, {n})")
        i = block_id
        if self._st is None:
            return self._block_list[i]
        return self._st.block(i)

    @property
    def _blocks(self):
        """The list block ids index into (a pool's: its blocks)."""
        if self._st is None:
            return self._block_list
        return [self._st.block(i) for i in range(self._st.n)]

    def insert(self, key, block):
        """Cache ``block`` under ``key`` (after any block already there)."""
        _check_key(key)
        if not isinstance(block, KVCacheBlock):
            raise TypeError(f"expected a KVCacheBlock, got {type(block).__name__}")
        try:
            known = self.block_of((<KVCacheBlock> block)._bid)
        except IndexError:
            known = None
        if known is not block:
            raise ValueError(
                f"block {(<KVCacheBlock> block)._bid} is not the block of that id "
                "in the list this map was built over"
            )
        self.insert_key(key, <KVCacheBlock> block)

    @property
    def _cache(self):
        """vLLM 0.34's private dict, as a live mapping over this table: key
        -> id of the earliest block cached under it. Reading, ``pop``,
        ``del`` and assigning an id (the key then names that block alone)
        act on the table, as vLLM's tests do by hand; ``copy.copy`` gives a
        plain dict. Not tracked by the garbage collector, as 0.34's dict."""
        return _IdCacheView(self)

    @property
    def _dup_ids(self):
        """A snapshot of vLLM 0.34's ``_dup_ids``: key -> ``{block_id: None}``
        in insertion order, for the keys cached by several blocks."""
        cdef Py_ssize_t j
        ret = {}
        for j in range(self.cap):
            if self.keys[j] != NULL and type(<object> self.vals[j]) is dict \
                    and len(<dict> self.vals[j]) > 1:
                ret[<object> self.keys[j]] = dict.fromkeys(<dict> self.vals[j])
        return ret

    def _id_snapshot(self):
        cdef Py_ssize_t j
        ret = {}
        for j in range(self.cap):
            if self.keys[j] != NULL:
                ret[<object> self.keys[j]] = (<KVCacheBlock> self.first_ptr(j))._bid
        return ret

    def clear(self):
        """Forget every key (in place)."""
        self._clear()


@cython.final
@cython.no_gc
cdef class _IdCacheView:
    """``BlockHashToBlockMap34._cache``: see that property."""

    cdef BlockHashToBlockMap34 _map

    def __cinit__(self, BlockHashToBlockMap34 hash_map not None):
        self._map = hash_map

    def __getitem__(self, key):
        block = self._map.get_one_block(key)
        if block is None:
            raise KeyError(key)
        return block.block_id

    def __setitem__(self, key, block_id):
        self._map._set_entry(key, self._map.block_of(block_id))

    def __delitem__(self, key):
        self._map._del_entry(key)

    def __contains__(self, key):
        return PyBytes_Check(key) and self._map.get_one_block(key) is not None

    def get(self, key, default=None):
        block = self._map.get_one_block(key) if PyBytes_Check(key) else None
        return default if block is None else block.block_id

    def pop(self, key, *default):
        if len(default) > 1:
            raise TypeError(f"pop expected at most 2 arguments, got {1 + len(default)}")
        block = self._map.get_one_block(key) if PyBytes_Check(key) else None
        if block is None:
            if default:
                return default[0]
            raise KeyError(key)
        self._map._del_entry(key)
        return block.block_id

    def clear(self):
        self._map._clear()

    def __iter__(self):
        return iter(self._map._id_snapshot())

    def __len__(self):
        return len(self._map)

    def keys(self):
        return self._map._id_snapshot().keys()

    def values(self):
        return self._map._id_snapshot().values()

    def items(self):
        return self._map._id_snapshot().items()

    def copy(self):
        return self._map._id_snapshot()

    def __copy__(self):
        return self._map._id_snapshot()

    def __eq__(self, other):
        if isinstance(other, _IdCacheView):
            other = other.copy()
        return self._map._id_snapshot() == other

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    def __repr__(self):
        return repr(self._map._id_snapshot())


cdef list _entry_blocks(object value):
    """The blocks of a ``_cache`` entry: a block, or a non-empty
    ``{block_id: block}`` dict whose keys are the blocks' ids."""
    if _is_block(value):
        return [value]
    if type(value) is dict and value:
        blocks = list((<dict> value).values())
        for bid, b in (<dict> value).items():
            if not _is_block(b) or (<KVCacheBlock> b)._bid != bid:
                raise ValueError("a _cache entry dict maps each block's id to the block")
        return blocks
    raise TypeError(
        f"a _cache entry is a KVCacheBlock or a non-empty {{block_id: block}} dict, "
        f"got {type(value).__name__}"
    )


cdef inline int _check_key(object key) except -1:
    if not PyBytes_Check(key):
        raise TypeError(f"a hash key must be bytes, got {type(key).__name__}")
    return 0


@cython.no_gc_clear
cdef class PoolCore:
    """The block bookkeeping of a pool; ``kvpool.BlockPool`` subclasses it and
    adds events and metrics. ``PoolCore(num_gpu_blocks, *facade_args)``."""

    # Rules in which vLLM releases differ, one class attribute each: a
    # facade overrides the ones its release needs. They are read once, when
    # a pool is built, into C fields (changing them later has no effect).
    # The twin (_core_py.PoolCore) has the same names and defaults.

    #: 33: the 0.33-style store (several keys per block, partial entries,
    #: token counts, ``block.pool``) and 0.33's free order, eviction and
    #: cross-pool frees (the lines of vLLM 0.24 and later); 15: vLLM 0.15's.
    _kvpool_line = 15
    #: True: ``touch`` adds one to the null block's ``ref_cnt`` and
    #: ``free_blocks`` takes one (it may go below 0; it is never checked or
    #: queued), and on the 0.33-style store another pool's null block is
    #: handed to its pool like its other blocks -- as vLLM does before 0.33.
    #: False: the null block is skipped (vLLM 0.33).
    _kvpool_counts_null = False
    #: Where the 0.33-style ``free_blocks`` puts a block released while
    #: caching is off: "front" (vLLM 0.28 and later: LIFO reuse, for GPU
    #: locality), "back" (0.27.x) or "by_hash" (0.24-0.26: caching is not
    #: looked at; in front unless the block has a hash). With caching on,
    #: a block goes in front iff it has no hash, in every line.
    _kvpool_free_caching_off = "front"
    #: With the 0.33-style store: True, blocks show their pool (``pool``
    #: field and argument, vLLM 0.30 and later: ``KVCacheBlock33``); False,
    #: they do not (vLLM 0.24-0.29: ``KVCacheBlock24``); ``"weak"``, as a
    #: weak reference, with 0.34's block fields and its map over block ids
    #: (vLLM 0.34: ``KVCacheBlock34``, ``BlockHashToBlockMap34``).
    _kvpool_block_pool = True

    def __cinit__(self, num_gpu_blocks, *args, **kwargs):
        cdef Py_ssize_t n, i
        if isinstance(num_gpu_blocks, bool) or not isinstance(num_gpu_blocks, int):
            raise TypeError(
                f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}"
            )
        if not (1 <= num_gpu_blocks <= MAX_BLOCKS):
            raise ValueError(
                f"num_gpu_blocks must be in [1, {MAX_BLOCKS}], got {num_gpu_blocks}"
            )
        n = num_gpu_blocks
        cls = type(self)
        st = _Store(n, False, cls._kvpool_line == 33)
        st.no_pool = st.v33 and not cls._kvpool_block_pool
        st.v34 = st.v33 and cls._kvpool_block_pool == "weak"
        self._count_null = bool(cls._kvpool_counts_null)
        self._free_off = _free_caching_off_rule(cls)
        st.owned = True
        st.pool = <PyObject *> self  # borrowed: cleared in __dealloc__
        # Block 0 is the null block: never in the queue.
        st.flags[0] = _NULL
        for i in range(1, n):
            st.prev[i] = <int32_t> (i - 1)
            st.next[i] = <int32_t> (i + 1)
        if n > 1:
            st.next[n] = 1
            st.prev[1] = <int32_t> n
            st.next[n - 1] = <int32_t> (n + 1)
            st.prev[n + 1] = <int32_t> (n - 1)
        st.num_free = n - 1
        # The null block is handed out from the start; with it created, the
        # free queue's walks can skip their "create missing handles" pass as
        # soon as every other block has been handed out once.
        st.materialise(0, 1)
        self.st = st
        self._queue = _queue_over(st)
        self._map = self._new_map()
        self._blocks = None
        self._by_block = {}
        self._watchers = {}

    def __dealloc__(self):
        # The queue may keep the store alive: its blocks' `pool` must not
        # point at a dead pool.
        if self.st is not None:
            self.st.pool = NULL

    def __init__(self, num_gpu_blocks, *args, **kwargs):
        pass  # everything is done in __cinit__

    @property
    def cached_block_hashes_by_block(self):
        """0.33: ``{block_id: set of hash keys}``, the keys a block is cached
        under besides its ``block_hash`` (partial-block entries)."""
        return self._by_block

    @property
    def _reuse_watchers(self):
        """0.33: ``{block_id: callback}`` of ``unpin_blocks``."""
        return self._watchers

    # The facade's settings live in C fields, so that get_new_blocks and
    # touch can take their fast path (no events, no metrics) without a
    # Python frame or an instance-dict lookup.
    @property
    def enable_caching(self):
        return self._enable_caching

    @enable_caching.setter
    def enable_caching(self, value):
        self._caching = bool(value)
        self._enable_caching = value

    @property
    def enable_kv_cache_events(self):
        return self._enable_events

    @enable_kv_cache_events.setter
    def enable_kv_cache_events(self, value):
        self._events = bool(value)
        self._enable_events = value

    @property
    def metrics_collector(self):
        return self._collector

    @metrics_collector.setter
    def metrics_collector(self, value):
        self._collector = value

    @property
    def hash_block_size(self):
        return self._hash_block_size

    @hash_block_size.setter
    def hash_block_size(self, value):
        self._hash_block_size = value

    def cache_full_blocks(self, request, blocks, num_cached_blocks,
                          num_full_blocks, block_size, kv_cache_group_id):
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` under the
        request's block hashes (null blocks skipped), for
        ``kv_cache_group_id``. With events on, queues one ``BlockStored``."""
        if self._events or block_size != self._hash_block_size:
            return self._cache_full_blocks_py(
                request, blocks, num_cached_blocks, num_full_blocks,
                block_size, kv_cache_group_id,
            )
        if num_cached_blocks >= num_full_blocks:
            return
        self._cache_blocks(blocks, num_cached_blocks, num_full_blocks,
                           request.block_hashes, kv_cache_group_id, None)

    def get_new_blocks(self, num_blocks):
        """Pop ``num_blocks`` blocks from the head of the free queue (least
        recently freed first), evicting their cached hashes when caching is
        on, each with ``ref_cnt == 1``. Does not look in the cache."""
        if self._events or self._collector or self._watchers:
            return self._get_new_blocks_with_hooks(num_blocks)
        return _allocate(self.st, num_blocks, self._caching, self._map, None, self._by_block)

    cdef list _take_new(self, Py_ssize_t num_blocks, list removed):
        """get_new_blocks without the hooks, the evicted keys appended to
        ``removed`` (kvpool's compiled manager, with events on and no
        metrics or reuse watchers, then queues their BlockRemoved)."""
        return _allocate(self.st, num_blocks, self._caching, self._map, removed, self._by_block)

    def _removed_events(self, cls, list keys not None, medium, bint with_group, bint use_int):
        """The facades' ``BlockRemoved`` events for evicted ``keys``, in order,
        without a Python call per key: one ``cls(block_hashes=[h],
        medium=medium)`` per key, with ``group_idx=`` the key's group id
        (its last four bytes, unsigned big-endian) when ``with_group``. ``h``
        is the key's block hash (the key less those four bytes) as
        kvpool.hashing.convert_block_hashes gives it: the low 64 bits of its
        big-endian value (its last eight bytes) when ``use_int``, else the
        bytes. Every key must be bytes (checked before any event is built)."""
        cdef Py_ssize_t i, size, hsize, n = PyList_GET_SIZE(keys)
        cdef const unsigned char *c
        cdef PyObject *args[3]   # borrowed: each is held by a local below
        cdef object h, group = None, hashes
        for i in range(n):
            if not _is_bytes(PyList_GET_ITEM(keys, i)):
                raise TypeError(
                    f"an evicted key must be bytes, got {type(keys[i]).__name__}")
        kwnames = _REMOVED_GROUP_KW if with_group else _REMOVED_KW
        out = PyList_New(0)
        for i in range(n):
            key = <object> PyList_GET_ITEM(keys, i)
            c = <const unsigned char *> PyBytes_AS_STRING(key)
            size = PyBytes_GET_SIZE(key)
            hsize = size - GROUP_ID_BYTES if size > GROUP_ID_BYTES else 0
            if use_int:
                h = PyLong_FromUnsignedLongLong(_be_tail(c, hsize, 8))
            else:
                h = PyBytes_FromStringAndSize(<const char *> c, hsize)
            hashes = [h]
            args[0] = <PyObject *> hashes
            args[1] = <PyObject *> medium
            if with_group:
                group = PyLong_FromUnsignedLong(<unsigned long> _be_tail(c, size, GROUP_ID_BYTES))
                args[2] = <PyObject *> group
            PyList_Append(out, PyObject_Vectorcall(cls, args, 0, kwnames))
        return out

    def touch(self, blocks):
        """Take a reference on each block of a prefix-cache hit; a free
        block leaves the free queue (O(1))."""
        seq = PySequence_Fast(blocks, "blocks must be a sequence of KVCacheBlock")
        self._touch(seq)
        if self._collector:
            self._report_touch(seq)  # the same items, even if `blocks` was an iterator

    @property
    def num_gpu_blocks(self):
        return self.st.n

    @property
    def blocks(self):
        """All blocks, ``blocks[i].block_id == i`` (created on first access)."""
        cdef _Store st = self.st
        cdef Py_ssize_t i
        if self._blocks is None:
            st.materialise(0, st.n)
            blocks = PyList_New(st.n)
            for i in range(st.n):
                o = <object> st.objs[i]
                Py_INCREF(o)
                PyList_SET_ITEM(blocks, i, o)
            # Its items are handles the cycle collector does not track, so the
            # list cannot be part of a cycle either: untracking it keeps a
            # million-entry list out of every gc.collect().
            PyObject_GC_UnTrack(<PyObject *> blocks)
            self._blocks = blocks
        return self._blocks

    @property
    def free_block_queue(self):
        return self._queue

    @property
    def cached_block_hash_to_block(self):
        return self._map

    @property
    def null_block(self):
        return self.st.block(0)

    def get_num_free_blocks(self):
        """Number of blocks in the free queue."""
        return self.st.num_free

    def get_usage(self):
        """KV-cache usage in [0, 1]; the null block is not counted."""
        cdef Py_ssize_t total = self.st.n - 1
        if total == 0:
            return 0
        return 1.0 - (<double> self.st.num_free / <double> total)

    def get_cached_block(self, block_hash, kv_cache_group_ids):
        """The cached block for ``block_hash`` in each group, or ``None`` if
        any group misses (all or nothing)."""
        _check_hash(block_hash)
        cdef BlockHashToBlockMap cache = self._map
        cdef Py_ssize_t ng, j
        cdef PyObject *bp
        cdef list ret
        if PyList_CheckExact(kv_cache_group_ids):
            # The engine's case: a short list of ids, indexed without an
            # iterator, into a list of the right size.
            ng = PyList_GET_SIZE(kv_cache_group_ids)
            ret = PyList_New(ng)
            for j in range(ng):
                bp = cache.get_hg_ptr(<PyObject *> block_hash, _check_group(
                    <object> PyList_GET_ITEM(kv_cache_group_ids, j)))
                if bp == NULL:
                    Py_SET_SIZE(ret, j)  # slots past the size stay NULL
                    return None
                Py_INCREF(<object> bp)
                PyList_SET_ITEM(ret, j, <object> bp)
            return ret
        ret = []
        for g in kv_cache_group_ids:
            b = cache.get_hg(block_hash, _check_group(g))
            if b is None:
                return None
            PyList_Append(ret, b)
        return ret

    def find_longest_cache_hit(self, block_hashes, kv_cache_group_ids, max_blocks=None):
        """Per group, the blocks of the longest prefix of ``block_hashes``
        cached in every group (at most ``max_blocks``), in one call. Same
        result as calling ``get_cached_block`` per hash until the first miss."""
        cdef object groups = PySequence_Fast(kv_cache_group_ids, "kv_cache_group_ids must be a sequence")
        cdef object hashes = PySequence_Fast(block_hashes, "block_hashes must be a sequence")
        cdef Py_ssize_t ng = PySequence_Fast_GET_SIZE(groups)
        cdef Py_ssize_t limit = PySequence_Fast_GET_SIZE(hashes), j, g
        cdef BlockHashToBlockMap cache = self._map
        cdef uint32_t *gids
        cdef uint32_t gid0
        cdef PyObject *bp
        cdef PyObject **items
        if max_blocks is not None:
            limit = min(limit, _check_count(max_blocks, "max_blocks"))
        if ng == 0:
            return []
        if ng == 1:
            # The common case: one group, one result list, no scratch array.
            gid0 = _check_group(<object> PySequence_Fast_GET_ITEM(groups, 0))
            # Sized for a full hit and shortened in place at the first miss
            # (slots past the size are NULL, which a list tolerates).
            hit = PyList_New(limit)
            items = PySequence_Fast_ITEMS(hashes)
            for j in range(limit):
                if not _is_bytes(items[j]):
                    Py_SET_SIZE(hit, j)
                    _check_hash(<object> items[j])  # raises TypeError
                bp = cache.get_hg_ptr(items[j], gid0)
                if bp == NULL:
                    Py_SET_SIZE(hit, j)
                    break
                Py_INCREF(<object> bp)
                PyList_SET_ITEM(hit, j, <object> bp)
            return [hit]
        gids = <uint32_t *> PyMem_Malloc(ng * sizeof(uint32_t))
        if gids == NULL:
            raise MemoryError()
        try:
            for g in range(ng):
                gids[g] = _check_group(<object> PySequence_Fast_GET_ITEM(groups, g))
            result = [[] for g in range(ng)]
            row = [None] * ng
            for j in range(limit):
                h = _check_hash(<object> PySequence_Fast_GET_ITEM(hashes, j))
                for g in range(ng):
                    b = cache.get_hg(h, gids[g])
                    if b is None:
                        return result
                    row[g] = b
                for g in range(ng):
                    PyList_Append(<list> result[g], row[g])
            return result
        finally:
            PyMem_Free(gids)

    def free_blocks(self, ordered_blocks):
        """Drop one reference from each block; blocks reaching 0 go to the
        free queue's tail in the given order (callers pass a request's blocks
        in reverse, so the chain's tail is evicted before its shared prefix).
        Null blocks are skipped."""
        self._free_seq(ordered_blocks, False)

    def _free_blocks34(self, ordered_blocks, evict_first=False):
        """vLLM 0.34's ``free_blocks(ordered_blocks, evict_first=False)``
        (bound as ``free_blocks`` by the 0.34 facade): with ``evict_first``,
        released cached blocks go to the queue's front too (their contents
        are held by another tier), and other pools' blocks are handed on
        with the flag."""
        self._free_seq(ordered_blocks, bool(evict_first))

    cdef int _free_seq(self, object ordered_blocks, bint evict_first) except -1:
        cdef object seq
        cdef Py_ssize_t idx
        cdef bint v33 = self.st.v33
        if type(ordered_blocks) is _ListReverseIterator:
            # `reversed(req_blocks)`, what the engine passes: walk the list
            # backwards in place instead of copying it. The iterator's list
            # and position come from its __reduce__ (public API); it is then
            # exhausted, as copying it would have.
            state = ordered_blocks.__reduce__()
            ordered_blocks.__setstate__(-1)
            if len(state) != 3:
                return 0  # already exhausted
            seq = state[1][0]
            idx = state[2]
            if type(seq) is not list or idx < 0 or idx >= PyList_GET_SIZE(seq):
                return 0  # as iterating it would have ended at once
            if v33:
                _free33(self, PySequence_Fast_ITEMS(seq) + idx, idx + 1, -1, evict_first)
            else:
                _free(self.st, PySequence_Fast_ITEMS(seq) + idx, idx + 1, -1, self._count_null)
            return 0
        seq = PySequence_Fast(ordered_blocks, "ordered_blocks must be iterable")
        if v33:
            _free33(self, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq), 1,
                    evict_first)
        else:
            _free(self.st, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq), 1,
                  self._count_null)
        return 0

    def _allocate(self, num_blocks, bint evict, list removed):
        return _allocate(self.st, num_blocks, evict, self._map, removed, self._by_block)

    def _evict_block(self, block, list removed):
        cdef _Store st = self.st
        cdef Py_ssize_t i = _index_in(st, block)
        return _evict_one(st, self._map, i, removed, self._by_block)

    def _claim(self, blocks, bint evict, list removed):
        """0.33's get_new_blocks after the pop (and the reuse watchers):
        each block, just popped from the queue, loses its hash keys if
        ``evict`` (the removed keys go to ``removed``) and gets
        ``ref_cnt == 1``. All blocks are checked first."""
        cdef _Store st = self.st
        cdef object seq = PySequence_Fast(blocks, "blocks must be a sequence of KVCacheBlock")
        cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), j, i
        cdef uint32_t ep = st.new_epoch()
        for j in range(n):
            o = <object> PySequence_Fast_GET_ITEM(seq, j)
            i = _index_in(st, o)
            if st.prev[i] >= 0 or st.ref_cnt[i] != 0 or st.flags[i] & _NULL:
                raise ValueError(f"block {(<KVCacheBlock> o)._bid} is not a block just "
                                 "taken from the free queue (it is queued, in use or null)")
            if st.stamp[i] == ep:
                raise ValueError(f"block {(<KVCacheBlock> o)._bid} appears twice")
            st.stamp[i] = ep
        for j in range(n):
            i = (<KVCacheBlock> PySequence_Fast_GET_ITEM(seq, j))._idx
            if evict:
                _evict_one(st, self._map, i, removed, self._by_block)
            st.ref_cnt[i] = 1

    def _unpin(self, blocks):
        """0.33's unpin_blocks without the watchers: drop one reference per
        appearance of each block; those reaching 0 go to the queue's tail
        (whatever their hash), in the order of the appearance that released
        them. The null block and more appearances than references are
        refused; a call that raises has changed nothing."""
        cdef _Store st = self.st
        cdef object seq = PySequence_Fast(blocks, "blocks must be a sequence of KVCacheBlock")
        cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), j, i, done = 0
        cdef uint32_t ep
        for j in range(n):
            i = _index_in(st, <object> PySequence_Fast_GET_ITEM(seq, j))
            if st.flags[i] & _NULL:
                raise ValueError("the null block cannot be unpinned")
        while done < n:
            i = (<KVCacheBlock> PySequence_Fast_GET_ITEM(seq, done))._idx
            if st.ref_cnt[i] <= 0:
                for j in range(done):
                    st.ref_cnt[(<KVCacheBlock> PySequence_Fast_GET_ITEM(seq, j))._idx] += 1
                raise ValueError(
                    f"block {(<KVCacheBlock> PySequence_Fast_GET_ITEM(seq, done))._bid} is "
                    "unpinned with ref_cnt 0 (more appearances than references?)")
            st.ref_cnt[i] -= 1
            done += 1
        released = []
        ep = st.new_epoch()
        for j in range(n - 1, -1, -1):
            o = <object> PySequence_Fast_GET_ITEM(seq, j)
            i = (<KVCacheBlock> o)._idx
            if st.ref_cnt[i] == 0 and st.prev[i] < 0 and st.stamp[i] != ep:
                st.stamp[i] = ep
                released.append(o)
        released.reverse()
        _link_n(st, released, False)  # cannot fail: checked above
        return seq

    def _evict_block_ids(self, list block_ids, list removed):
        cdef _Store st = self.st
        cdef BlockHashToBlockMap cache = self._map
        for block_id in block_ids:
            if not isinstance(block_id, int):
                raise TypeError(f"block ids must be ints, got {type(block_id).__name__}")
            if not (0 <= block_id < st.n):
                raise ValueError(
                    f"Invalid block_id {block_id}: the pool has blocks 0..{st.n - 1}"
                )
        for block_id in block_ids:
            _evict_one(st, cache, block_id, removed, self._by_block)

    def _touch(self, blocks):
        cdef object seq = PySequence_Fast(blocks, "blocks must be a sequence of KVCacheBlock")
        cdef _Store st = self.st
        cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), j, i
        for j in range(n):
            i = _index_in(st, <object> PySequence_Fast_GET_ITEM(seq, j))
            if st.ref_cnt[i] > INT32_MAX - n:
                raise ValueError(f"block {i}: ref_cnt would overflow")
        for j in range(n):
            i = (<KVCacheBlock> PySequence_Fast_GET_ITEM(seq, j))._idx
            if st.flags[i] & _NULL:
                if self._count_null:
                    st.ref_cnt[i] += 1  # never queued (checked above for overflow)
                continue
            if st.prev[i] >= 0:
                st.unlink(i)
            st.ref_cnt[i] += 1

    def _cache_blocks(self, blocks, start, stop, block_hashes, group_id, list stored):
        cdef _Store st = self.st
        cdef Py_ssize_t off, n, j, i, bad = -1
        cdef uint32_t gid, ep
        if start >= stop:
            return
        if start < 0:
            raise ValueError(f"num_cached_blocks must be >= 0, got {start}")
        gid = _check_group(group_id)
        if len(block_hashes) < stop:
            raise ValueError(
                f"the request has {len(block_hashes)} block hashes, "
                f"{stop} are needed to cache blocks up to {stop}"
            )
        seq = PySequence_Fast(blocks[start:stop], "blocks must be a sequence")
        n = PySequence_Fast_GET_SIZE(seq)
        # The hashes as a list indexed from `off`: the request's own list as
        # is; anything else (a BlockHashListWithBlockSize builds hashes on
        # access) sliced once into a new list.
        if PyList_CheckExact(block_hashes):
            hl = block_hashes
            off = start
        else:
            hl = list(block_hashes[start:stop])
            off = 0
        if PyList_GET_SIZE(hl) < off + n:
            raise ValueError(f"block_hashes yields fewer than {stop} hashes")
        for j in range(n):
            i = _index_in(st, <object> PySequence_Fast_GET_ITEM(seq, j))
            if st.flags[i] & _NULL:
                continue
            if st.hash[i] != NULL:
                raise RuntimeError(f"block {i} already has a hash")
            _check_hash(<object> PyList_GET_ITEM(hl, off + j))
        # Then duplicates, with this call's stamp (flags do not change
        # between these passes).
        ep = st.new_epoch()
        for j in range(n):
            i = (<KVCacheBlock> PySequence_Fast_GET_ITEM(seq, j))._idx
            if st.flags[i] & _NULL:
                continue
            if st.stamp[i] == ep:
                bad = j
                break
            st.stamp[i] = ep
        if bad >= 0:
            raise ValueError(
                f"block {(<KVCacheBlock> PySequence_Fast_GET_ITEM(seq, bad))._bid} "
                "appears twice"
            )
        cdef BlockHashToBlockMap cache = self._map
        cdef PyObject *h
        for j in range(n):
            b = <KVCacheBlock> PySequence_Fast_GET_ITEM(seq, j)
            if st.flags[b._idx] & _NULL:
                continue
            h = PyList_GET_ITEM(hl, off + j)
            key = _make_key(<object> h, gid)
            cache.insert_hg(key, <object> h, gid, b)
            Py_INCREF(key)
            st.hash[b._idx] = <PyObject *> key
            if stored is not None:
                PyList_Append(stored, <object> h)

    def _cache_blocks33(self, blocks, start, stop, block_hashes, Py_ssize_t scale,
                        group_id, block_size, block_mask, list removed, list stored):
        """vLLM 0.33's cache_full_blocks without the events (``_cache_run33``,
        which kvpool's compiled manager calls directly)."""
        self._cache_run33(blocks, start, stop, block_hashes, scale, group_id, block_size,
                          block_mask, removed, stored)

    cdef int _cache_run33(self, blocks, start, stop, block_hashes, Py_ssize_t scale,
                          group_id, block_size, block_mask, list removed,
                          list stored) except -1:
        """vLLM 0.33's cache_full_blocks without the events: cache
        ``blocks[start:stop]`` (null and masked-out blocks skipped), block
        ``start + j`` under hash ``start + j`` of the ``block_size`` view of
        ``block_hashes`` -- with ``scale > 1`` the raw list's hash at index
        ``(start + j + 1) * scale - 1`` -- covering ``(start + j + 1) *
        block_size`` tokens. A block that already has a hash covering fewer
        tokens is promoted: its keys are removed first (into ``removed``).
        The bare hashes cached go to ``stored``. All is checked first."""
        cdef _Store st = self.st
        cdef Py_ssize_t off, n, j, i, hidx, bs
        cdef uint32_t gid, ep
        cdef int64_t nt
        cdef list mask = None
        if start >= stop:
            return 0
        if start < 0:
            raise ValueError(f"num_cached_blocks must be >= 0, got {start}")
        gid = _check_group(group_id)
        bs = _check_count(block_size, "block_size")
        if bs == 0:
            raise ValueError("block_size must be >= 1")
        if scale < 1:
            raise ValueError(f"scale must be >= 1, got {scale}")
        seq = PySequence_Fast(blocks[start:stop], "blocks must be a sequence")
        n = PySequence_Fast_GET_SIZE(seq)
        if block_mask is not None:
            mask = [bool(x) for x in block_mask]
            if len(mask) != n:
                raise ValueError(
                    f"block_mask has {len(mask)} entries for {n} new full blocks"
                )
        if PyList_CheckExact(block_hashes):
            hl = block_hashes
            off = start
        else:
            if scale != 1:
                raise TypeError("block_hashes must be a list when scale > 1")
            hl = list(block_hashes[start:stop])
            off = 0
        if PyList_GET_SIZE(hl) // scale < off + n:
            raise ValueError(
                f"the request has {PyList_GET_SIZE(hl) // scale} block hashes at this "
                f"block size, {start + n} are needed to cache blocks up to {start + n}"
            )
        ep = st.new_epoch()
        for j in range(n):
            o = <object> PySequence_Fast_GET_ITEM(seq, j)
            i = _index_in(st, o)
            if st.flags[i] & _NULL or (mask is not None and not mask[j]):
                continue
            nt = <int64_t> (start + j + 1) * bs
            if st.hash[i] != NULL and (st.ntok[i] == NTOK_NONE or st.ntok[i] >= nt):
                raise RuntimeError(
                    f"block {(<KVCacheBlock> o)._bid} already has a hash covering "
                    f"{self_ntok(st, i)} tokens; only a partial block covering fewer "
                    f"than {nt} can be promoted"
                )
            _check_hash(<object> PyList_GET_ITEM(hl, (off + j + 1) * scale - 1))
            if st.stamp[i] == ep:
                raise ValueError(f"block {(<KVCacheBlock> o)._bid} appears twice")
            st.stamp[i] = ep
        cdef BlockHashToBlockMap cache = self._map
        cdef PyObject *h
        cdef const char *p
        cdef Py_ssize_t size, slot
        cdef uint64_t hv
        for j in range(n):
            b = <KVCacheBlock> PySequence_Fast_GET_ITEM(seq, j)
            i = b._idx
            if st.flags[i] & _NULL or (mask is not None and not mask[j]):
                continue
            if st.hash[i] != NULL:  # partial -> full promotion
                _evict33(st, cache, i, removed, self._by_block)
            h = PyList_GET_ITEM(hl, (off + j + 1) * scale - 1)
            p = _bytes_str(h)
            size = _bytes_size(h)
            hv = _hash_parts(p, size, gid)
            slot = cache.find(p, size, gid, hv)
            if not cache.slot_has_id(slot, b._bid):
                key = _make_key(<object> h, gid)
                cache._insert(key, slot, hv, b)
                Py_INCREF(key)
                st.hash[i] = <PyObject *> key
                st.ntok[i] = <int64_t> (start + j + 1) * bs
            if stored is not None:
                PyList_Append(stored, <object> h)
        return 0

    cdef BlockHashToBlockMap _new_map(self):
        cdef BlockHashToBlockMap34 m
        if not self.st.v34:
            return BlockHashToBlockMap()
        m = BlockHashToBlockMap34.__new__(BlockHashToBlockMap34)
        m._st = self.st
        return m

    def _reset_cache(self):
        """Forget every hash key (a new, empty map); only when no block but
        the null block is in use."""
        if self.st.n - self.st.num_free != 1:
            return False
        self._clear_map()
        self._reset_hashes()
        return True

    def _clear_map(self):
        """Empty the map: a new one, as 0.33's reset does before it fires
        the reuse watchers (it resets the blocks' hashes after); 0.34 clears
        its map in place (a new one would miss vLLM's startup gc.freeze())."""
        if self.st.v34:
            self._map._clear()
        else:
            self._map = BlockHashToBlockMap()

    def _reset_hashes(self):
        cdef _Store st = self.st
        cdef Py_ssize_t i
        cdef PyObject *h
        for i in range(st.n + 2):
            h = st.hash[i]
            st.hash[i] = NULL
            if st.ntok != NULL:
                st.ntok[i] = NTOK_NONE
            Py_XDECREF(h)


cdef object _ListReverseIterator = type(reversed([]))
from weakref import ref as _weakref


cdef object self_ntok(_Store st, Py_ssize_t i):
    return None if st.ntok[i] == NTOK_NONE else st.ntok[i]


cdef int _free(_Store st, PyObject **items, Py_ssize_t n, Py_ssize_t stride,
               bint count_null) except -1:
    """free_blocks over ``items[0], items[stride], ...`` (``n`` of them), in
    one pass: check, decrement, and link the blocks reaching zero after the
    current last block (the tail is closed at the end). On a bad block
    everything done so far is undone. ``count_null``: the null block's
    ``ref_cnt`` is decremented too (rule ``_kvpool_counts_null``)."""
    cdef Py_ssize_t j, i, done = 0, linked = 0
    cdef int32_t tail = <int32_t> (st.n + 1)
    cdef int32_t last0 = st.prev[tail], last = last0, k, nx
    cdef uint32_t ep = st.new_epoch()
    cdef str problem = None
    while done < n:
        i = _index_in_or_none(st, <object> items[done * stride])
        if i < 0:
            i = _adopt(st, <object> items[done * stride])
        if i < 0:
            problem = "foreign"
            break
        if not (st.flags[i] & _NULL):
            if st.stamp[i] == ep:
                problem = "twice"
                break
            if st.ref_cnt[i] <= 0:
                problem = "zero"
                break
            st.stamp[i] = ep
            st.ref_cnt[i] -= 1
            if st.ref_cnt[i] == 0 and st.prev[i] < 0:
                st.next[last] = <int32_t> i
                st.prev[i] = last
                last = <int32_t> i
                linked += 1
        elif count_null:
            if st.ref_cnt[i] == NULL_REF_CNT_MIN:
                problem = "underflow"
                break
            st.ref_cnt[i] -= 1
        done += 1
    if problem is not None:
        k = st.next[last0]
        for j in range(linked):
            nx = st.next[k]
            st.prev[k] = -1
            st.next[k] = -1
            k = nx
        st.next[last0] = tail
        for j in range(done):
            i = (<KVCacheBlock> items[j * stride])._idx
            if count_null or not (st.flags[i] & _NULL):
                st.ref_cnt[i] += 1
        _raise_free_error(st, <object> items[done * stride], problem)
    st.next[last] = tail
    st.prev[tail] = last
    st.num_free += linked
    return 0


cdef inline Py_ssize_t _index_in_or_none(_Store st, object o):
    """Like _index_in, but -1 instead of raising (for check-then-undo loops)."""
    cdef KVCacheBlock b
    if not _is_block(o):
        return -1
    b = <KVCacheBlock> o
    # Its store's, and not a sentinel (n, n + 1; adopted blocks sit after
    # them): one unsigned compare.
    if b._st != <PyObject *> st or <size_t> (b._idx - st.n) < 2:
        return -1
    return b._idx


cdef int _raise_free_error(_Store st, object o, str problem) except -1:
    if problem == "foreign":
        _index_in(st, o)
    cdef KVCacheBlock b = <KVCacheBlock> o
    if problem == "twice":
        raise ValueError(f"block {b._bid} appears twice in one free_blocks call")
    if problem == "underflow":
        raise ValueError(f"the null block's ref_cnt would go below {NULL_REF_CNT_MIN}")
    raise ValueError(f"block {b._bid} is freed with ref_cnt 0 (double free?)")


cdef inline bint _evict_one(_Store st, BlockHashToBlockMap cache, Py_ssize_t i,
                            list removed, dict by_block=None) except -1:
    """Drop block ``i``'s hash from ``cache`` and from the block; the key goes
    to ``removed``. False (hash kept, as vLLM 0.15) when the map does not hold
    the block under it. A block without a handle cannot be in the map."""
    if st.v33:
        return _evict33(st, cache, i, removed, by_block)
    cdef PyObject *h = st.hash[i]
    if h == NULL or st.objs[i] == NULL:
        return False
    if not cache.pop_block(<bytes> h, <KVCacheBlock> st.objs[i]):
        return False
    st.hash[i] = NULL
    if removed is not None:
        PyList_Append(removed, <object> h)
    Py_DECREF(<object> h)
    return True


cdef bint _evict33(_Store st, BlockHashToBlockMap cache, Py_ssize_t i,
                   list removed, dict by_block) except -1:
    """vLLM 0.33's eviction of block ``i``: every key it is cached under (its
    ``block_hash`` first, then its further keys) is popped from ``cache``;
    the keys actually removed go to ``removed``; the block's hash and token
    count are reset whenever it had a key. True if any key was removed."""
    cdef PyObject *h = st.hash[i]
    cdef object extra = None, bid = None
    cdef bint any_removed = False
    cdef KVCacheBlock b
    if by_block:
        bid = (<KVCacheBlock> st.objs[i])._bid if st.objs[i] != NULL else i
        extra = by_block.get(bid)
        if extra is not None:
            extra = tuple(extra)  # may raise: nothing has changed yet
            del by_block[bid]
    if h == NULL and not extra:
        return False
    b = <KVCacheBlock> st.objs[i] if st.objs[i] != NULL else None
    if h != NULL:
        if b is not None and cache.pop_block(<bytes> h, b):
            any_removed = True
            if removed is not None:
                PyList_Append(removed, <object> h)
    if extra:
        for key in extra:
            # A key that is not bytes cannot be in the map (vLLM's dict
            # pop would find nothing either).
            if b is not None and PyBytes_Check(key) and cache.pop_block(<bytes> key, b):
                any_removed = True
                if removed is not None:
                    PyList_Append(removed, key)
    st.hash[i] = NULL
    st.ntok[i] = NTOK_NONE
    Py_XDECREF(h)
    return any_removed


cdef int _free33(PoolCore pool, PyObject **items, Py_ssize_t n, Py_ssize_t stride,
                 bint evict_first=False) except -1:
    """vLLM 0.33's free_blocks over ``items[0], items[stride], ...``: null
    blocks are skipped (rule ``_kvpool_counts_null``: this pool's loses a
    reference, another pool's is handed to that pool); blocks of another pool are handed to that pool's
    ``free_blocks`` afterwards (grouped by pool, in order of appearance);
    this pool's blocks lose one reference per appearance (a block may appear
    as often as it holds references: vLLM frees the copy-on-write sources of
    several requests in one call), and those reaching 0 go to the queue's
    head if they have no hash (or caching is off) -- they can never be a
    prefix hit, so they are reused first -- else to its tail (LRU), in the
    order of the appearance that released them. A call that raises has
    changed nothing. ``evict_first`` (vLLM 0.34): every released block goes
    to the head, and other pools get the flag too; a block whose pool is
    gone (vLLM 0.34's blocks hold it weakly) is skipped, as vLLM skips it."""
    cdef _Store st = pool.st
    cdef Py_ssize_t j, i, done = 0
    cdef bint count_null = pool._count_null
    # Released blocks go in front if they have no hash or, unless ordered
    # `by_hash` (caching on, or rule "by_hash"), all of them; rule "back"
    # then links that run at the tail instead (outside the loop, which keeps
    # its one compare).
    cdef bint by_hash = (pool._caching or pool._free_off == _FREE_OFF_BY_HASH) \
        and not evict_first
    cdef bint first_to_back = not by_hash and pool._free_off == _FREE_OFF_BACK \
        and not evict_first
    cdef int32_t head = <int32_t> st.n, tail = <int32_t> (st.n + 1)
    cdef int32_t f_first = -1, f_last = -1, l_first = -1, l_last = -1, p
    cdef Py_ssize_t nfirst = 0, nlast = 0
    cdef dict others = None
    cdef PyObject *o
    cdef object bad = None
    # 1. Check and decrement in one pass; on a bad block, undo.
    while done < n:
        o = items[done * stride]
        i = _index_in_or_none(st, <object> o)
        if i < 0:
            i = _adopt(st, <object> o)  # vLLM: a block without a pool is this pool's
        if i < 0:
            if count_null or not _null_elsewhere(<object> o):
                other = _pool_of(<object> o)
                if other is None or other is pool:
                    bad = <object> o  # not this pool's block
                    break
                if other is _POOL_GONE:
                    done += 1
                    continue
                if others is None:
                    others = {}
                group = others.get(other)
                if group is None:
                    others[other] = group = []
                PyList_Append(group, <object> o)
        elif not (st.flags[i] & _NULL):
            if st.ref_cnt[i] <= 0:
                bad = <object> o
                break
            st.ref_cnt[i] -= 1
        elif count_null:
            if st.ref_cnt[i] == NULL_REF_CNT_MIN:
                bad = <object> o
                break
            st.ref_cnt[i] -= 1
        done += 1
    if bad is not None:
        for j in range(done):
            i = _index_in_or_none(st, <object> items[j * stride])
            if i >= 0 and (count_null or not (st.flags[i] & _NULL)):
                st.ref_cnt[i] += 1
        if _index_in_or_none(st, bad) < 0:
            _index_in(st, bad)  # raises: not this pool's block
        if st.flags[(<KVCacheBlock> bad)._idx] & _NULL:
            raise ValueError(f"the null block's ref_cnt would go below {NULL_REF_CNT_MIN}")
        raise ValueError(f"block {(<KVCacheBlock> bad)._bid} is freed with ref_cnt 0 "
                         "(double free, or more appearances than references?)")
    # 2. Link the released blocks at their last appearance: walk backwards,
    # growing two detached runs at their fronts ("first" goes after the
    # head, "last" before the tail); a linked block has prev >= 0, so its
    # earlier appearances are passed over, and so is a block that was
    # queued already (its ref_cnt written from outside).
    for j in range(n - 1, -1, -1):
        i = _index_in_or_none(st, <object> items[j * stride])
        if i < 0 or st.flags[i] & _NULL or st.ref_cnt[i] != 0 or st.prev[i] >= 0:
            continue
        if st.hash[i] == NULL or not by_hash:
            if nfirst:
                st.prev[f_first] = <int32_t> i
                st.next[i] = f_first
            else:
                f_last = <int32_t> i
            f_first = <int32_t> i
            st.prev[i] = head  # provisional; also marks it linked
            nfirst += 1
        else:
            if nlast:
                st.prev[l_first] = <int32_t> i
                st.next[i] = l_first
            else:
                l_last = <int32_t> i
            l_first = <int32_t> i
            st.prev[i] = tail
            nlast += 1
    if nlast:
        p = st.prev[tail]
        st.next[p] = l_first
        st.prev[l_first] = p
        st.next[l_last] = tail
        st.prev[tail] = l_last
    if nfirst and first_to_back:
        p = st.prev[tail]
        st.next[p] = f_first
        st.prev[f_first] = p
        st.next[f_last] = tail
        st.prev[tail] = f_last
    elif nfirst:
        p = st.next[head]
        st.next[head] = f_first
        st.prev[f_first] = head
        st.next[f_last] = p
        st.prev[p] = f_last
    st.num_free += nfirst + nlast
    if others is not None:
        for other, group in others.items():
            if evict_first:
                other.free_blocks(group, evict_first=True)
            else:
                other.free_blocks(group)
    return 0


cdef inline bint _null_elsewhere(object o) except -1:
    """A null block not of this pool: skipped, as vLLM skips every null block
    before it looks at the block's pool."""
    if _is_block(o):
        if (<KVCacheBlock> o)._st == NULL:
            raise RuntimeError("KVCacheBlock was not initialised")
        return (<_Store> (<KVCacheBlock> o)._st).flags[(<KVCacheBlock> o)._idx] & _NULL
    return bool(getattr(o, "is_null", False))


cdef object _store_pool(_Store st):
    """The pool a store's blocks belong to, or None."""
    if st.pool != NULL:
        return <object> st.pool
    if st.pool_wr is not None:
        return st.pool_wr()
    return None


# _pool_of's answer for a vLLM 0.34 block whose pool was collected.
cdef object _POOL_GONE = object()


cdef object _pool_of(object o):
    """The pool of a block of another pool: a kvpool block's pool, or the
    ``pool`` attribute of a vLLM block (dereferenced if it is a weak
    reference, as 0.34's: ``_POOL_GONE`` if that pool is gone); None if it
    has none."""
    cdef _Store st
    if _is_block(o):
        st = <_Store> (<KVCacheBlock> o)._st
        owner = _store_pool(st)
        if owner is None and st.v34 and not st.private:
            return _POOL_GONE  # a 0.34 block outliving its pool, as vLLM's
        return owner
    if not hasattr(o, "block_id"):
        raise TypeError(f"expected a KVCacheBlock, got {type(o).__name__}")
    owner = getattr(o, "pool", None)
    if isinstance(owner, _weakref):
        owner = owner()
        if owner is None:
            return _POOL_GONE
    return owner


def _seed_hash():
    global _SEED
    import os
    _SEED = int.from_bytes(os.urandom(8), "little")


_seed_hash()


from collections.abc import MutableMapping as _MutableMapping


class _CacheView(_MutableMapping):
    """``BlockHashToBlockMap._cache`` of the compiled core: a live mapping
    over the C table (see that property)."""

    __slots__ = ("_map",)

    def __init__(self, hash_map):
        self._map = hash_map

    def __getitem__(self, key):
        return self._map._entry(key)

    def __setitem__(self, key, value):
        self._map._set_entry(key, value)

    def __delitem__(self, key):
        self._map._del_entry(key)

    def __iter__(self):
        return iter(self._map._snapshot_py())

    def __len__(self):
        return len(self._map)

    def clear(self):
        self._map._clear()

    def __copy__(self):
        return self._map._snapshot_py()

    def copy(self):
        return self._map._snapshot_py()

    def __eq__(self, other):
        if isinstance(other, _CacheView):
            other = other.copy()
        return self._map._snapshot_py() == other

    __hash__ = None

    def __repr__(self):
        return repr(self._map._snapshot_py())
