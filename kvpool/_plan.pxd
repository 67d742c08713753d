# The plan of a kvpool KV-cache manager: what its compiled paths read of
# vLLM's manager that does not change while it lives (the classes, built by
# _plan.pyx's plan_for), and the small rules every path inlines -- vLLM's
# integer arithmetic, its request-table reads, the pool's free count and
# new blocks. Every module of the manager cimports from here.

from libc.stdint cimport uint32_t
from cpython.dict cimport PyDict_GetItemWithError
from cpython.list cimport PyList_GET_SIZE
from cpython.object cimport PyObject, PyObject_GetItem
from cpython.exc cimport PyErr_Occurred
from kvpool._core cimport PoolCore

cdef extern from "Python.h":
    bint PyLong_CheckExact(object o)
    bint PyList_CheckExact(object o)
    bint PyTuple_CheckExact(object o)
    bint PyDict_Check(object o)
    bint PySet_Check(object o)
    int PySet_Contains(object s, object key) except -1
    int PySet_Add(object s, object key) except -1
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow)
    object PyObject_Vectorcall(object callable, PyObject **args, size_t nargsf, object kwnames)


# Largest count taken by the fast path; anything larger goes to vLLM's code
# (so no sum below can overflow). A C constant: a DEF is a Python int to
# Cython 3, and every comparison with it boxed the count.
cdef extern from *:
    """
    #define KVPOOL_MAX_COUNT (((long long) 1) << 40)
    """
    const long long MAX_COUNT "KVPOOL_MAX_COUNT"

cdef class _Group:
    # One of vLLM's single-type managers (FullAttentionManager,
    # SlidingWindowManager, RSWAManager, ChunkedLocalAttentionManager,
    # CrossAttentionManager, MambaManager or CircularBufferManager),
    # with what its hot paths read, fixed when the manager is built.
    cdef object mgr               # vLLM's manager object itself
    # Its request tables, as bound when the plan was made (vLLM binds them
    # once, in __init__; ``refresh`` rebinds them at each step's start):
    cdef object rtb               # req_to_blocks (a defaultdict)
    cdef object ncb               # num_cached_block
    cdef object phr               # _partial_hit_reqs
    cdef Py_ssize_t block_size
    cdef bint sliding
    # SlidingWindowManager.get_num_skipped_tokens(n) = max(0, n - skip_off)
    cdef Py_ssize_t skip_off      # sliding_window - 1 + extra_retained_tokens
    # RSWAManager: full attention that frees the blocks between the prompt
    # and the last rswa_window processed tokens (see _gap_has_left).
    cdef bint rswa
    cdef Py_ssize_t rswa_window
    # ChunkedLocalAttentionManager: get_num_skipped_tokens(n) = n // chunk * chunk
    # (the blocks before the current chunk), every other path the base class's.
    cdef bint chunked
    cdef Py_ssize_t chunk         # attention_chunk_size
    # CrossAttentionManager (encoder-decoder models, prefix caching off): the
    # base class's paths over the request's encoder tokens, not its own.
    cdef bint cross
    # MambaManager in mamba_cache_mode "none" (prefix caching off): the base
    # class's paths with get_num_skipped_tokens(n) = n - 1 (only the state
    # after the last token is kept) and, for speculative decoding, its
    # num_speculative_blocks blocks' tokens added to every count.
    cdef bint mamba
    cdef Py_ssize_t extra_tokens  # block_size * num_speculative_blocks; 0 for other classes
    # MambaManager in mamba_cache_mode "align" (prefix caching on): the
    # calls that adopt no partial-block hit and take no connector's tokens
    # are done here -- a running request's steps, its new state blocks, its
    # admission, its prefill checkpoints (see _align_steady); every other
    # call is vLLM's code.
    cdef bint align
    cdef Py_ssize_t nsb           # num_speculative_blocks (align)
    cdef bint ckpt_blocks         # has_prefill_checkpoint_blocks (align)
    # Its prefill checkpoints (see _align_checkpoint), when ckpt_blocks: the
    # spec's alignment (0: None, no checkpoint is ever valid), the
    # granularity of a checkpoint's position, the tokens below a chunk's end
    # it stays at or under, and EAGLE's block drop (one granule lower).
    cdef Py_ssize_t ckpt_align
    cdef Py_ssize_t ckpt_every
    cdef Py_ssize_t ckpt_back
    cdef bint ckpt_drop
    cdef object ckpts             # _checkpoints (a dict)
    cdef object allocated         # _allocated_block_reqs (a set)
    cdef object last_state        # last_state_block_idx (a dict)
    cdef object retired           # _num_retired_blocks (a dict)
    cdef bint use_eagle           # the manager's use_eagle (its cacheable tokens)
    # CircularBufferManager (and 0.30/0.31's KpoolTailManager, its empty
    # subclass): one ring block a request, claimed when it has none; no
    # prefix caching, no hits, nothing skipped.
    cdef bint ring
    cdef bint unlooked            # a ring whose spec is not prefix-cacheable: no lookup
    cdef bint has_cap             # max_admission_blocks_per_request is set
    cdef Py_ssize_t cap
    cdef bint caching             # the manager's enable_caching
    cdef bint caches              # caching, and its cache_blocks caches (not a ring group)
    cdef bint full_like           # full attention or R-SWA: the common-prefix count counts it
    cdef bint partial_tail        # FullAttentionManager with block_size != hash_block_size
    cdef bint record_ids          # _record_new_block_ids
    cdef Py_ssize_t group_id      # kv_cache_group_id
    cdef bint direct_cache        # its cache_blocks is done in C (see _cache)
    cdef bint estimates           # estimate_cached_tokens counts its blocks
    # Mamba caching (issue 52): an align-mode group (or a mode-"all" one,
    # 0.30 and 0.31: no tail step, no offers) whose caching step is
    # done in C (_cache: the base step's block mask and pool call, the
    # Mamba part's bookkeeping; its partial-tail step when it provably does
    # nothing, else vLLM's _cache_partial_tail_block), with what it reads:
    cdef bint mc_direct
    cdef Py_ssize_t mc_align_tokens  # cache_hit_alignment_tokens (0: None, a dense mask)
    cdef bint mc_drop             # its tail's EAGLE drop (0.30: use_eagle, else
                                  # drop_eagle_checkpoint_block)
    cdef bint mc_junction         # shared_prefix_checkpoint (0.30: fine_grained_prefix_cache)


