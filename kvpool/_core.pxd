# Data layout of the compiled core (see _core.pyx for the why).
cimport cython
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t


cdef inline unsigned long long _be_tail(const unsigned char *c, Py_ssize_t n,
                                        Py_ssize_t width) noexcept:
    # The big-endian value of c[0:n]'s last `width` bytes (all n if fewer):
    # with width 8, a block hash's int form (kvpool.hashing's
    # convert_block_hashes, the low 64 bits of its value); with width 4, a
    # hash key's group id. One definition for the core and the manager.
    cdef unsigned long long v = 0
    cdef Py_ssize_t k = n - width if n > width else 0
    while k < n:
        v = (v << 8) | c[k]
        k += 1
    return v


cdef class _Store:
    # Blocks 0..n-1, then the free list's head (n) and tail (n+1) sentinels.
    cdef Py_ssize_t n
    # Slots: n blocks, 2 sentinels, then `nadopt` adopted stand-alone
    # blocks; `cap` slots are allocated.
    cdef Py_ssize_t nadopt
    cdef Py_ssize_t cap
    cdef Py_ssize_t num_free
    cdef Py_ssize_t num_objs      # how many of objs[] are materialised
    cdef int32_t *prev            # free-list links; -1: not in the list
    cdef int32_t *next
    cdef int32_t *ref_cnt
    cdef uint8_t *flags           # _NULL
    cdef uint32_t *stamp          # == epoch: seen earlier in the current call
    cdef uint32_t epoch
    cdef PyObject **hash          # owned reference to the hash key, or NULL
    cdef PyObject **objs          # the block objects (owned, or borrowed if private)
    cdef bint private             # a standalone block's own one-block store
    cdef bint owned               # blocks handed to a queue or a pool for good
    # The vLLM 0.33 line: handles are KVCacheBlock33, and each block also
    # records how many prefix tokens its hash covers (ntok, NULL otherwise).
    cdef bint v33
    cdef int64_t *ntok            # NTOK_NONE: None
    # The 0.24-0.29 blocks of the 0.33-style store: handles are
    # KVCacheBlock24 (no ``pool`` attribute).
    cdef bint no_pool
    # The 0.34 blocks of the 0.33-style store: handles are KVCacheBlock34
    # (``block_hash`` fields, ``pool`` a weak reference).
    cdef bint v34
    # A queue built from an empty list: no block named its vLLM line yet;
    # the first block it adopts does (see _settle_kind).
    cdef bint unsettled
    # The pool these blocks belong to (``block.pool``): borrowed for a
    # pool's store (the pool owns the store), owned for a private store.
    cdef PyObject *pool
    # A queue's store whose blocks were made with `pool=P` (a pool outside
    # kvpool building its queue from kvpool blocks): a weak reference to P.
    cdef object pool_wr

    cdef object block(self, Py_ssize_t i)
    cdef int materialise(self, Py_ssize_t first, Py_ssize_t count) except -1
    cdef uint32_t new_epoch(self) noexcept
    cdef void unlink(self, Py_ssize_t i) noexcept
    cdef void link_tail(self, Py_ssize_t i) noexcept
    cdef Py_ssize_t add_slot(self) except -1


cdef class KVCacheBlock:
    cdef PyObject *_st            # the store holding this block's state
    cdef int32_t _idx             # index in that store
    cdef int32_t _bid             # block_id


cdef class KVCacheBlock33(KVCacheBlock):
    pass


cdef class KVCacheBlock24(KVCacheBlock33):
    pass


cdef class KVCacheBlock34(KVCacheBlock33):
    pass


cdef class FreeKVCacheBlockQueue:
    cdef _Store st


cdef class BlockHashToBlockMap:
    # Open addressing: slot j holds an owned key (bytes) and an owned value
    # (a block, or a {block_id: block} dict), or NULL; at most half full.
    cdef Py_ssize_t cap
    cdef Py_ssize_t used
    cdef PyObject **keys
    cdef PyObject **vals
    cdef uint64_t *hashes

    @cython.final
    cdef int _alloc(self, Py_ssize_t cap) except -1
    @cython.final
    cdef int _grow(self) except -1
    @cython.final
    cdef Py_ssize_t find(self, const char *p, Py_ssize_t size, uint32_t g, uint64_t h) noexcept
    @cython.final
    cdef Py_ssize_t find_key(self, bytes key) noexcept
    @cython.final
    cdef PyObject *first_ptr(self, Py_ssize_t j) noexcept
    @cython.final
    cdef object first_at(self, Py_ssize_t j)
    @cython.final
    cdef PyObject *get_hg_ptr(self, PyObject *block_hash, uint32_t g) noexcept
    @cython.final
    cdef object get_hg(self, object block_hash, uint32_t g)
    @cython.final
    cdef int insert_key(self, bytes key, KVCacheBlock block) except -1
    @cython.final
    cdef int insert_hg(self, bytes key, object block_hash, uint32_t g, KVCacheBlock block) except -1
    @cython.final
    cdef int _insert(self, bytes key, Py_ssize_t j, uint64_t h, KVCacheBlock block) except -1
    @cython.final
    cdef bint slot_has_id(self, Py_ssize_t j, int32_t block_id) noexcept
    @cython.final
    cdef void delete_at(self, Py_ssize_t i) noexcept
    @cython.final
    cdef object pop_id(self, Py_ssize_t j, object block_id)
    @cython.final
    cdef bint pop_block(self, bytes key, KVCacheBlock b) except -1


cdef class BlockHashToBlockMap34(BlockHashToBlockMap):
    # vLLM 0.34's map is built over the pool's block list and shows block
    # ids: `_blocks` is that list (a stand-alone map), or None with `_st`
    # the pool's store (ids are indices there).
    cdef object _block_list
    cdef _Store _st

    cdef object block_of(self, object block_id)


cdef class PoolCore:
    # Released in this order: the handles' other owners before the store, so
    # a dying pool does not move still-cached handles to private stores.
    cdef list _blocks
    cdef object _collector        # the facade's settings (see the properties)
    cdef object _enable_caching
    cdef object _enable_events
    cdef object _hash_block_size
    cdef bint _caching
    cdef bint _events
    cdef bint _count_null         # rule _kvpool_counts_null (see PoolCore)
    cdef int _free_off            # rule _kvpool_free_caching_off (see PoolCore)
    cdef dict _by_block           # 0.33: block_id -> its further hash keys
    cdef dict _watchers           # 0.33: block_id -> reuse watcher
    cdef BlockHashToBlockMap _map
    cdef FreeKVCacheBlockQueue _queue
    cdef _Store st

    cdef BlockHashToBlockMap _new_map(self)
    cdef int _free_seq(self, object ordered_blocks, bint evict_first) except -1
    cdef int _cache_run33(self, blocks, start, stop, block_hashes, Py_ssize_t scale,
                          group_id, block_size, block_mask, list removed,
                          list stored) except -1
    cdef list _take_new(self, Py_ssize_t num_blocks, list removed)