cdef class _SpecGroup:
    # One entry of the lookup: the groups of one spec, looked up together
    # (vLLM's hybrid coordinator's SpecGroup, or the unitary coordinator's
    # one group), full attention left to right, a window right to left.
    cdef list group_ids           # the kv_cache_group_ids, one list as in vLLM
    cdef Py_ssize_t ngids
    cdef bint sliding
    cdef bint drop_eagle          # EAGLE / MTP: its lookup drops the last hit block
    cdef Py_ssize_t window_blocks # sliding: cdiv(sliding_window - 1, block_size)
    cdef Py_ssize_t chunk         # chunked local attention's chunk size; 0: not chunked
    cdef Py_ssize_t align_blocks  # full attention: hits rounded down to this many blocks
                                  # (vLLM's alignment tokens over the block size; 1: none)
    # The group ids as the core's hash map keys them (at most 8: _spec_group
    # makes no _SpecGroup of more, so the lookup's hit arrays of 8 hold them).
    cdef uint32_t gids[8]
    # Mamba lookup (issue 52): the hybrid coordinator's full attention +
    # Mamba "align" (_mamba_specs, _lookup_mamba), each finder at its spec's
    # block, which may be a multiple of the hash block.
    cdef bint mamba               # MambaManager's finder (else full attention's)
    cdef Py_ssize_t block         # the spec's block size (a multiple of the hash block)
    cdef Py_ssize_t scale         # block // hash block: block i's hash is hashes[(i+1)*scale - 1]
    cdef bint fine                # the finder's fine-grained branch (alignment < block, a divisor
                                  # of it; then the alignment is the hash block)
    cdef Py_ssize_t margin        # tokens an EAGLE drop looks past the hit (full attention)


cdef class ManagerPlan:
    # Everything allocate_slots() and cache_blocks() need that does not change
    # while the manager lives; built once by plan_for().
    cdef tuple groups             # of _Group, in kv_cache_group_id order
    cdef Py_ssize_t ngroups
    cdef bint frees_early         # a group frees blocks before free() (window, chunk, R-SWA gap)
    cdef object pool              # the coordinator's block pool
    cdef object pool_core         # the same pool if its free count is the core's, else None
    cdef object null_block
    cdef object coordinator
    cdef object empty             # manager.empty_kv_cache_blocks
    cdef object empty_blocks      # empty.blocks
    cdef object kv_cache_blocks   # vLLM's KVCacheBlocks class
    cdef object waiting           # RequestStatus.WAITING
    cdef object preempted         # RequestStatus.PREEMPTED
    cdef Py_ssize_t max_model_len
    cdef Py_ssize_t watermark_blocks
    cdef Py_ssize_t reprefillable # coordinator.num_reprefillable_tokens
    cdef Py_ssize_t hash_block_size
    cdef bint hybrid              # a HybridKVCacheCoordinator (no reprefillable cut)
    cdef bint cap_at_hashed       # 0.33: cache_blocks stops at the hashed tokens
    cdef bint trims_null_head     # 0.33: free() drops a table's leading null blocks
    cdef bint has_prefill_end     # 0.31 on: get_num_blocks_to_allocate's prefill_end
    # An align-mode group reserves prefill checkpoint blocks (its
    # checkpoint decided per call, see _align_checkpoint).
    cdef bint align_ckpts
    # An align-mode checkpoint step's rules: 30, 31 or 32 (0.32 on), see
    # _align_count and _align_new_blocks.
    cdef int align_rules
    cdef bint zero_chunk_adopts   # 0.31 on: a 0-token chunk may adopt computed tokens
    cdef object base_num_blocks   # the coordinator class's get_num_blocks_to_allocate
    cdef bint caching             # any group caches
    cdef bint has_cross           # a cross-attention group (see _Group.cross)
    cdef bint has_align           # a Mamba group in "align" mode (see _Group.align)
    cdef bint mamba_hits          # a Mamba group caching outside "align" (0.30, 0.31: its hits are vLLM's)
    # What the hybrid coordinator's cacheable tokens of a group depend on
    # (see _hybrid_cacheable): its scheduler block, whether partial hash
    # hits are on (no rounding then).
    cdef Py_ssize_t sched_block
    cdef bint partial_hits
    # 0.32 on: the partial-tail step's block is cdiv(n, bs) - 1 (0.30,
    # 0.31: n // bs).
    cdef bint tail_cdiv
    cdef bint tail_eagle_limit    # 0.32 on: a full-attention prompt tail below prompt - 1 without EAGLE
    cdef object status_type       # RequestStatus (its members are singletons)
    # The pool's cache_full_blocks is kvpool's (the 0.33 facade's over the
    # compiled core): without events it is the core's _cache_run33.
    cdef bint core_caches
    # ... and its get_new_blocks the core's, its hook path the 0.33
    # facade's: with events on (no metrics, no watchers) the core's
    # _take_new, then the facade's BlockRemoved events.
    cdef bint core_news
    # With events on, a plain request's BlockStored is built here (see
    # _plain_stored): the pool class's event class, the keywords its
    # builder passes (a tuple, for the vectorcall) and what each one is.
    cdef object stored_cls        # None: the pool's own builder always
    cdef object stored_kwnames
    cdef int stored_codes[16]
    cdef bint stored_lookahead    # 0.33: the builder takes lookahead_token_ids
    # How the calls went, for tests and benchmarks (``ManagerPlan.counts``).
    cdef Py_ssize_t n_fast        # allocate_slots done here, adopting nothing
    cdef Py_ssize_t n_adopt       # ... adopting a prefix-cache hit
    cdef Py_ssize_t n_external    # ... adopting a connector's external tokens (and any hit)
    cdef Py_ssize_t n_cow         # ... of them, adopting a partial hit (copied on write)
    cdef Py_ssize_t n_base        # allocate_slots handed to vLLM's method
    cdef Py_ssize_t n_cache_calls # coordinator.cache_blocks called from here
    cdef Py_ssize_t n_cache_direct  # pool.cache_full_blocks called from here
    cdef Py_ssize_t n_cache_skips # cache_blocks with nothing to cache
    cdef Py_ssize_t n_plain_events  # BlockStored events built here
    cdef Py_ssize_t n_lookups     # get_computed_blocks done here
    cdef Py_ssize_t n_common      # get_num_common_prefix_blocks done here
    cdef bint common_direct       # get_num_common_prefix_blocks in C (0.30, 0.31)
    # get_computed_blocks in C (see _plan_lookup): the spec groups in vLLM's
    # order (full attention first), every block the hash block and the hit
    # alignment; the hybrid coordinator's (``hybrid``) reports the uncached
    # prefix.
    cdef tuple lookup_specs       # of _SpecGroup; None: not done here
    cdef bint margin_to_hashes    # 0.32 on: EAGLE's margin capped at the hashed tokens
    cdef bint map_direct          # the pool's get_cached_block is the compiled core's
    # Mamba caching (issue 52): the caching step of align-mode groups and of
    # full-attention groups registering partial tails done in C (see _cache;
    # set in plan_for), with what the coordinator's replay boundaries and
    # the base step's mask read:
    cdef bint mc_on
    cdef bint mc_replay_eagle     # the coordinator's (drop_)eagle_group_ids is not empty
    cdef Py_ssize_t mc_sched      # coordinator.scheduler_block_size
    cdef bint mc_junction_eagle   # 0.33 on: an EAGLE group keeps the junction - bs too
    cdef Py_ssize_t mc_lookahead  # 0.33 on: the pool's num_hash_lookahead_tokens (tail)
    cdef Py_ssize_t n_mc_steps    # caching steps with such a group done here
    cdef Py_ssize_t n_mc_tails    # ... of them, an align group's tail step handed to vLLM's
                                  # _cache_partial_tail_block (something unusual: _align_tail)
    cdef Py_ssize_t n_mc_fa_tails # ... a full-attention group's, to its _cache_partial_tail_block
    cdef Py_ssize_t n_mc_masks    # sparse-retention block masks built here
    cdef Py_ssize_t n_mc_partials # the pool's cache_partial_block or _maybe_evict_cached_block
                                  # called here (a tail step)
    # Mamba lookup (issue 52): lookup_specs is (full attention, Mamba align)
    # and _lookup_mamba looks up; the hybrid coordinator's cache-hit
    # alignment (tokens); get_computed_blocks calls handed to vLLM's method.
    cdef bint mamba_lookup
    cdef Py_ssize_t lookup_align
    cdef Py_ssize_t n_lookups_base
    # align connector and remaining blocks (issue 52)
    cdef Py_ssize_t n_coord       # coordinator.get_num_blocks_to_allocate done here
    cdef Py_ssize_t n_coord_base  # ... handed to vLLM's method


cdef inline bint _count(object o, Py_ssize_t *out) except -1:
    """``o`` is an exact int in [-MAX_COUNT, MAX_COUNT]: store it, True.
    Called several times on every decode step: no exception is raised and
    caught for a large int (``overflow`` says so), no object is made."""
    cdef int overflow = 0
    cdef long long v
    if not PyLong_CheckExact(o):
        return False
    v = PyLong_AsLongLongAndOverflow(o, &overflow)
    if v == -1 and not overflow and PyErr_Occurred():  # not for an exact int
        return -1
    if overflow or v < -MAX_COUNT or v > MAX_COUNT:
        return False
    out[0] = <Py_ssize_t> v
    return True


cdef inline Py_ssize_t _cdiv(Py_ssize_t a, Py_ssize_t b) noexcept:
    # vLLM's cdiv, -(a // -b): the ceiling of a / b (b > 0; C's division
    # truncates toward zero, which is the ceiling for a negative a).
    return (a + b - 1) // b if a > 0 else a // b


cdef inline Py_ssize_t _floordiv(Py_ssize_t a, Py_ssize_t b) noexcept:
    # Python's a // b (b > 0): C truncates toward zero.
    if a >= 0:
        return a // b
    return -((-a + b - 1) // b)


cdef inline Py_ssize_t _mod(Py_ssize_t a, Py_ssize_t b) noexcept:
    # Python's a % b (b > 0): C's takes the sign of a.
    return a - _floordiv(a, b) * b


cdef inline object _req_blocks(_Group g, object rid):
    # vLLM's ``req_to_blocks[request_id]``: the group's table read as a
    # dict, falling back to the defaultdict's lookup, which adds an empty
    # list for a request without one.
    cdef PyObject *entry = PyDict_GetItemWithError(g.rtb, rid)
    if entry != NULL:
        return <object> entry
    return PyObject_GetItem(g.rtb, rid)


cdef inline object _exact_table(_Group g, object rid):
    # The group's table of the request when the request has one and it is
    # an exact list; None otherwise (absent, or something vLLM's own code
    # should handle). Reads only: a defaultdict adds no entry here.
    # (A lookup error propagates: Cython checks PyDict_GetItemWithError.)
    cdef PyObject *entry = PyDict_GetItemWithError(g.rtb, rid)
    if entry == NULL or not PyList_CheckExact(<object> entry):
        return None
    return <object> entry


cdef inline Py_ssize_t _free_blocks(ManagerPlan p) except? -1:
    if p.pool_core is not None:
        return (<PoolCore> p.pool_core).st.num_free
    return p.pool.get_num_free_blocks()


cdef inline Py_ssize_t _skipped_tokens(_Group g, Py_ssize_t n) noexcept:
    # The manager's get_num_skipped_tokens(n), n >= 0: a window's tokens
    # before it, a chunked group's before the current chunk, Mamba's all but
    # the last (-1 for none, as vLLM's), else none.
    if g.sliding:
        return n - g.skip_off if n > g.skip_off else 0
    if g.chunked:
        return _floordiv(n, g.chunk) * g.chunk
    if g.mamba:
        return n - 1
    return 0


cdef inline Py_ssize_t _hybrid_cacheable(ManagerPlan p, _Group g, Py_ssize_t num_tokens) noexcept:
    # The hybrid coordinator's cacheable tokens of a group when it caches
    # ``num_tokens`` (get_num_cacheable_tokens; 0.30, 0.31 inline it alike):
    # rounded down to the scheduler block unless partial hash hits are on;
    # an EAGLE group's one block further, within its finalized tokens (less
    # the re-prefillable ones).
    cdef Py_ssize_t n, fin, s = p.sched_block
    n = num_tokens if p.partial_hits else _floordiv(num_tokens, s) * s
    if g.use_eagle and n > 0:
        fin = num_tokens - p.reprefillable
        if fin < 0:
            fin = 0
        n = (fin if p.partial_hits else _floordiv(fin, s) * s) + g.block_size
        if fin < n:
            n = fin
    return n


cdef inline list _new_blocks(ManagerPlan p, Py_ssize_t n):
    # The pool's get_new_blocks(n) (n > 0, no more than its free blocks).
    cdef PoolCore core
    if p.core_news:
        core = <PoolCore> p.pool_core
        if core._events and not core._collector and not core._watchers:
            removed = []
            new = core._take_new(n, removed)
            if PyList_GET_SIZE(removed):
                p.pool._emit_block_removed_events(removed)
            return new
    return p.pool.get_new_blocks(n)


cdef inline object _vllm_base(self, name):
    # vLLM's method ``name`` of the class a manager extends.
    return getattr(type(self)._kvpool_base, name)
