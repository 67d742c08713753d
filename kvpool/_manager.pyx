# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled hot paths of vLLM's ``KVCacheManager`` (the 0.30 to 0.33 lines).

What the scheduler calls for every running request on every step --
``allocate_slots`` for one more token and the async scheduler's
``cache_blocks`` -- is, in vLLM, a dozen Python calls through the
coordinator and each single-type manager, most of which find nothing to do:
no new block is needed, no block became full, nothing left the sliding
window. Here each is one C call that reads the request's counts, decides
what vLLM's code would do, does the common case itself and hands every
other case to vLLM's own code. Why this shape:

* vLLM's object model stays: the state is vLLM's own (each single-type
  manager's ``req_to_blocks`` lists and ``num_cached_block`` dict, the
  coordinator, ``KVCacheBlocks``), read and written here in place, so
  whatever the scheduler, a connector or a test reads of the manager is
  there and means the same. kvpool's manager is a subclass of the release's
  ``KVCacheManager`` whose hot methods are the functions below
  (docs/manager.md lists them and when each hands a call to vLLM).
* Exact by construction: a call is decided before anything changes. If any
  input is outside the case handled here (a partial-block prefix hit in a
  ring group, a connector's external tokens for a request that already
  holds blocks or beside a partial hit, a non-int argument, ...) the whole
  call goes to vLLM's method unchanged. Inside the case, the
  rare steps with real work -- blocks leaving the window, new blocks filling
  up -- call the same vLLM methods vLLM's own path would, with the same
  arguments, in the same order; only the do-nothing steps and the
  arithmetic are done here.
* What is fixed for the manager's life (group block sizes, windows, which
  groups cache, the watermark, the pool) is read once into a
  ``ManagerPlan`` when the manager is built; ``plan_for`` refuses (with the
  reason, logged once by the caller) any configuration outside the scope,
  and such a manager runs vLLM's code throughout.
* The pool's free count is read from the core's store when the pool is
  kvpool's compiled one (``cimport`` of ``PoolCore``): no call.
"""

cimport cython
from libc.stdint cimport uint32_t
from cpython.dict cimport PyDict_Contains, PyDict_GetItemWithError
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject, PyObject_GetItem
from cpython.ref cimport Py_INCREF
from cpython.exc cimport PyErr_Occurred
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromUnsignedLongLong

from kvpool._core cimport BlockHashToBlockMap, KVCacheBlock, PoolCore, _be_tail

from kvpool.hashing import _use_int_block_hashes
from kvpool.hashing import maybe_convert_block_hash as _maybe_convert_block_hash

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


@cython.final
cdef class _Group:
    pass


@cython.final
cdef class _SpecGroup:
    pass


cdef str _kind(_Group g):
    return ("sliding" if g.sliding else "rswa" if g.rswa else "chunked" if g.chunked
            else "cross" if g.cross else "mamba" if g.mamba else "ring" if g.ring else "full")


@cython.final
cdef class ManagerPlan:
    """What kvpool's manager paths read of a ``KVCacheManager`` that does not
    change while it lives (see ``plan_for``)."""

    @property
    def counts(self):
        """``{"fast": ..., "adopt": ..., "external": ..., "base": ..., "cow": ...,
        "cache_calls": ..., "cache_direct": ..., "cache_skips": ...}``:
        ``allocate_slots`` calls done in C (adopting no computed blocks,
        adopting a prefix-cache hit, adopting a KV connector's external
        tokens; ``cow``: of those, adopting a hit that ends inside a block,
        copied on write) and handed to vLLM's method; caching steps (of both entry points) that called the
        coordinator, called the pool's ``cache_full_blocks`` from here, or
        found nothing to cache; prefix-cache lookups and common-prefix counts
        (0.30, 0.31) done here; ``BlockStored`` events of plain requests
        built here."""
        return {
            "fast": self.n_fast,
            "adopt": self.n_adopt,
            "external": self.n_external,
            "base": self.n_base,
            "cow": self.n_cow,
            "cache_calls": self.n_cache_calls,
            "cache_direct": self.n_cache_direct,
            "cache_skips": self.n_cache_skips,
            "lookups": self.n_lookups,
            "common_prefix": self.n_common,
            "plain_events": self.n_plain_events,
        }

    @property
    def lookup_compiled(self):
        """Whether ``get_computed_blocks`` is done here (see ``_plan_lookup``)."""
        return self.lookup_specs is not None

    def __repr__(self):
        kinds = ", ".join(f"{_kind(g)}/{(<_Group> g).block_size}" for g in self.groups)
        return f"<kvpool ManagerPlan groups=[{kinds}] caching={bool(self.caching)}>"


def plan_for(manager, *, kv_cache_blocks, request_status, full_cls, sliding_cls, base_single,
             coordinator_classes, unitary_cls, hybrid_cls, bint cap_at_hashed, bint trims_null_head,
             bint has_prefill_end, bint zero_chunk_adopts, str cap_attr, pool_cache_full_blocks,
             pool_new_blocks_with_hooks, pool_event_extra_keys=None, common_prefix_blocks=None,
             str eagle_drop_attr="drop_eagle_group_ids", bint eagle_margin_to_hashes=True,
             rswa_cls=None, chunked_cls=None, cross_cls=None, mamba_cls=None,
             ring_cls=None, kpool_tail_cls=None, bint tail_index_cdiv=True,
             bint tail_eagle_limit=True, int align_rules=32):
    """``(plan, None)`` if ``manager`` (a vLLM ``KVCacheManager``, built) is in
    the scope of these paths, else ``(None, reason)``.

    The scope: every group a ``FullAttentionManager``,
    ``SlidingWindowManager``, ``RSWAManager`` (``rswa_cls``, overriding only
    what ``_RSWA_OWN`` names), ``ChunkedLocalAttentionManager``
    (``chunked_cls``, overriding only what ``_CHUNKED_OWN`` names) or
    ``CrossAttentionManager`` (``cross_cls``, overriding only what
    ``_CROSS_OWN`` names, prefix caching off as vLLM requires) or
    ``MambaManager`` (``mamba_cls``, overriding only what ``_MAMBA_OWN``
    names, in each ``mamba_cache_mode``: "none", 0.30/0.31's "all" -- the
    same code, with prefix caching on -- and "align") or
    ``CircularBufferManager`` (``ring_cls``, overriding only what
    ``_RING_OWN`` names; and 0.30/0.31's ``KpoolTailManager``,
    ``kpool_tail_cls``, an empty subclass of it) --
    exactly those classes -- over the one pool, a
    coordinator of one of ``coordinator_classes`` (exactly), no groups that
    retain longer hits, no context parallelism. EAGLE / MTP (``use_eagle``,
    lookahead and draft tokens, re-prefillable tokens) is in the scope: of
    the paths done here only the direct prefix-cache lookup differs, by the
    last hit block it drops for a group of the coordinator's
    ``eagle_drop_attr`` set (0.33 on: ``drop_eagle_group_ids``, empty when
    lookahead hashes prove the boundary; 0.30-0.32: ``eagle_group_ids``);
    every other EAGLE difference is in code these paths hand to vLLM
    (sliding-window and Mamba block masks, the hybrid coordinator's
    cacheable tokens), or in the lookup of a sliding window (see
    ``_plan_lookup``). The line's differences: ``cap_at_hashed`` (0.33: a group
    caches no further than the request's hashed tokens); ``trims_null_head``
    (0.33: ``free`` drops a table's leading null blocks); ``has_prefill_end``
    (0.31 on: the coordinator's ``get_num_blocks_to_allocate`` takes it);
    ``zero_chunk_adopts`` (0.31 on: ``allocate_slots`` takes a chunk of no
    new tokens that adopts computed ones; 0.30 raises);
    ``cap_attr``, the name of a sliding-window manager's admission cap;
    ``eagle_margin_to_hashes`` (0.32 on: the hybrid lookup's EAGLE margin
    reaches at most the hashed tokens; 0.30, 0.31: the lookup's bound).
    ``pool_cache_full_blocks``: kvpool's facade method whose work, without
    events, the core's ``_cache_run33`` does (called directly if the pool's
    class has it); ``pool_new_blocks_with_hooks``: the facade's
    ``get_new_blocks`` with hooks, whose work with events alone is the
    core's ``_take_new`` and the facade's ``_emit_block_removed_events``;
    ``pool_event_extra_keys``: the facade's ``_event_extra_keys``, whose
    plain-request case (``None`` per block) ``_plain_stored`` relies on.
    ``tail_index_cdiv`` (0.32 on): an align-mode Mamba group's partial-tail
    step reads the block ``cdiv(n, bs) - 1`` (0.30, 0.31: ``n // bs``).
    ``tail_eagle_limit`` (0.32 on): a full-attention group's prompt-tail
    boundary is below ``num_prompt_tokens - 1`` without EAGLE (0.30, 0.31:
    below ``num_prompt_tokens``, with EAGLE or not).
    ``align_rules``: an align-mode Mamba group's prefill checkpoint rules,
    30, 31 or 32 (0.32 on). 0.32 on: its position is counted in the hit
    alignment's tokens (0.30, 0.31: hash blocks) below a limit that EAGLE's
    block drop puts at the chunk's end (0.30, 0.31: one token below, drop
    or not); a checkpoint step keeps the scratch block at the checkpoint's
    index out of the relocation (0.30, 0.31: relocates none) and counts
    the speculative blocks only for a first allocation (0.30, 0.31: for a
    checkpoint step too; 0.30 assigns the count its cap, not their least,
    and leaves it uncapped for a running request's checkpoint step).
    ``common_prefix_blocks`` (0.30, 0.31): the coordinator base class's
    ``get_num_common_prefix_blocks``, done here if the coordinator's class
    has it (the one without prefix caching answers zeros itself).
    Every call outside the fast case goes to the method of the vLLM class
    the manager's class extends (its ``_kvpool_base``)."""
    cdef ManagerPlan p = ManagerPlan.__new__(ManagerPlan)
    cdef _Group g
    coordinator = manager.coordinator
    if type(coordinator) not in coordinator_classes:
        return None, f"coordinator {type(coordinator).__name__}"
    if getattr(manager, "retained_hit_group_ids", ()):
        return None, "groups that retain longer hits"
    pool = coordinator.block_pool
    groups = []
    for mgr in coordinator.single_type_managers:
        cls = type(mgr)
        ring = _is_ring(cls, full_cls, ring_cls, kpool_tail_cls)
        if cls is not full_cls and cls is not sliding_cls and not (
                cls is rswa_cls and _overrides_only(cls, full_cls, _RSWA_OWN)) and not (
                cls is chunked_cls and _overrides_only(cls, base_single, _CHUNKED_OWN)) and not (
                cls is cross_cls and _overrides_only(cls, base_single, _CROSS_OWN)) and not (
                cls is mamba_cls and _overrides_only(cls, base_single, _MAMBA_OWN)) and not ring:
            return None, f"a {cls.__name__} group"
        if cls is cross_cls and mgr.enable_caching:
            # (vLLM's own cache_blocks raises for it: its code decides)
            return None, f"a {cls.__name__} group with prefix caching"
        if cls is mamba_cls:
            mode = getattr(mgr, "mamba_cache_mode", None)
            if mode not in ("none", "align", "all"):
                return None, f"a {cls.__name__} group in mamba_cache_mode {mode!r}"
        if mgr.block_pool is not pool:
            return None, "groups over different pools"
        if getattr(mgr, "dcp_world_size", 1) != 1 or getattr(mgr, "pcp_world_size", 1) != 1:
            return None, "context parallelism"
        g = _Group.__new__(_Group)
        g.mgr = mgr
        g.align = cls is mamba_cls and mgr.mamba_cache_mode == "align"
        if not _bind_tables(g):
            return None, _NOT_DICTS
        g.block_size = mgr.block_size
        if g.block_size <= 0:
            return None, "a block size that is not positive"
        g.sliding = cls is sliding_cls
        if g.sliding:
            g.skip_off = mgr.sliding_window - 1 + mgr.extra_retained_tokens
        g.rswa = cls is rswa_cls
        if g.rswa:
            g.rswa_window = mgr.rswa_window
        g.chunked = cls is chunked_cls
        if g.chunked:
            g.chunk = mgr.attention_chunk_size
            if g.chunk <= 0:
                return None, "an attention chunk size that is not positive"
        g.cross = cls is cross_cls
        g.mamba = cls is mamba_cls
        g.ring = ring
        # (vLLM's hybrid coordinator leaves such a group out of its lookups)
        g.unlooked = ring and not bool(getattr(mgr.kv_cache_spec, "prefix_cacheable", True))
        if g.mamba:
            # (its get_num_blocks_to_allocate adds the spec's block size, its
            # allocate_new_blocks its own: one figure only if they agree)
            if mgr.kv_cache_spec.block_size != g.block_size:
                return None, f"a {cls.__name__} group whose block size is not its spec's"
            g.extra_tokens = g.block_size * mgr.num_speculative_blocks
            if g.extra_tokens < 0:
                return None, "a negative number of speculative blocks"
        if g.align:
            # (its lookahead-free count: cdiv(main-model tokens, bs) + nsb)
            g.nsb = mgr.num_speculative_blocks
            g.ckpt_blocks = bool(mgr.has_prefill_checkpoint_blocks)
            g.extra_tokens = 0
            alignment = getattr(mgr.kv_cache_spec, "prefill_checkpoint_alignment", None)
            if mgr.has_prefill_checkpoint_blocks and alignment is not None and not (
                    isinstance(alignment, int) and alignment > 0):
                # (vLLM's checkpoint test asserts it on every step)
                return None, "a prefill checkpoint alignment that is not positive"
            if g.ckpt_blocks and alignment is not None:
                # (get_mamba_prefill_checkpoint_position's arguments, as its
                # predictor passes them: 0.32 on, the hit alignment's
                # granules and a proof limit at the chunk's end with EAGLE's
                # drop, else max(1, lookahead hashes) below it -- 0.33's
                # lookahead, 0.32's none; 0.30, 0.31: hash blocks, one token
                # below the end)
                g.ckpt_align = alignment
                g.ckpt_drop = bool(mgr.drop_eagle_checkpoint_block)
                if align_rules >= 32:
                    every = mgr.cache_hit_alignment_tokens
                    lookahead = getattr(pool, "num_hash_lookahead_tokens", 0)
                    if not isinstance(lookahead, int) or lookahead < 0:
                        return None, "a number of lookahead hash tokens that is not a count"
                    g.ckpt_back = 0 if g.ckpt_drop else max(1, lookahead)
                else:
                    every = pool.hash_block_size
                    g.ckpt_back = 1
                if not isinstance(every, int) or every <= 0:
                    return None, "a checkpoint granularity that is not positive"
                g.ckpt_every = every
        g.full_like = full_like = cls is full_cls or g.rswa
        cap = getattr(mgr, cap_attr)
        g.has_cap = cap is not None
        g.cap = cap if cap is not None else 0
        g.caching = bool(mgr.enable_caching)
        g.caches = g.caching and not g.ring  # (a ring group's cache_blocks does nothing)
        g.group_id = mgr.kv_cache_group_id
        # Its cache_blocks may be done here: vLLM's full-attention one, whose
        # block mask is None (reachable_block_mask not overridden).
        g.direct_cache = (
            full_like
            and bool(getattr(mgr.kv_cache_spec, "prefix_cacheable", True))
            and cls.cache_blocks is full_cls.cache_blocks
            # (a classmethod: each access binds anew, so compare functions)
            and cls.reachable_block_mask.__func__ is base_single.reachable_block_mask.__func__
        )
        g.partial_tail = full_like and g.block_size != pool.hash_block_size
        g.use_eagle = bool(mgr.use_eagle)  # (its cacheable tokens, its prompt-tail boundary)
        g.record_ids = bool(mgr._record_new_block_ids)
        # estimate_cached_tokens counts its blocks: a prefix-cacheable spec
        # that is not cross-attention or encoder-only.
        spec = mgr.kv_cache_spec
        g.estimates = bool(spec.prefix_cacheable) and not any(
            c.__name__ in ("CrossAttentionSpec", "EncoderOnlyAttentionSpec")
            for c in type(spec).__mro__
        )
        groups.append(g)
    p.groups = tuple(groups)
    p.ngroups = len(groups)
    p.frees_early = any(
        (<_Group> x).sliding or (<_Group> x).rswa or (<_Group> x).chunked or (<_Group> x).mamba
        for x in groups)
    p.caching = any((<_Group> x).caching for x in groups)
    p.has_cross = any((<_Group> x).cross for x in groups)
    p.has_align = any((<_Group> x).align for x in groups)
    p.mamba_hits = any((<_Group> x).mamba and not (<_Group> x).align and (<_Group> x).caching
                       for x in groups)
    p.tail_cdiv = tail_index_cdiv
    p.tail_eagle_limit = tail_eagle_limit
    p.partial_hits = bool(getattr(coordinator, "enable_partial_hash_hits", False))
    p.sched_block = 1
    if type(coordinator) is hybrid_cls:
        p.sched_block = coordinator.scheduler_block_size
        if p.sched_block <= 0:
            return None, "a scheduler block size that is not positive"
    p.pool = pool
    p.pool_core = (
        pool
        if isinstance(pool, PoolCore)
        and type(pool).get_num_free_blocks is PoolCore.get_num_free_blocks
        else None
    )
    p.null_block = pool.null_block
    p.coordinator = coordinator
    p.empty = manager.empty_kv_cache_blocks
    p.empty_blocks = p.empty.blocks
    p.kv_cache_blocks = kv_cache_blocks
    p.base_num_blocks = type(coordinator).get_num_blocks_to_allocate
    p.status_type = request_status
    p.core_caches = (
        p.pool_core is not None
        and getattr(type(pool), "cache_full_blocks", None) is pool_cache_full_blocks
    )
    p.core_news = (
        p.pool_core is not None
        and getattr(type(pool), "get_new_blocks", None) is PoolCore.get_new_blocks
        and getattr(type(pool), "_get_new_blocks_with_hooks", None) is pool_new_blocks_with_hooks
    )
    _plan_stored_events(p, pool, pool_event_extra_keys)
    p.waiting = request_status.WAITING
    p.preempted = request_status.PREEMPTED
    p.max_model_len = manager.max_model_len
    p.watermark_blocks = manager.watermark_blocks
    p.reprefillable = coordinator.num_reprefillable_tokens
    p.hash_block_size = pool.hash_block_size
    p.hybrid = type(coordinator) is hybrid_cls
    p.cap_at_hashed = cap_at_hashed
    p.trims_null_head = trims_null_head
    p.margin_to_hashes = eagle_margin_to_hashes
    p.map_direct = (
        p.pool_core is not None
        and getattr(type(pool), "get_cached_block", None) is PoolCore.get_cached_block
    )
    _plan_lookup(p, coordinator, full_cls, sliding_cls, chunked_cls, unitary_cls, hybrid_cls,
                 eagle_drop_attr)
    p.common_direct = (
        common_prefix_blocks is not None
        and getattr(type(coordinator), "get_num_common_prefix_blocks", None) is common_prefix_blocks
    )
    p.has_prefill_end = has_prefill_end
    p.align_ckpts = any((<_Group> x).align and (<_Group> x).ckpt_align > 0 for x in groups)
    p.align_rules = align_rules
    p.zero_chunk_adopts = zero_chunk_adopts
    if p.hash_block_size <= 0:
        return None, "a hash block size that is not positive"
    return p, None


# What RSWAManager may define itself for these paths to serve it: all the
# rest is FullAttentionManager's (its remove_skipped_blocks is called, as
# vLLM calls it, when _gap_has_left says it frees a block).
cdef frozenset _RSWA_OWN = frozenset({"__init__", "remove_skipped_blocks"})
# ... and ChunkedLocalAttentionManager, over the base class: its skipped
# tokens are done here (_skipped_tokens), its finder beside full attention
# too (_find_chunked), and its common-prefix count (0.30, 0.31) is 0.
cdef frozenset _CHUNKED_OWN = frozenset({
    "__init__", "get_num_skipped_tokens", "find_longest_cache_hit", "get_num_common_prefix_blocks"})
# ... and CrossAttentionManager, over the base class: with prefix caching off
# (plan_for's condition) neither its lookup nor its cache_blocks is called,
# its common-prefix count (0.30, 0.31) is the coordinator's zeros, and a
# request adopting computed or external tokens goes to vLLM's code (its
# add_local_computed_blocks keeps no count, _adopt would).
cdef frozenset _CROSS_OWN = frozenset({
    "add_local_computed_blocks", "allocate_external_computed_blocks", "cache_blocks",
    "find_longest_cache_hit", "get_num_common_prefix_blocks"})
# ... and MambaManager, over the base class. Outside the "align" mode
# ("none", and 0.30/0.31's "all": one code, prefix caching off or on) its
# skipped tokens (n - 1) are done here (_skipped_tokens), and the
# speculative blocks its get_num_blocks_to_allocate and allocate_new_blocks
# add (_group_new_blocks); each of its other overrides is either the base
# class's path outside "align" (_remove_blocks_in_range,
# remove_skipped_blocks, pop_blocks_for_free: vLLM's code, called as vLLM
# calls it), or vLLM's own: its lookup (_plan_lookup leaves Mamba to
# vLLM's), a call adopting its hit (its count refuses a hit cached this
# step: _allocate hands the call to vLLM's code), its cache_blocks (the
# base class's and its record of the step's cached hashes: called through
# the coordinator's whenever it has a block to cache, see _cache),
# new_step_starts, the common-prefix count of 0.30, 0.31. Its "align" mode:
# _align_steady and what it names.
cdef frozenset _MAMBA_OWN = frozenset({
    "__init__", "has_positionally_stable_blocks", "find_longest_cache_hit",
    "reachable_block_mask", "_remove_blocks_in_range", "remove_skipped_blocks",
    "get_num_common_prefix_blocks", "_needs_internal_checkpoint", "get_num_blocks_to_allocate",
    "allocate_new_blocks", "_relocate_speculative_block", "finalize_partial_tail_offload",
    "pop_blocks_for_free", "get_num_skipped_tokens", "cache_blocks", "new_step_starts",
    "_cache_partial_tail_block"})


# ... and CircularBufferManager, over full attention: one ring block a
# request (its count, its claim on allocation and on external tokens) done
# here; its lookup (no hits: its spec is not prefix-cacheable, so vLLM's
# coordinator leaves it out, and so does _plan_lookup), cache_blocks, add_local_computed_blocks,
# remove_skipped_blocks, skipped tokens and common-prefix count (0.30, 0.31)
# do nothing, which these paths do too.
cdef frozenset _RING_OWN = frozenset({
    "_claim_ring_block", "get_num_blocks_to_allocate", "allocate_new_blocks",
    "allocate_external_computed_blocks", "find_longest_cache_hit", "cache_blocks",
    "add_local_computed_blocks", "remove_skipped_blocks", "get_num_skipped_tokens",
    "get_num_common_prefix_blocks"})


cdef bint _is_ring(object cls, object full_cls, object ring_cls, object kpool_tail_cls):
    # CircularBufferManager as vLLM ships it, or KpoolTailManager (0.30,
    # 0.31) over it, adding nothing.
    if ring_cls is None or not _overrides_only(ring_cls, full_cls, _RING_OWN):
        return False
    return cls is ring_cls or (
        cls is kpool_tail_cls and _overrides_only(cls, ring_cls, frozenset()))


cdef bint _overrides_only(object cls, object base, frozenset own):
    # ``cls`` is a direct subclass of ``base`` whose own functions are all in
    # ``own`` (a release that gives it another method takes it out of scope).
    if cls.__bases__ != (base,):
        return False
    for name, value in vars(cls).items():
        if name not in own and (callable(value) or isinstance(value, (classmethod, staticmethod, property))):
            return False
    return True


cdef _SpecGroup _spec_group(list group_ids, bint sliding, bint drop_eagle, Py_ssize_t window,
                            Py_ssize_t block_size):
    # None where the lookup is not done here: more than 8 groups of the
    # spec, or ids the core's map cannot key (every lookup's hit arrays
    # hold 8).
    cdef _SpecGroup s
    if len(group_ids) > 8 or not all(isinstance(g, int) and 0 <= g <= 0xFFFFFFFF for g in group_ids):
        return None
    s = _SpecGroup.__new__(_SpecGroup)
    s.group_ids = list(group_ids)
    s.ngids = len(group_ids)
    s.sliding = sliding
    s.drop_eagle = drop_eagle
    s.window_blocks = _cdiv(window - 1, block_size) if sliding else 0
    s.align_blocks = 1
    for j in range(s.ngids):
        s.gids[j] = <uint32_t> group_ids[j]
    return s


cdef int _plan_lookup(ManagerPlan p, object coordinator, object full_cls, object sliding_cls,
                      object chunked_cls, object unitary_cls, object hybrid_cls,
                      str eagle_drop_attr) except -1:
    # get_computed_blocks in C where vLLM's lookup is one pass: the unitary
    # coordinator over one full-attention or sliding-window group, or the
    # hybrid coordinator's "simple hybrid" (one spec of full attention, then
    # one of a sliding window), every group's block the hash block and the
    # hit alignment (no fine-grained hits, no re-alignment after a drop), no
    # group retaining longer hits (every group's class is exactly vLLM's, so
    # the finders are vLLM's). A circular buffer's group takes no part: its
    # spec is not prefix-cacheable, so vLLM's hybrid coordinator leaves it
    # out of the lookup (its hit is an empty list) whatever its block size.
    # lookup_specs stays None otherwise, and vLLM's method looks up. Every
    # lookup's block is then the hash block.
    cdef _Group g
    cdef tuple specs
    cdef Py_ssize_t bs = p.hash_block_size
    if p.ngroups == 0:
        return 0
    for x in p.groups:
        g = <_Group> x
        if g.unlooked:
            continue
        if g.block_size != bs or g.mamba or getattr(g.mgr, "retains_longer_hit", False):
            return 0
    if getattr(coordinator, "enable_partial_hash_hits", False):
        return 0
    g = <_Group> p.groups[0]
    if type(coordinator) is unitary_cls:
        if p.ngroups != 1 or coordinator.block_size != bs or g.chunked or g.ring:
            return 0
        # vLLM's unitary coordinator: drop_eagle_block=0 in <that set>.
        specs = (
            _spec_group([0], g.sliding, 0 in getattr(coordinator, eagle_drop_attr),
                        g.mgr.kv_cache_spec.sliding_window if g.sliding else 0, bs),
        )
    else:
        specs = _hybrid_specs(p, coordinator, full_cls, sliding_cls, chunked_cls, hybrid_cls, bs)
    if specs is not None and None not in specs:
        p.lookup_specs = specs
    return 0


cdef bint _covers(ManagerPlan p, tuple specs):
    # Whether the looked-up specs' groups and the groups left out of lookups
    # are every group, each once.
    ids = [i for i in range(p.ngroups) if (<_Group> p.groups[i]).unlooked]
    for spec in specs:
        ids.extend(spec.group_ids)
    return sorted(ids) == list(range(p.ngroups))


cdef tuple _hybrid_specs(ManagerPlan p, object coordinator, object full_cls, object sliding_cls,
                         object chunked_cls, object hybrid_cls, Py_ssize_t bs):
    # The hybrid coordinator's simple hybrid (see _plan_lookup), or None:
    # full attention, then a sliding window or chunked local attention (not
    # under EAGLE: vLLM's chunked finder asserts that it drops no block).
    # Beside them only circular buffers' groups, which vLLM's lookup leaves
    # out; so also full attention alone among the looked-up groups, whose
    # fixed-point loop ends after its first pass.
    cdef _SpecGroup only
    if type(coordinator) is not hybrid_cls:
        return None
    align = coordinator._cache_hit_alignment_tokens
    groups = coordinator.attention_groups
    if not 1 <= len(groups) <= 2 or not isinstance(align, int) or align <= 0 or align % bs:
        return None
    full = groups[0]
    if not any(c.__name__ == "FullAttentionSpec" for c in type(full.spec).__mro__) \
            or full.manager_cls is not full_cls:
        return None
    if len(groups) == 1:
        # Its finder rounds its hit down to the alignment: the least common
        # multiple of every group's block size, the circular buffers' too.
        if not _covers(p, (full,)):
            return None
        only = _spec_group(full.group_ids, False, bool(full.use_eagle), 0, bs)
        if only is not None:
            only.align_blocks = align // bs
        return (only,)
    if align != bs:
        return None
    window = groups[1]
    if window.manager_cls is chunked_cls and chunked_cls is not None and not window.use_eagle:
        if not _covers(p, (full, window)):
            return None
        chunked = _spec_group(window.group_ids, False, False, 0, bs)
        if chunked is not None:
            chunked.chunk = window.spec.attention_chunk_size
            if chunked.chunk <= 0:
                return None
        return (_spec_group(full.group_ids, False, bool(full.use_eagle), 0, bs), chunked)
    if window.manager_cls is not sliding_cls:
        return None
    if not _covers(p, (full, window)):
        return None
    return (
        _spec_group(full.group_ids, False, bool(full.use_eagle), 0, bs),
        _spec_group(window.group_ids, True, bool(window.use_eagle), window.spec.sliding_window, bs),
    )


# What each keyword of a plain request's BlockStored is (_plain_stored).
cdef dict _STORED_CODES = {
    "block_hashes": 0, "parent_block_hash": 1, "token_ids": 2, "block_size": 3,
    "group_idx": 4, "medium": 5, "session_id": 6, "extra_keys": 7,
    "lora_id": 8, "lora_name": 8,  # None
    "lookahead_token_ids": 9,  # None, or each block's lookahead tokens
}


cdef int _plan_stored_events(ManagerPlan p, object pool, object extra_keys) except -1:
    # Whether _core_caches builds a plain request's BlockStored itself: the
    # core caches, and the pool's builder and lookahead are defined by one
    # class that lists the builder's keywords, its extra keys the facade's.
    cdef Py_ssize_t i
    p.stored_cls = None
    if not p.core_caches or extra_keys is None:
        return 0
    cls = type(pool)
    if getattr(cls, "_event_extra_keys", None) is not extra_keys:
        return 0
    for k in cls.__mro__:
        if "_build_block_stored_event" in k.__dict__:
            break
    else:
        return 0
    names = k.__dict__.get("_PLAIN_STORED_KEYWORDS")
    if "_event_lookahead" not in k.__dict__ or type(names) is not tuple or len(names) > 16:
        return 0
    for i in range(len(names)):
        code = _STORED_CODES.get(names[i])
        if code is None:
            return 0
        p.stored_codes[i] = code
    p.stored_kwnames = names
    p.stored_lookahead = "lookahead_token_ids" in names
    p.stored_cls = pool._BlockStored
    return 0


cdef str _NOT_DICTS = "request tables that are not dicts"


cdef bint _bind_tables(_Group g) except -1:
    # Bind the group's request tables if all three are dicts (what the
    # compiled paths' PyDict calls need) -- an align-mode Mamba group's four
    # more too, dicts and a set -- False, binding nothing, if not.
    rtb, ncb, phr = g.mgr.req_to_blocks, g.mgr.num_cached_block, g.mgr._partial_hit_reqs
    if not (PyDict_Check(rtb) and PyDict_Check(ncb) and PyDict_Check(phr)):
        return False
    if g.align:
        mgr = g.mgr
        ckpts, allocated = mgr._checkpoints, mgr._allocated_block_reqs
        last_state, retired = mgr.last_state_block_idx, mgr._num_retired_blocks
        if not (PyDict_Check(ckpts) and PySet_Check(allocated) and PyDict_Check(last_state)
                and PyDict_Check(retired)):
            return False
        g.ckpts, g.allocated, g.last_state, g.retired = ckpts, allocated, last_state, retired
    g.rtb, g.ncb, g.phr = rtb, ncb, phr
    return True


cdef bint _bound(_Group g):
    # Whether the group's tables are still the ones bound.
    mgr = g.mgr
    if (mgr.req_to_blocks is not g.rtb or mgr.num_cached_block is not g.ncb
            or mgr._partial_hit_reqs is not g.phr):
        return False
    return not g.align or (
        mgr._checkpoints is g.ckpts and mgr._allocated_block_reqs is g.allocated
        and mgr.last_state_block_idx is g.last_state and mgr._num_retired_blocks is g.retired)


def refresh(self):
    """Rebind the plan's view of each group's request tables (the manager
    calls this at every step's start): vLLM binds them once, when a manager
    is built, but code that replaced one is then seen at the next step."""
    cdef _Group g
    plan = self._kvpool_plan
    if plan is None:
        return
    for g in (<ManagerPlan> plan).groups:
        if not _bound(g) and not _bind_tables(g):
            # Out of the scope from now on: vLLM's code serves it.
            self._kvpool_plan = None
            self.coordinator._kvpool_plan = None
            self.kvpool_fallback_reason = _NOT_DICTS
            return


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


cdef Py_ssize_t _free_blocks(ManagerPlan p) except? -1:
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


cdef inline Py_ssize_t _group_new_blocks(_Group g, Py_ssize_t have, Py_ssize_t tokens,
                                         Py_ssize_t main_tokens, Py_ssize_t enc) noexcept:
    # How many blocks the group's allocate_new_blocks takes for a request
    # holding ``have`` (0 or less: none), given the coordinator's ``tokens``:
    # a cross-attention group's are the encoder's, a Mamba group's have its
    # speculative blocks' added, a ring group claims one block if it has none,
    # an align-mode group counts the main model's tokens (positive: the one
    # new state block of _align_new_blocks, after its padding).
    if g.ring:
        return 0 if have > 0 else 1
    if g.cross:
        return _cdiv(enc, g.block_size) - have
    if g.align:
        return _cdiv(main_tokens, g.block_size) + g.nsb - have
    return _cdiv(tokens + g.extra_tokens, g.block_size) - have


cdef inline Py_ssize_t _group_blocks_to_allocate(_Group g, object rid, Py_ssize_t tokens,
                                                 Py_ssize_t enc, object new_computed,
                                                 Py_ssize_t total_computed, Py_ssize_t local,
                                                 bint admission_cap) except -1:
    # The coordinator's get_num_blocks_to_allocate, for one group: a
    # cross-attention group's over the encoder's tokens, none computed.
    if g.cross:
        return _num_blocks_to_allocate(g, rid, enc, None, 0, 0, admission_cap)
    return _num_blocks_to_allocate(g, rid, tokens + g.extra_tokens, new_computed,
                                   total_computed, local, admission_cap)


cdef Py_ssize_t _num_blocks_to_allocate(_Group g, object rid, Py_ssize_t num_tokens,
                                        object new_computed, Py_ssize_t total_computed,
                                        Py_ssize_t num_local, bint admission_cap) except -1:
    # SingleTypeKVCacheManager.get_num_blocks_to_allocate: ``new_computed``
    # is this group's list of new computed blocks, or None for none;
    # ``num_local`` the local computed tokens (a hit ending inside a block, a
    # partial hit, counts the block its copy-on-write takes).
    cdef Py_ssize_t required = _cdiv(num_tokens, g.block_size)
    cdef Py_ssize_t have = 0, skipped = 0, local, n, i, nnew = 0, evictable = 0
    cdef PyObject *blocks
    if g.ring:
        # (its table read with .get, as vLLM's: no entry made)
        blocks = PyDict_GetItemWithError(g.rtb, rid)
        return 0 if blocks != NULL and len(<object> blocks) > 0 else 1
    if admission_cap and g.has_cap and g.cap < required:
        required = g.cap
    blocks = PyDict_GetItemWithError(g.rtb, rid)
    if blocks != NULL:
        have = len(<object> blocks)
    if PyDict_Contains(g.ncb, rid):
        n = required - have  # a running request (it has no new computed blocks)
        return n if n > 0 else 0
    if new_computed is not None:
        nnew = PyList_GET_SIZE(new_computed)
    skipped = _floordiv(_skipped_tokens(g, total_computed), g.block_size)
    local = nnew + have
    n = required - (skipped if skipped > local else local)
    if n < 0:
        n = 0
    # New computed blocks that are eviction candidates leave the free queue
    # when touched: they count too (but for those in the skipped window).
    i = skipped - have
    if i < 0:
        i = 0
    while i < nnew:
        block = <object> PyList_GET_ITEM(new_computed, i)
        if block.ref_cnt == 0 and not block.is_null:
            evictable += 1
        i += 1
    if nnew > 0 and _mod(num_local, g.block_size) != 0:
        n += 1
    return n + evictable


cdef bint _window_has_left(ManagerPlan p, _Group g, object rid, Py_ssize_t processed) except -1:
    # Would the base class's remove_skipped_blocks (a sliding window's, a
    # chunked group's) free a block? It frees backwards from the last
    # skipped block until it meets a null one, so nothing unless that block
    # is not null. Creates the request's entry as vLLM's
    # ``self.req_to_blocks[request_id]`` does.
    cdef Py_ssize_t skipped, nblocks
    skipped = _skipped_tokens(g, processed)
    if skipped <= 0:
        return False
    blocks = _req_blocks(g, rid)
    skipped = _floordiv(skipped, g.block_size)
    nblocks = len(blocks)
    if skipped > nblocks:
        skipped = nblocks
    if skipped <= 0:
        return False
    return blocks[skipped - 1] is not p.null_block


cdef bint _gap_has_left(ManagerPlan p, _Group g, object rid, Py_ssize_t processed,
                        Py_ssize_t prompt) except -1:
    # Would RSWAManager.remove_skipped_blocks(rid, processed, prompt) free a
    # block? It frees the blocks of [cdiv(prompt, bs), max(prompt, processed
    # - rswa_window) // bs), capped at the table's length, backwards until it
    # meets a null one; a request with no table it leaves without one.
    cdef Py_ssize_t first, last, start, nblocks
    cdef PyObject *entry = PyDict_GetItemWithError(g.rtb, rid)
    if entry == NULL:
        if PyErr_Occurred():
            return -1
        return False
    first = _cdiv(prompt, g.block_size)
    start = processed - g.rswa_window
    if start < prompt:
        start = prompt
    last = _floordiv(start, g.block_size)
    nblocks = len(<object> entry)
    if last > nblocks:
        last = nblocks
    if last <= first:
        return False
    return (<object> entry)[last - 1] is not p.null_block


cdef bint _align_has_left(ManagerPlan p, _Group g, object rid, Py_ssize_t processed) except -1:
    # Would an align-mode MambaManager's remove_skipped_blocks(rid,
    # processed) change anything? Its base part frees (or marks retired)
    # the blocks of [retired, (processed - 1) // bs), making the request's
    # entry first; its own part frees the previous step's state block,
    # last_state_block_idx, once processed passes it. Anything unusual (no
    # entry to make, a count that is not an int, an index that is not
    # plainly in range): True, and vLLM's method decides.
    cdef Py_ssize_t skipped = processed - 1, n, first = 0, ls
    cdef PyObject *entry = PyDict_GetItemWithError(g.rtb, rid)
    cdef PyObject *value
    if entry == NULL:
        if PyErr_Occurred():
            return -1
    elif not PyList_CheckExact(<object> entry):
        return True
    if skipped > 0:
        if entry == NULL:
            return True
        n = skipped // g.block_size
        if n > PyList_GET_SIZE(<object> entry):
            n = PyList_GET_SIZE(<object> entry)
        value = PyDict_GetItemWithError(g.retired, rid)
        if value != NULL and not _count(<object> value, &first):
            return True
        if value == NULL and PyErr_Occurred():
            return -1
        if first < 0:
            first = 0
        if first < n:
            return True
    value = PyDict_GetItemWithError(g.last_state, rid)
    if value == NULL:
        if PyErr_Occurred():
            return -1
        return False
    if not _count(<object> value, &ls):
        return True
    if ls >= _cdiv(processed, g.block_size) - 1:
        return False
    if entry == NULL or ls < 0 or ls >= PyList_GET_SIZE(<object> entry):
        return True
    return <object> PyList_GET_ITEM(<object> entry, ls) is not p.null_block


cdef int _free_early(ManagerPlan p, object rid, Py_ssize_t processed, object prompt) except -1:
    # The coordinator's remove_skipped_blocks(rid, processed, prompt): each
    # manager that would free a block is called, in group order (the others'
    # calls change nothing). ``prompt``: num_prompt_tokens, or None.
    cdef _Group g
    cdef Py_ssize_t n_prompt = 0
    for g in p.groups:
        if g.align:
            if _align_has_left(p, g, rid, processed):
                g.mgr.remove_skipped_blocks(rid, processed, prompt)
        elif g.sliding or g.chunked or g.mamba:
            if _window_has_left(p, g, rid, processed):
                g.mgr.remove_skipped_blocks(rid, processed, prompt)
        elif g.rswa and prompt is not None:
            # (a prompt length that is not a count: vLLM's method decides)
            if not _count(prompt, &n_prompt) or _gap_has_left(p, g, rid, processed, n_prompt):
                g.mgr.remove_skipped_blocks(rid, processed, prompt)
    return 0


cdef int _cache(ManagerPlan p, object request, object rid, Py_ssize_t num_tokens,
                bint cap_at_num_tokens) except -1:
    # The coordinator's cache_blocks(request, num_tokens): nothing when no
    # group has a block to cache; when those that do are full-attention
    # groups whose block is the hash block, what their managers'
    # cache_blocks do -- the pool's cache_full_blocks over the new full
    # blocks, then the cached count -- called here, group by group in the
    # coordinator's order; in any other case the coordinator's own method.
    #
    # A group caches only when its full blocks pass its cached ones, over
    # its cacheable tokens: the unitary coordinator hands it num_tokens -
    # num_reprefillable_tokens, the hybrid one its own count
    # (_hybrid_cacheable); 0.33 caps them at the request's hashed tokens.
    # A full-attention group whose block is larger than the hash block may
    # register a partial tail on any step, and an align-mode Mamba group
    # may cache a partial tail or re-key a checkpoint: vLLM's code decides
    # for them whenever that is not provably nothing.
    #
    # With ``cap_at_num_tokens`` (allocate_slots), ``num_tokens`` is capped
    # at the request's ``num_tokens`` first -- read only if a group could
    # cache without the cap (a decode step seldom fills a block).
    cdef _Group g
    cdef Py_ssize_t cacheable, full, cached, hashed = -1, i, ntodo = 0
    cdef Py_ssize_t todo_cached[64]
    cdef Py_ssize_t todo_full[64]
    cdef int todo_index[64]
    cdef PyObject *entry
    if cap_at_num_tokens:
        if _nothing_to_cache(p, rid, num_tokens):
            p.n_cache_skips += 1
            return 0
        cached = request.num_tokens
        if cached < num_tokens:
            num_tokens = cached
    if p.cap_at_hashed:
        hashed = len(request.block_hashes) * p.hash_block_size
    if p.ngroups > 64:
        return _cache_in_vllm(p, request, num_tokens)
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        if not g.caches:
            continue
        if g.align and not _align_tail_idle(p, g, request, rid, num_tokens):
            return _cache_in_vllm(p, request, num_tokens)
        if p.hybrid:
            cacheable = _hybrid_cacheable(p, g, num_tokens)
        else:
            cacheable = num_tokens - p.reprefillable
            if cacheable < 0:
                cacheable = 0
        if 0 <= hashed < cacheable:
            cacheable = hashed
        full = _floordiv(cacheable, g.block_size)
        entry = PyDict_GetItemWithError(g.ncb, rid)
        if entry == NULL:
            cached = 0
        elif not _count(<object> entry, &cached):
            return _cache_in_vllm(p, request, num_tokens)  # not an int: vLLM's code sees it
        if cached < full:
            # (a partial-tail group's full blocks first: caching them may
            # promote its tail block's partial key, which its tail step then
            # registers again)
            if not g.direct_cache or g.partial_tail:
                return _cache_in_vllm(p, request, num_tokens)
            todo_index[ntodo] = i
            todo_cached[ntodo] = cached
            todo_full[ntodo] = full
            ntodo += 1
        elif g.partial_tail and not _full_tail_idle(p, g, request, rid):
            return _cache_in_vllm(p, request, num_tokens)
    if ntodo == 0:
        p.n_cache_skips += 1
        return 0
    p.n_cache_direct += 1
    for i in range(ntodo):
        g = <_Group> p.groups[todo_index[i]]
        if p.core_caches and g.block_size == p.hash_block_size:
            _core_caches(p, g, request, _req_blocks(g, rid), todo_cached[i], todo_full[i])
        else:
            p.pool.cache_full_blocks(
                request=request,
                blocks=_req_blocks(g, rid),
                num_cached_blocks=todo_cached[i],
                num_full_blocks=todo_full[i],
                block_size=g.block_size,
                kv_cache_group_id=g.group_id,
                block_mask=None,
            )
        g.ncb[rid] = todo_full[i]
    return 0


cdef int _core_caches(ManagerPlan p, _Group g, object request, object blocks,
                      Py_ssize_t cached, Py_ssize_t full) except -1:
    # kvpool's facade cache_full_blocks (kvpool.v0_33.block_pool) for a group
    # whose block is the hash block and has no mask (cached < full): the
    # core's _cache_run33, then with events the same events in the same
    # order -- the BlockRemoved of promoted partial keys, then one
    # BlockStored built by the line's own _build_block_stored_event, with the
    # line's extra keys and lookahead -- without the facade's Python between.
    cdef PoolCore core = <PoolCore> p.pool_core
    cdef Py_ssize_t i, bs = g.block_size, lookahead = 0
    hashes = request.block_hashes
    if not core._events:
        core._cache_run33(blocks, cached, full, hashes, 1, g.group_id, bs, None, None, None)
        return 0
    removed = []
    stored = []
    core._cache_run33(blocks, cached, full, hashes, 1, g.group_id, bs, None, removed, stored)
    pool = p.pool
    if PyList_GET_SIZE(removed):
        pool._emit_block_removed_events(removed)
    use_int = _use_int_block_hashes()
    parent = None if cached == 0 else _event_hash(hashes[cached - 1], use_int)
    n = PyList_GET_SIZE(stored)
    converted = PyList_New(n)
    for i in range(n):
        h = _event_hash(<object> PyList_GET_ITEM(stored, i), use_int)
        Py_INCREF(h)
        PyList_SET_ITEM(converted, i, h)
    # Lookahead block hashes (0.33 on): each stored block's event carries
    # the tokens after it that its hash covers; built here when every block
    # of the run was stored (a full-attention group has no null blocks).
    if p.stored_lookahead:
        lookahead = pool.num_hash_lookahead_tokens
    if (p.stored_cls is not None and _plain(p, pool, request)
            and (lookahead == 0 or n == full - cached)):
        pool.kv_event_queue.append(_plain_stored(
            p, pool, request, converted, parent, cached * bs, full * bs, bs, g.group_id,
            lookahead))
        p.n_plain_events += 1
        return 0
    indices = [i for i in range(cached, full) if not blocks[i].is_null]
    pool.kv_event_queue.append(pool._build_block_stored_event(
        request,
        block_hashes=converted,
        parent_block_hash=parent,
        start_token_idx=cached * bs,
        end_token_idx=full * bs,
        block_size=bs,
        kv_cache_group_id=g.group_id,
        extra_keys_list=pool._event_extra_keys(request, indices, bs),
        lookahead_token_ids=pool._event_lookahead(request, [(i + 1) * bs for i in indices]),
    ))
    return 0


cdef object _event_hash(object h, bint use_int):
    # kvpool.hashing.maybe_convert_block_hash (and convert_block_hashes, the
    # same per hash): the low 64 bits of the hash's big-endian value -- its
    # last eight bytes -- or the bytes themselves.
    if not use_int:
        return h
    if not PyBytes_CheckExact(h):
        return _maybe_convert_block_hash(h)
    return PyLong_FromUnsignedLongLong(
        _be_tail(<const unsigned char *> PyBytes_AS_STRING(h), PyBytes_GET_SIZE(h), 8))


cdef bint _nothing_to_cache(ManagerPlan p, object rid, Py_ssize_t num_tokens) except -1:
    # True if no group could cache a block at num_tokens (an upper bound of
    # what _cache gives each group): each one's full blocks at num_tokens
    # are no more than its cached ones, and no group registers partial tails.
    cdef _Group g
    cdef Py_ssize_t cached
    cdef PyObject *entry
    if not p.hybrid and p.reprefillable < 0:
        num_tokens -= p.reprefillable
    for g in p.groups:
        if not g.caches:
            continue
        if g.partial_tail or g.align:
            return False
        entry = PyDict_GetItemWithError(g.ncb, rid)
        if entry == NULL:
            cached = 0
        elif not _count(<object> entry, &cached):
            return False
        if cached < _floordiv(num_tokens, g.block_size):
            return False
    return True


cdef bint _full_tail_idle(ManagerPlan p, _Group g, object request, object rid) except -1:
    # Whether a full-attention group's prompt-tail step (FullAttentionManager
    # ._cache_partial_tail_block, its block larger than the hash block)
    # would do nothing, whatever tokens the coordinator hands it: its
    # boundary (the prompt's last hash boundary: below num_prompt_tokens - 1
    # without EAGLE from 0.32 on, below num_prompt_tokens otherwise; 0.33
    # caps it at the hashed tokens: a boundary past them, checked first,
    # sends the call to vLLM) is
    # none, or a block's end, or in a block beyond the table, or in a null
    # block; or the pool's cache_partial_block finds the key on that very
    # block already ("already cached": no key, no event). The last is read
    # off the compiled core's map: its first block under the key is this
    # block (another block first: vLLM's code decides). Anything unusual --
    # no table (vLLM's defaultdict would add one), hashes not an exact list
    # of bytes -- is not idle. Called only when the group has no full block
    # to cache (a full block cached first may drop the partial key).
    cdef Py_ssize_t prompt, limit, nh, boundary, idx, H = p.hash_block_size
    cdef PyObject *hit
    if not _count(request.num_prompt_tokens, &prompt):
        return False
    limit = prompt if (g.use_eagle or not p.tail_eagle_limit) else prompt - 1
    nh = _floordiv(limit, H)
    if nh <= 0:
        return nh == 0  # (below: vLLM's code, on a prompt of no tokens)
    # (first: past the hashed tokens 0.33's boundary is another one)
    hashes = request.block_hashes
    if not PyList_CheckExact(hashes) or nh > PyList_GET_SIZE(hashes):
        return False
    boundary = nh * H
    if boundary % g.block_size == 0:
        return True
    table = _exact_table(g, rid)
    if table is None:
        return False
    idx = boundary // g.block_size
    if idx >= PyList_GET_SIZE(table):
        return True
    block = <object> PyList_GET_ITEM(table, idx)
    if block is p.null_block:
        return True
    if not p.map_direct:
        return False
    key = <object> PyList_GET_ITEM(hashes, nh - 1)
    if not PyBytes_Check(key) or not (0 <= g.group_id <= 0xFFFFFFFF):
        return False
    hit = (<PoolCore> p.pool_core)._map.get_hg_ptr(<PyObject *> key, <uint32_t> g.group_id)
    return hit == <PyObject *> block


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


cdef bint _align_tail_idle(ManagerPlan p, _Group g, object request, object rid,
                           Py_ssize_t num_tokens) except -1:
    # Whether an align-mode Mamba group's partial-tail step would do nothing
    # when the coordinator caches ``num_tokens``: no checkpoint is pending
    # (its branch re-keys or evicts the checkpoint block), and for the
    # group's cacheable tokens n (the coordinator's arithmetic, below) its
    # prompt-tail branch returns before any change: n is none, or past the
    # prompt (the prompt's tail and a shared-prefix boundary are within
    # it), or the block it would key is beyond the table or null (a state
    # already freed: a decode step's usual case). Its base part is _cache's
    # full-block test, as any group's.
    cdef Py_ssize_t n, prompt, b
    if PyDict_Contains(g.ckpts, rid):
        return False
    if p.hybrid:
        n = _hybrid_cacheable(p, g, num_tokens)
    else:
        n = num_tokens - p.reprefillable
    if n <= 0:
        return True
    if not _count(request.num_prompt_tokens, &prompt):
        return False
    if n > prompt:
        return True
    b = _cdiv(n, g.block_size) - 1 if p.tail_cdiv else n // g.block_size
    table = _exact_table(g, rid)
    if table is None:
        return False  # (vLLM's code would make the entry, or read it)
    return b >= PyList_GET_SIZE(table) or <object> PyList_GET_ITEM(table, b) is p.null_block


cdef int _cache_in_vllm(ManagerPlan p, object request, Py_ssize_t num_tokens) except -1:
    p.n_cache_calls += 1
    p.coordinator.cache_blocks(request, num_tokens)
    return 0


cdef object _to_adopt(ManagerPlan p, object rid, object new_computed_blocks,
                      Py_ssize_t num_local_computed, bint *partial):
    # What allocate_slots adopts: None when vLLM skips
    # allocate_new_computed_blocks (no blocks given, or the manager's empty
    # ones), else the tuple of per-group lists; _VLLM for a case left to
    # vLLM (a running request given empty lists, a partial-hit copy-on-write
    # pending, blocks that are not a tuple of lists, a partial local hit
    # _cow_ok does not take). Where vLLM's code would fail an assert (hits
    # for a running request, for a request that has blocks already, or with
    # caching off), a ValueError here, before anything changed. ``partial``
    # is set when a group's hit ends inside a block (a partial hit, copied
    # on write), or a running request's copy-on-write is pending.
    cdef _Group g
    cdef Py_ssize_t i
    cdef PyObject *have
    for g in p.groups:
        if PyDict_Contains(g.phr, rid):
            # (a running request's, from an align-mode group's prompt-tail
            # step: copied on write by _align_new_blocks; _align_steady
            # checks the rest)
            if not (g.align and PySet_Contains(g.allocated, rid) == 1):
                return _VLLM
            partial[0] = True
    if new_computed_blocks is None:
        return None
    blocks = new_computed_blocks.blocks
    if blocks is p.empty_blocks:
        return None
    if not PyTuple_CheckExact(blocks) or len(blocks) != p.ngroups:
        return _VLLM
    running = False
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        group_blocks = blocks[i]
        if not PyList_CheckExact(group_blocks):
            return _VLLM
        if PyDict_Contains(g.ncb, rid):
            if PyList_GET_SIZE(group_blocks) > 0:
                raise ValueError(
                    f"request {rid!r} is running: it has no new computed blocks to adopt "
                    f"(got {PyList_GET_SIZE(group_blocks)} for KV-cache group {i})")
            running = True
    if running:
        return _VLLM  # vLLM's code skips the adoption
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        group_blocks = blocks[i]
        have = PyDict_GetItemWithError(g.rtb, rid)
        # (vLLM asserts an empty table for every group but a ring one)
        if have != NULL and len(<object> have) != 0 and not g.ring:
            raise ValueError(
                f"request {rid!r} already has {len(<object> have)} blocks in KV-cache group "
                f"{i}: only a request without blocks adopts computed blocks")
        if PyList_GET_SIZE(group_blocks) > 0:
            if not g.caching:
                raise ValueError(
                    f"prefix caching is off: request {rid!r} cannot adopt computed blocks")
            if _mod(num_local_computed, g.block_size) != 0:
                if not _cow_ok(g, group_blocks, num_local_computed):
                    return _VLLM
                partial[0] = True
    return blocks


cdef bint _cow_ok(_Group g, list hits, Py_ssize_t num_local_computed) except -1:
    # Whether a group's partial local hit (``hits`` not empty, ending inside
    # a block) is one done here: the base class's adoption and
    # copy-on-write, and what vLLM asserts of it holds -- the hit's last
    # block, not null, is the one at the hit's block index once the skipped
    # blocks (a window's) are nulls. A ring group's manager has its own
    # methods, and a hit all skipped would count a block it never takes:
    # vLLM's code.
    cdef Py_ssize_t n = PyList_GET_SIZE(hits)
    if g.ring or g.cross:
        return False
    if _floordiv(_skipped_tokens(g, num_local_computed), g.block_size) >= n:
        return False
    return (num_local_computed // g.block_size == n - 1
            and not (<object> PyList_GET_ITEM(hits, n - 1)).is_null)


cdef bint _takes_external(ManagerPlan p, object rid) except -1:
    # External tokens are adopted here only by a request that has no blocks
    # and is not running in any group (vLLM's coordinator skips a running
    # one; it asserts an empty table): anything else goes to vLLM's code.
    cdef _Group g
    cdef PyObject *have
    for g in p.groups:
        if PyDict_Contains(g.ncb, rid):
            return False
        have = PyDict_GetItemWithError(g.rtb, rid)
        if have != NULL and len(<object> have) != 0:
            return False
    return True


cdef int _adopt(ManagerPlan p, object rid, object blocks, Py_ssize_t num_local_computed,
                Py_ssize_t ext, object skip_zeroing) except -1:
    # The coordinator's allocate_new_computed_blocks: each group's
    # add_local_computed_blocks (the checks of _to_adopt passed: no blocks
    # yet; ``blocks`` None: no local ones) -- a partial hit recorded for
    # its copy-on-write, the cached count at the hit's block -- then with
    # external tokens each group's allocate_external_computed_blocks -- two
    # passes, so that no group's new blocks evict another's hits.
    cdef _Group g
    cdef Py_ssize_t i, skipped, total = num_local_computed + ext, n, kept
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        if g.ring:
            continue  # (its add_local_computed_blocks does nothing)
        req_blocks = _req_blocks(g, rid)
        new = blocks[i] if blocks is not None else []
        skipped = _floordiv(_skipped_tokens(g, total), g.block_size)
        if skipped > 0:
            new = new[skipped:]
        if g.caching:
            p.pool.touch(new)
        if skipped > 0:
            req_blocks.extend([p.null_block] * skipped)
        req_blocks.extend(new)
        g.ncb[rid] = len(req_blocks)
        if len(new) > 0 and _mod(num_local_computed, g.block_size) != 0:
            i = num_local_computed // g.block_size
            g.phr[rid] = (i, new[len(new) - 1])
            g.ncb[rid] = i
    if ext <= 0:
        return 0
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        # Of the external tokens, those the group has not skipped.
        kept = ext
        skipped = _skipped_tokens(g, total)
        if skipped > 0 and total - skipped < ext:
            kept = total - skipped
        if kept <= 0:
            continue
        req_blocks = _req_blocks(g, rid)
        if g.ring:
            n = 0 if len(req_blocks) else 1  # (its ring block claimed)
        else:
            n = _cdiv(total, g.block_size) - len(req_blocks)
        if n <= 0:
            continue
        new = _new_blocks(p, n)
        req_blocks.extend(new)
        if g.record_ids and (skip_zeroing is None or g.group_id not in skip_zeroing):
            g.mgr.new_block_ids.extend([b.block_id for b in new])
    return 0


cdef bint _plain(ManagerPlan p, object pool, object request) except -1:
    # The request has no extra keys (the facade's _event_extra_keys gives
    # None per block, with lookahead hashes too). The four fields are
    # _event_extra_keys' test in kvpool/v0_33/block_pool.py: change both
    # together.
    return not (
        request.lora_request
        or request.mm_features
        or request.cache_salt
        or request.prompt_embeds is not None
    )


cdef object _plain_stored(ManagerPlan p, object pool, object request, list hashes,
                          object parent, Py_ssize_t start, Py_ssize_t end,
                          Py_ssize_t block_size, Py_ssize_t group_id,
                          Py_ssize_t lookahead):
    # The line's _build_block_stored_event for a plain request, its
    # keywords in its order: the hashes (already converted), the parent,
    # the tokens the blocks hold, the block size, the group, the medium, the
    # session id, None per block as extra keys (None for no block), None
    # for LoRA, and the lookahead tokens: None without lookahead hashes,
    # else per block (each block of start..end stored) the ``lookahead``
    # tokens after it, as the facade's _event_lookahead slices them.
    cdef PyObject *values[16]   # borrowed: every value is held by a local below
    cdef Py_ssize_t i, n = PyTuple_GET_SIZE(p.stored_kwnames)
    cdef Py_ssize_t k, e, count
    # (typed: an untyped local assigned a C integer would be one)
    cdef object all_tokens = request.all_token_ids
    cdef object tokens = all_tokens[start:end]
    cdef object ahead = None
    if lookahead > 0:
        count = (end - start) // block_size
        ahead = PyList_New(count)
        for k in range(count):
            e = start + (k + 1) * block_size
            item = all_tokens[e:e + lookahead]
            Py_INCREF(item)
            PyList_SET_ITEM(ahead, k, item)
    cdef object size = block_size
    cdef object gid = group_id
    cdef object medium = pool._event_medium
    cdef object session = request.session_id
    cdef object extra = [None] * PyList_GET_SIZE(hashes) if PyList_GET_SIZE(hashes) else None
    cdef PyObject *by_code[10]   # in _STORED_CODES' order
    by_code[0] = <PyObject *> hashes
    by_code[1] = <PyObject *> parent
    by_code[2] = <PyObject *> tokens
    by_code[3] = <PyObject *> size
    by_code[4] = <PyObject *> gid
    by_code[5] = <PyObject *> medium
    by_code[6] = <PyObject *> session
    by_code[7] = <PyObject *> extra
    by_code[8] = <PyObject *> None
    by_code[9] = <PyObject *> ahead
    for i in range(n):
        values[i] = by_code[p.stored_codes[i]]  # a code is 0..9 (_plan_stored_events)
    return PyObject_Vectorcall(p.stored_cls, values, 0, p.stored_kwnames)


# The marker of "not decided here": the caller hands the call to vLLM.
cdef object _VLLM = object()


cdef bint _align_steady(ManagerPlan p, object rid, Py_ssize_t main_tokens,
                        object adopt) except -1:
    # Whether, for a call with no external tokens (the caller checked;
    # ``adopt``: _to_adopt's hits, or None), every align-mode Mamba group's
    # part of allocate_slots is one of those done here. Then:
    # - the request has had its blocks (_allocated_block_reqs) and its
    #   table already holds cdiv(main_tokens, bs) + num_speculative_blocks
    #   blocks: vLLM counts no new block and takes allocate_new_blocks'
    #   fast path;
    # - it has had its blocks and its table is short: vLLM counts one block
    #   (its cap, in every release), records the previous state's index,
    #   pads the table with null blocks up to the new state's slot, moves
    #   the speculative blocks the step leaves behind to the end, and takes
    #   one new block -- after the padding and the moves the table is always
    #   one block short;
    # - it has no blocks yet (its first allocation): vLLM counts 1 +
    #   num_speculative_blocks (its cap, in every release) and the hit's
    #   evictable blocks; after the hit's adoption (base code: its state
    #   block kept, nulls before it) it records the hit state's index, pads
    #   the table with null blocks up to the new state's slot and takes
    #   that many. A hit whose state block was cached in this very step is
    #   refused by the count (the state is not there yet: _align_count).
    # A prefill checkpoint changes each case: the predictor decides it
    # (_align_checkpoint) and records or drops it, the count allows one
    # block more, and the allocation keeps a real block at the
    # checkpoint's index. A checkpoint left by the last step's predictor
    # is this step's predictor's to record again or drop, before anything
    # reads it. A copy-on-write does too: a new request's partial hit
    # (_to_adopt, _cow_ok), or a running request's pending one that its
    # prompt-tail step recorded (checked here: _cow_pending_ok) -- one
    # block more, the first taken (_apply_cow, _running_cow). What is left
    # to vLLM here: a running request whose speculative blocks to move are
    # not writable, or a table that is not what vLLM's asserts expect.
    # (_align_count and _align_new_blocks do what vLLM's code does.)
    cdef _Group g
    cdef int member
    cdef Py_ssize_t have, slot, i, k
    cdef PyObject *entry
    for k in range(p.ngroups):
        g = <_Group> p.groups[k]
        if not g.align:
            continue
        member = PySet_Contains(g.allocated, rid)
        if member == 0:
            # (no table yet, or the empty one a predictor made)
            entry = PyDict_GetItemWithError(g.rtb, rid)
            if entry != NULL and not (PyList_CheckExact(<object> entry)
                                      and PyList_GET_SIZE(<object> entry) == 0):
                return False
            continue
        if member != 1:
            return False
        table = _exact_table(g, rid)
        if table is None:
            return False
        have = PyList_GET_SIZE(table)
        entry = PyDict_GetItemWithError(g.phr, rid)
        if entry != NULL and not _cow_pending_ok(g, rid, table, <object> entry):
            return False
        slot = _cdiv(main_tokens, g.block_size) - 1
        if g.nsb == 0 or slot + 1 + g.nsb <= have:
            continue
        # (vLLM asserts each moved block writable: its own, unhashed)
        if have < g.nsb:
            return False
        for i in range(have - g.nsb, have):
            if i >= slot:
                break
            if not p.pool.is_block_writable(<object> PyList_GET_ITEM(table, i)):
                return False
    return True


cdef bint _cow_pending_ok(_Group g, object rid, list table, object hit) except -1:
    # Whether a running request's pending copy-on-write (``hit``, its
    # prompt-tail step's (block index, source block)) is what vLLM asserts:
    # the source is the table's block at that index, and the producer's
    # tail, if recorded, is that block.
    cdef Py_ssize_t idx
    if not (PyTuple_CheckExact(hit) and PyTuple_GET_SIZE(hit) == 2
            and _count(<object> PyTuple_GET_ITEM(hit, 0), &idx)
            and 0 <= idx < PyList_GET_SIZE(table)
            and <object> PyList_GET_ITEM(table, idx) is <object> PyTuple_GET_ITEM(hit, 1)):
        return False
    tail = g.mgr._producer_partial_tail_reqs.get(rid)
    return tail is None or (PyTuple_CheckExact(tail) and PyTuple_GET_SIZE(tail) == 2
                            and <object> PyTuple_GET_ITEM(tail, 0)
                            is <object> PyTuple_GET_ITEM(hit, 1))


cdef Py_ssize_t _align_checkpoint(ManagerPlan p, _Group g, object rid, list blocks,
                                  Py_ssize_t start, Py_ssize_t end,
                                  Py_ssize_t prefill_end) except -1:
    # The prefill checkpoint an align-mode group's predictor keeps for the
    # chunk of tokens [start, end), 0 for none (vLLM's position, then its
    # _needs_internal_checkpoint): the last granule boundary at or below
    # end - ckpt_back, one granule lower with EAGLE's drop; kept if the
    # group reserves checkpoint blocks, the backend can export it -- the
    # chunk starts on a hash block, crosses a state block, and the position
    # is a hash block past its start, before its end, on the spec's
    # alignment from its start -- the chunk reaches the prefill's end
    # (0.31 on, and only when the coordinator's retention_interval is 0:
    # just the states a later request can resume at kept; read on each
    # call, as vLLM reads it, since vLLM's own tests set it on a built
    # manager), and the block at the checkpoint's index, cdiv(end, bs) - 2,
    # is not yet the request's own: beyond its table, null, or one of a
    # running request's speculative blocks.
    # ``blocks``: the group's table of the request (as vLLM's, made);
    # ``prefill_end``: read by _allocate only for a chunk that can keep one.
    cdef Py_ssize_t pos, idx, have, h = p.hash_block_size
    if g.ckpt_align == 0:  # (set only for a group with checkpoint blocks)
        return 0
    pos = _floordiv(end - g.ckpt_back, g.ckpt_every) * g.ckpt_every
    if g.ckpt_drop:
        pos -= g.ckpt_every
    idx = _cdiv(end, g.block_size) - 2
    if not (_mod(start, h) == 0 and idx > _floordiv(start - 1, g.block_size)
            and start + h <= pos and start < pos < end
            and (pos - start) % g.ckpt_align == 0 and idx >= 0):
        return 0
    if p.has_prefill_end and end < prefill_end and p.coordinator.retention_interval == 0:
        return 0
    have = PyList_GET_SIZE(blocks)
    if (idx >= have or <object> PyList_GET_ITEM(blocks, idx) is p.null_block
            or (PySet_Contains(g.allocated, rid) == 1 and idx >= have - g.nsb)):
        return pos
    return 0


cdef inline Py_ssize_t _align_cap(ManagerPlan p, _Group g, bint allocated, bint cb,
                                  bint partial):
    # vLLM's cap on the blocks an align-mode group takes in one call, the
    # one rule its predictor and its allocate_new_blocks share: one, a
    # block more for a partial hit's copy-on-write (``partial``) and for a
    # checkpoint (``cb``), and the speculative blocks for a request that has
    # had none (not ``allocated``) or, on 0.30 and 0.31, in a checkpoint
    # step.
    cdef Py_ssize_t cap = 1 + partial + cb
    if not allocated or (cb and p.align_rules < 32):
        cap += g.nsb
    return cap


cdef Py_ssize_t _align_count(ManagerPlan p, _Group g, object rid, Py_ssize_t start,
                             Py_ssize_t main_tokens, Py_ssize_t prefill_end, object hits,
                             bint partial, bint record) except? -1:
    # An align-mode group's get_num_blocks_to_allocate in the cases of
    # _align_steady (``hits``: its list of the hit's blocks, or None), for
    # the chunk from ``start`` to ``main_tokens``. A hit whose last block
    # was cached in this very step is refused first: more blocks than the
    # pool has, nothing recorded. Else the blocks its table and the hit
    # lack (none, or less than none; with a copy-on-write, ``partial``, at
    # least none, and one more), capped (_align_cap; align_rules: 0.30
    # assigns the cap, and leaves a running request's checkpoint step
    # uncapped); then the hit's blocks that leave the free queue when
    # touched (every one of them, as vLLM's count, though the adoption
    # keeps only the last). Its table is looked up as vLLM's predictor
    # does: a request without one gets an empty one. ``record`` (not the
    # admission's count): the checkpoint is recorded in _checkpoints, or
    # dropped from it.
    cdef list blocks
    cdef Py_ssize_t n, i, nhits = 0, pos, cap
    cdef bint allocated, cb
    if hits is not None:
        nhits = PyList_GET_SIZE(hits)
        if nhits > 0 and (<object> PyList_GET_ITEM(hits, nhits - 1)).block_hash \
                in g.mgr.cached_blocks_this_step:
            # (vLLM's refusal of a hit on a state cached in this very step:
            # more blocks than the pool has, nothing recorded)
            return p.pool.num_gpu_blocks + 1
    blocks = _req_blocks(g, rid)
    n = _cdiv(main_tokens, g.block_size) + g.nsb - PyList_GET_SIZE(blocks) - nhits
    if partial:
        n = (n if n > 0 else 0) + 1
    pos = _align_checkpoint(p, g, rid, blocks, start, main_tokens, prefill_end)
    cb = pos > 0
    if record:
        if cb:
            g.ckpts[rid] = (pos, _cdiv(main_tokens, g.block_size) - 2)
        elif PyDict_Contains(g.ckpts, rid):
            del g.ckpts[rid]
    if n > 0:
        allocated = PySet_Contains(g.allocated, rid) == 1
        cap = _align_cap(p, g, allocated, cb, partial)
        if p.align_rules == 30:
            if not (cb and allocated):
                n = cap
        elif cap < n:
            n = cap
    for i in range(nhits):
        block = <object> PyList_GET_ITEM(hits, i)
        if block.ref_cnt == 0 and not block.is_null:
            n += 1
    return n


cdef list _align_new_blocks(ManagerPlan p, _Group g, object rid, list blocks,
                            Py_ssize_t main_tokens):
    # An align-mode group's allocate_new_blocks past its fast path (a table
    # short of blocks, a checkpoint recorded, or a new request's partial
    # hit; a running request's pending copy-on-write is vLLM's:
    # _align_steady has seen to it). The previous state's index recorded
    # (a running request's; after a hit, the hit state's); null blocks up
    # to the new state's slot, or to the checkpoint's index just below it;
    # a running request's speculative blocks before that moved to the end,
    # a null left in their place (align_rules: 0.30, 0.31 move none in a
    # checkpoint step, and 0.32 on stop at the checkpoint's index); then the
    # blocks the table lacks taken -- no more than _align_cap allows, or
    # vLLM's assertion fails here as there -- and the request marked
    # allocated. A partial hit (_adopt recorded it) takes a block more, the
    # first, which takes the hit block's place (_apply_cow). Returns what
    # vLLM's returns: the copy-on-write block, the table's new tail, the
    # new blocks.
    cdef Py_ssize_t prev = PyList_GET_SIZE(blocks), i, n, stop
    cdef Py_ssize_t slot = _cdiv(main_tokens, g.block_size) - 1
    cdef bint allocated = PySet_Contains(g.allocated, rid) == 1
    cdef bint cb = PyDict_Contains(g.ckpts, rid) == 1
    cdef PyObject *hit = PyDict_GetItemWithError(g.phr, rid)
    if allocated:
        g.last_state[rid] = prev - 1 - g.nsb
    elif prev > 0:
        g.last_state[rid] = prev - 1
    if prev < slot - cb:
        blocks.extend([p.null_block] * (slot - cb - prev))
    if allocated and (p.align_rules >= 32 or not cb):
        stop = slot - cb
        for i in range(prev - g.nsb, prev):  # (prev >= nsb: _align_steady)
            if i >= stop:
                break
            blocks.append(<object> PyList_GET_ITEM(blocks, i))
            blocks[i] = p.null_block
    n = slot + 1 + g.nsb - PyList_GET_SIZE(blocks)
    if n < 0:
        n = 0
    n += hit != NULL
    if n > _align_cap(p, g, allocated, cb, hit != NULL):
        raise AssertionError()  # (vLLM's, after the same padding and moves)
    new = _new_blocks(p, n) if n > 0 else []
    returned = blocks[prev:]
    if hit != NULL:
        cow = <object> PyList_GET_ITEM(new, 0)
        if allocated:
            _running_cow(p, g, rid, blocks, <object> hit, cow)  # (hit: g.phr's until below)
        else:
            _apply_cow(g, blocks, <object> hit, cow)
            returned.insert(0, cow)
        del new[0]
        del g.phr[rid]
    blocks.extend(new)
    returned.extend(new)
    PySet_Add(g.allocated, rid)
    return returned


cdef int _running_cow(ManagerPlan p, _Group g, object rid, list blocks, object hit,
                      object cow) except -1:
    # An align-mode group's copy-on-write for a running request (its
    # prompt-tail step recorded ``hit``; _cow_pending_ok checked it before
    # anything changed, and vLLM's asserts are made again here, where
    # vLLM's are, in case its own frees moved the table since): the
    # request stays on its source block (a running table is append-only for
    # the worker), and the cache's entries move to ``cow`` instead, the copy
    # queued; the source holds a reference more until it has run. A
    # producer's boundary state, now in ``cow``, is handed to the connector,
    # and a same-step hit on the moved entry is deferred.
    idx, source = hit
    if not (0 <= idx < PyList_GET_SIZE(blocks) and blocks[idx] is source):
        raise AssertionError()
    p.pool.move_block_hashes(source, cow)
    mgr = g.mgr
    mgr._pending_cow_copies.append((source, cow))
    source.ref_cnt += 1
    tail = mgr._producer_partial_tail_reqs.pop(rid, None)
    if tail is not None:
        if tail[0] is not source:
            raise AssertionError()
        mgr._pending_boundary_state_offloads.append((rid, g.group_id, cow, tail[1]))
    if cow.block_hash is not None:
        mgr.cached_blocks_this_step.add(cow.block_hash)
    return 0


cdef int _apply_cow(_Group g, list blocks, object hit, object cow) except -1:
    # The base class's _apply_cow for a new request's partial hit ``hit``
    # (its (block index, source block), _adopt's): ``cow`` takes the
    # source's place in the table, the copy is queued, and ``cow`` holds a
    # reference more until the copy has run (vLLM's asserts are _cow_ok's).
    idx, source = hit
    blocks[idx] = cow
    g.mgr._pending_cow_copies.append((source, cow))
    cow.ref_cnt += 1
    return 0


cdef list _cow_new_blocks(ManagerPlan p, _Group g, object rid, list blocks, Py_ssize_t nnew):
    # The base class's allocate_new_blocks for a new request with a partial
    # hit: its copy-on-write block taken first, on its own, and its id
    # recorded for zeroing (whatever the group records), then ``nnew``
    # blocks as on any step.
    hit = g.phr.pop(rid)
    cow = _new_blocks(p, 1)[0]
    _apply_cow(g, blocks, hit, cow)
    g.mgr.new_block_ids.append(cow.block_id)
    if nnew <= 0:
        return [cow]
    new = _new_blocks(p, nnew)
    blocks.extend(new)
    if g.record_ids:
        g.mgr.new_block_ids.extend([b.block_id for b in new])
    new.insert(0, cow)
    return new


cdef object _allocate(self, request, num_new_tokens, num_new_computed_tokens,
                      new_computed_blocks, num_lookahead_tokens,
                      num_external_computed_tokens, delay_cache_blocks,
                      num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                      has_scheduled_reqs, skip_zeroing):
    # KVCacheManager.allocate_slots, or _VLLM before anything changed.
    # ``skip_zeroing``: the groups whose external-token blocks are not
    # recorded for zeroing (0.32 on), None where the release has no such
    # argument (every group records). A cross-attention group's tokens are
    # the encoder's (``num_encoder_tokens``, uncapped), as the coordinator's.
    cdef ManagerPlan p
    cdef _Group g
    cdef Py_ssize_t new_tokens, new_computed, lookahead, reserved, computed, watermark = 0
    cdef Py_ssize_t full_tokens, need, main_tokens, processed, required, i, nnew, ext, total
    cdef Py_ssize_t enc = 0, prefill_end = 0
    cdef bint any_new, adopts, partial = False
    plan = self._kvpool_plan
    if (
        plan is None
        or not _count(num_new_tokens, &new_tokens)
        or not _count(num_new_computed_tokens, &new_computed)
        or not _count(num_external_computed_tokens, &ext)
        # vLLM raises for no new tokens and nothing to adopt (0.30: for no
        # new tokens and no external ones, even with computed tokens to adopt)
        or (new_tokens == 0 and ext == 0
            and (new_computed == 0 or not (<ManagerPlan> plan).zero_chunk_adopts))
        or new_tokens < 0 or new_computed < 0 or ext < 0
        or (ext > 0 and skip_zeroing is not None and not PyTuple_CheckExact(skip_zeroing))
        or not _count(num_lookahead_tokens, &lookahead)
        or not _count(reserved_blocks, &reserved)
        or not _count(request.num_computed_tokens, &computed)
        or ((<ManagerPlan> plan).has_cross and not _count(num_encoder_tokens, &enc))
    ):
        if plan is not None:
            (<ManagerPlan> plan).n_base += 1
        return _VLLM
    p = <ManagerPlan> plan
    computed += new_computed  # num_local_computed_tokens
    rid = request.request_id
    adopt = _to_adopt(p, rid, new_computed_blocks, computed, &partial)
    # (a hit to adopt: _to_adopt has seen the request hold no blocks and not
    # run, what _takes_external checks; a partial hit's adoption here takes
    # no external tokens)
    if adopt is _VLLM or (ext > 0 and (partial or adopt is None and not _takes_external(p, rid))
                          ) or (p.has_cross and (adopt is not None or ext > 0)):
        p.n_base += 1
        return _VLLM
    adopts = adopt is not None or ext > 0
    total = computed + ext
    if total > p.max_model_len:
        total = p.max_model_len
    main_tokens = total + new_tokens
    if p.has_align and (ext > 0 or not _align_steady(p, rid, main_tokens, adopt)) or (
            p.mamba_hits and adopt is not None):
        p.n_base += 1
        return _VLLM
    if p.has_prefill_end and p.align_ckpts and (
            new_tokens > p.hash_block_size or full_sequence_must_fit):
        # (max(num_prompt_tokens, num_tokens - 1): where the request's
        # prefill ends, for an align-mode group's checkpoint; read, or the
        # call handed to vLLM, before anything changes. A checkpoint lies a
        # hash block or more past the chunk's start, so a step's chunk of
        # no more than a hash block -- every decode step -- has none, and
        # only the full-sequence count looks past it.)
        if (not _count(request.num_prompt_tokens, &prefill_end)
                or not _count(request.num_tokens, &i)):
            p.n_base += 1
            return _VLLM
        if i - 1 > prefill_end:
            prefill_end = i - 1
    # From here on this is vLLM's allocate_slots, in its order.
    if not adopts:
        p.n_fast += 1
    elif ext == 0:
        p.n_adopt += 1
    else:
        p.n_external += 1
    if has_scheduled_reqs:
        status = request.status
        if status is p.waiting or status is p.preempted or (
                type(status) is not p.status_type
                and (status == p.waiting or status == p.preempted)):
            watermark = p.watermark_blocks
    if full_sequence_must_fit:
        full_tokens = request.num_tokens
        if full_tokens > p.max_model_len:
            full_tokens = p.max_model_len
        required = 0
        for i in range(p.ngroups):
            if (<_Group> p.groups[i]).align:
                # (the predictor over the whole sequence from the computed
                # tokens, capped: its checkpoint decides the count, it is
                # not recorded)
                required += _align_count(p, <_Group> p.groups[i], rid, total, full_tokens,
                                         prefill_end, None if adopt is None else adopt[i],
                                         _partial_in(p, i, rid, adopt, computed, partial), False)
                continue
            required += _group_blocks_to_allocate(
                <_Group> p.groups[i], rid, full_tokens, enc,
                None if adopt is None else adopt[i], total, computed, True)
        if required + watermark > _free_blocks(p):
            return None
    need = main_tokens + lookahead
    if need > p.max_model_len:
        need = p.max_model_len
    if p.frees_early:
        processed = total - <Py_ssize_t> request.num_in_flight_tokens
        if processed < 0:
            processed = 0
        _free_early(p, rid, processed, request.num_prompt_tokens)
    required = 0
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        if g.align:
            # (its predictor's count: none, or less than none, summed as
            # vLLM sums it, or its cap; the chunk from the computed tokens,
            # not capped, as vLLM passes them; its checkpoint recorded)
            required += _align_count(p, g, rid, computed + ext, main_tokens, prefill_end,
                                     None if adopt is None else adopt[i],
                                     _partial_in(p, i, rid, adopt, computed, partial), True)
            continue
        # (total_computed_tokens: local + external, not capped here)
        required += _group_blocks_to_allocate(
            g, rid, need, enc, None if adopt is None else adopt[i], computed + ext, computed,
            False)
    if required + watermark > _free_blocks(p) - reserved:
        return None
    p.n_cow += partial
    if adopts:
        _adopt(p, rid, adopt, computed, ext, skip_zeroing)
    # The coordinator's allocate_new_blocks (no group needing a block is
    # the common case: its result, all empty, is never built).
    any_new = False
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        if _group_new_blocks(g, len(_req_blocks(g, rid)), need, main_tokens, enc) > 0 or (
                g.align and PyDict_Contains(g.ckpts, rid)) or (
                partial and PyDict_Contains(g.phr, rid)):
            any_new = True
            break
    if not any_new:
        if not delay_cache_blocks and p.caching:
            _cache(p, request, rid, main_tokens, True)
        return p.empty
    result = PyTuple_New(p.ngroups)
    any_new = False
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        blocks = _req_blocks(g, rid)
        nnew = _group_new_blocks(g, len(blocks), need, main_tokens, enc)
        if g.align and (nnew > 0 or PyDict_Contains(g.ckpts, rid)
                        or partial and PyDict_Contains(g.phr, rid)):
            # (a checkpoint step takes vLLM's long path even with blocks
            # enough; it may return none)
            new = _align_new_blocks(p, g, rid, blocks, main_tokens)
            any_new = any_new or PyList_GET_SIZE(new) > 0
        elif partial and PyDict_Contains(g.phr, rid):
            new = _cow_new_blocks(p, g, rid, blocks, nnew)
            any_new = True
        elif nnew <= 0:
            new = []
        else:
            new = _new_blocks(p, nnew)
            blocks.extend(new)
            if g.record_ids:
                g.mgr.new_block_ids.extend([b.block_id for b in new])
            any_new = any_new or len(new) > 0
        Py_INCREF(new)
        PyTuple_SET_ITEM(result, i, new)
    if not delay_cache_blocks and p.caching:
        # min(main_tokens, request.num_tokens)
        _cache(p, request, rid, main_tokens, True)
    return p.kv_cache_blocks(result) if any_new else p.empty


cdef inline bint _partial_in(ManagerPlan p, Py_ssize_t i, object rid, object adopt,
                             Py_ssize_t local, bint partial) except -1:
    # Whether group i copies a block on write in this call: its hit, adopted
    # in this call, ends inside its block, or a running request's copy is
    # pending (the count, at least, is an align-mode group's).
    cdef _Group g = <_Group> p.groups[i]
    if not partial:
        return False
    if adopt is None:
        return PyDict_Contains(g.phr, rid) == 1
    return PyList_GET_SIZE(adopt[i]) > 0 and _mod(local, g.block_size) != 0


cdef list _new_blocks(ManagerPlan p, Py_ssize_t n):
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


cdef object _vllm_base(self, name):
    # vLLM's method ``name`` of the class a manager extends.
    return getattr(type(self)._kvpool_base, name)


def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                   new_computed_blocks=None, num_lookahead_tokens=0,
                   num_external_computed_tokens=0, delay_cache_blocks=False,
                   num_encoder_tokens=0, full_sequence_must_fit=False,
                   reserved_blocks=0, has_scheduled_reqs=True,
                   skip_zeroing_group_ids=()):
    """vLLM's ``KVCacheManager.allocate_slots`` (0.32-0.34: same arguments,
    results and effects): in C, a prefix-cache hit and a KV connector's
    external tokens included; vLLM's own method for the cases listed in
    docs/manager.md (a partial-block hit, ...)."""
    result = _allocate(self, request, num_new_tokens, num_new_computed_tokens,
                       new_computed_blocks, num_lookahead_tokens,
                       num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens,
                       full_sequence_must_fit, reserved_blocks, has_scheduled_reqs,
                       skip_zeroing_group_ids)
    if result is not _VLLM:
        return result
    return _vllm_base(self, "allocate_slots")(
        self, request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
        num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
        num_encoder_tokens, full_sequence_must_fit, reserved_blocks, has_scheduled_reqs,
        skip_zeroing_group_ids)


def allocate_slots_0_30(self, request, num_new_tokens, num_new_computed_tokens=0,
                        new_computed_blocks=None, num_lookahead_tokens=0,
                        num_external_computed_tokens=0, delay_cache_blocks=False,
                        num_encoder_tokens=0, full_sequence_must_fit=False,
                        reserved_blocks=0, has_scheduled_reqs=True):
    """vLLM's ``KVCacheManager.allocate_slots`` of 0.30 and 0.31 (no
    ``skip_zeroing_group_ids``: every group records its external-token
    blocks for zeroing), as ``allocate_slots``."""
    result = _allocate(self, request, num_new_tokens, num_new_computed_tokens,
                       new_computed_blocks, num_lookahead_tokens,
                       num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens,
                       full_sequence_must_fit, reserved_blocks, has_scheduled_reqs, None)
    if result is not _VLLM:
        return result
    return _vllm_base(self, "allocate_slots")(
        self, request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
        num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
        num_encoder_tokens, full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)


def cache_blocks(self, request, num_computed_tokens):
    """vLLM's ``KVCacheManager.cache_blocks``: the coordinator's only when a
    group may have a block to cache."""
    cdef ManagerPlan p
    cdef Py_ssize_t n
    plan = self._kvpool_plan
    if plan is None or not _count(num_computed_tokens, &n):
        return _vllm_base(self, "cache_blocks")(self, request, num_computed_tokens)
    p = <ManagerPlan> plan
    if not self.enable_caching:
        return None
    if p.caching:
        _cache(p, request, request.request_id, n, False)
    else:
        p.n_cache_skips += 1
    return None


def get_block_ids(self, allow_none=False, *, group_ids=None):
    """vLLM's ``KVCacheBlocks.get_block_ids`` (0.30-0.33): per group, the
    ids of its blocks; with ``allow_none``, None when every selected group is
    empty. kvpool's blocks are read in C."""
    cdef Py_ssize_t i, j, n
    blocks = self.blocks
    groups = blocks if group_ids is None else tuple([blocks[g] for g in group_ids])
    if allow_none:
        for group in groups:
            if len(group) != 0:
                break
        else:
            return None
    if not PyTuple_CheckExact(groups):
        groups = tuple(groups)
    out = PyTuple_New(len(groups))
    for i in range(len(groups)):
        group = <object> PyTuple_GET_ITEM(groups, i)
        if PyList_CheckExact(group):
            n = PyList_GET_SIZE(group)
            ids = PyList_New(n)
            for j in range(n):
                block = <object> PyList_GET_ITEM(group, j)
                if type(block) in _KVPOOL_BLOCKS:
                    block_id = (<KVCacheBlock> block)._bid
                else:
                    block_id = block.block_id
                Py_INCREF(block_id)
                PyList_SET_ITEM(ids, j, block_id)
        else:
            ids = [block.block_id for block in group]
        Py_INCREF(ids)
        PyTuple_SET_ITEM(out, i, ids)
    return out


cdef int _probe(ManagerPlan p, _SpecGroup s, object get_cached_block, PyObject *block_hash,
                PyObject **hit, list holder) except -1:
    # The pool's get_cached_block(block_hash, s.group_ids): 1 with each
    # group's block in hit (borrowed: use them before the next probe), 0 on
    # a miss (all or nothing, as the method). Read off the compiled core's
    # map when the pool's method is the core's and the hash is bytes;
    # otherwise the pool's method, its list kept alive in holder[0].
    cdef BlockHashToBlockMap cache
    cdef Py_ssize_t j
    if p.map_direct and PyBytes_Check(<object> block_hash):
        cache = (<PoolCore> p.pool_core)._map
        for j in range(s.ngids):
            hit[j] = cache.get_hg_ptr(block_hash, s.gids[j])
            if hit[j] == NULL:
                return 0
        return 1
    cached = get_cached_block(<object> block_hash, s.group_ids)
    if not cached:
        return 0
    if not PyList_CheckExact(cached) or PyList_GET_SIZE(cached) != s.ngids:
        raise TypeError("the pool's get_cached_block returned no list of a block per group")
    holder[0] = cached
    for j in range(s.ngids):
        hit[j] = PyList_GET_ITEM(cached, j)
    return 1


cdef inline PyObject *_hash_at(list hashes, Py_ssize_t i) except NULL:
    # hashes[i], borrowed, its index checked again: the pool's method (or a
    # finalizer run by an allocation) could have changed the list.
    if i >= PyList_GET_SIZE(hashes):
        raise RuntimeError("the request's block hashes changed during a lookup")
    return PyList_GET_ITEM(hashes, i)


cdef inline int _append_hit(_SpecGroup s, list out, PyObject **hit) except -1:
    cdef Py_ssize_t j
    for j in range(s.ngids):
        (<list> PyList_GET_ITEM(out, j)).append(<object> hit[j])
    return 0


cdef Py_ssize_t _find_full(ManagerPlan p, _SpecGroup s, object get_cached_block, list hashes,
                           Py_ssize_t max_length, bint drop, list out) except -1:
    # FullAttentionManager.find_longest_cache_hit, the block the hash block
    # and the alignment: a walk from the first hash to the first miss (a
    # miss means every later block misses: the hashes are chained), the last
    # hit block dropped under EAGLE. Appends each group's blocks to out's
    # lists; returns the hit length.
    cdef Py_ssize_t i, j, k = 0, n = max_length // p.hash_block_size
    cdef PyObject *hit[8]
    cdef list holder = [None]
    if n > PyList_GET_SIZE(hashes):
        n = PyList_GET_SIZE(hashes)
    for i in range(n):
        if not _probe(p, s, get_cached_block, _hash_at(hashes, i), hit, holder):
            break
        _append_hit(s, out, hit)
        k += 1
    if drop and k > 0:
        k -= 1
    # vLLM's finder rounds the hit down to the coordinator's alignment (the
    # least common multiple of the groups' block sizes, a multiple of this
    # group's: _hybrid_specs).
    k -= k % s.align_blocks
    if k < PyList_GET_SIZE(<list> PyList_GET_ITEM(out, 0)):
        for j in range(s.ngids):
            del (<list> PyList_GET_ITEM(out, j))[k:]
    return k * p.hash_block_size


cdef Py_ssize_t _find_sliding(ManagerPlan p, _SpecGroup s, object get_cached_block, list hashes,
                              Py_ssize_t max_length, bint drop, list out) except -2:
    # SlidingWindowManager.find_longest_cache_hit, the block the hash block
    # and the alignment: from the right, the first run of window_blocks
    # contiguous hits (one more under EAGLE, then dropped); with no such
    # run, the run that starts at block 0. Fills out's lists (null blocks
    # before the run); returns the hit length, or -1 where vLLM's would
    # index past the hashes (vLLM's method then raises as it does).
    cdef Py_ssize_t i, j, m, nrun = 0, start = 0, keep
    cdef Py_ssize_t n = max_length // p.hash_block_size
    cdef Py_ssize_t need = s.window_blocks + drop
    cdef PyObject *hit[8]
    cdef list holder = [None]
    if n > PyList_GET_SIZE(hashes):
        return -1
    for i in range(n - 1, -1, -1):
        if _probe(p, s, get_cached_block, _hash_at(hashes, i), hit, holder):
            nrun += 1
            if nrun >= need:
                start = i
                break
        else:
            nrun = 0
    # Found: blocks [start, start + nrun); not found: the run (if any) that
    # reached block 0, so start is 0. EAGLE pops the last block of the list.
    # The run is remembered by its length and its blocks read again (the
    # pool is as it was: nothing that changes it ran in between).
    keep = nrun
    if drop and start + nrun > 0:
        keep -= 1
    if start:
        for j in range(s.ngids):
            (<list> PyList_GET_ITEM(out, j)).extend([p.null_block] * start)
    for m in range(start, start + keep):
        if not _probe(p, s, get_cached_block, _hash_at(hashes, m), hit, holder):
            raise RuntimeError("the prefix cache changed during a lookup")
        _append_hit(s, out, hit)
    return (start + keep) * p.hash_block_size


cdef Py_ssize_t _find_chunked(ManagerPlan p, _SpecGroup s, object get_cached_block, list hashes,
                              Py_ssize_t max_length, list out) except -2:
    # ChunkedLocalAttentionManager.find_longest_cache_hit, the block the
    # hash block and the alignment, no EAGLE: the blocks before the current
    # chunk count as hits (null blocks), then a walk from the chunk's first
    # block to the first miss. Fills out's lists; returns the hit length, or
    # -1 where vLLM's might index past the hashes (vLLM's method decides).
    cdef Py_ssize_t i, j, bs = p.hash_block_size, n = max_length // bs, start = 0, k
    cdef PyObject *hit[8]
    cdef list holder = [None]
    if n > PyList_GET_SIZE(hashes):
        return -1
    if max_length > 0:
        start = _floordiv(max_length, s.chunk) * s.chunk // bs
    if start:
        for j in range(s.ngids):
            (<list> PyList_GET_ITEM(out, j)).extend([p.null_block] * start)
    k = start
    for i in range(start, n):
        if not _probe(p, s, get_cached_block, _hash_at(hashes, i), hit, holder):
            break
        _append_hit(s, out, hit)
        k += 1
    return k * bs


cdef object _lookup_specs(ManagerPlan p, list hashes, Py_ssize_t max_length):
    # The coordinator's find_longest_cache_hit over p.lookup_specs: (blocks
    # of each group, hit length, uncached common prefix), or _VLLM. The
    # unitary coordinator: its group's finder at the bound. The hybrid
    # coordinator's simple hybrid is one pass: full attention at the bound,
    # then the window at full attention's hit; a group that drops an EAGLE
    # block looks one block further (to the bound, 0.30-0.31, or the hashed
    # tokens, 0.32 on) and drops back; full attention is cut to the hit.
    cdef _SpecGroup s
    cdef Py_ssize_t k, j, bs = p.hash_block_size, curr = max_length, longest = 0, reach, cap
    cdef Py_ssize_t nspecs = len(p.lookup_specs)
    cdef list by_group = [None] * p.ngroups
    cdef list out
    cap = PyList_GET_SIZE(hashes) * bs if p.margin_to_hashes else max_length
    get_cached_block = p.pool.get_cached_block
    for k in range(nspecs):
        s = <_SpecGroup> p.lookup_specs[k]
        out = [[] for j in range(s.ngids)]
        reach = curr
        if s.drop_eagle and p.hybrid:
            reach = min(curr + bs, cap)
        if s.sliding:
            curr = _find_sliding(p, s, get_cached_block, hashes, reach, s.drop_eagle, out)
            if curr < 0:
                return _VLLM
        elif s.chunk:
            curr = _find_chunked(p, s, get_cached_block, hashes, reach, out)
            if curr < 0:
                return _VLLM
        else:
            curr = _find_full(p, s, get_cached_block, hashes, reach, s.drop_eagle, out)
        if curr > longest:
            longest = curr
        for j in range(s.ngids):
            by_group[<Py_ssize_t> s.group_ids[j]] = out[j]
    if p.hybrid:
        k = _cdiv(curr, bs)
        for x in p.lookup_specs:
            s = <_SpecGroup> x
            if not s.sliding and not s.chunk:
                for j in range(s.ngids):
                    del (<list> by_group[<Py_ssize_t> s.group_ids[j]])[k:]
        # A group left out of the lookup (a circular buffer's) hits nothing.
        for k in range(p.ngroups):
            if by_group[k] is None:
                by_group[k] = []
    return tuple(by_group), curr, longest - curr


cdef object _computed_blocks(self, request, max_cache_hit_length, bint hit_limit=False):
    # KVCacheManager.get_computed_blocks where the plan looks up here
    # (_plan_lookup, _lookup_specs); _VLLM for any other case, before
    # anything is read twice.
    cdef ManagerPlan p
    cdef Py_ssize_t max_length, uncached = 0
    plan = self._kvpool_plan
    if plan is None:
        return _VLLM
    p = <ManagerPlan> plan
    if p.lookup_specs is None:
        return _VLLM
    if hit_limit:
        # 0.34: the request bounds its own hits (prefix_cache_hit_limit: 0
        # skips the lookup), and an explicit bound can only lower them.
        if not (self.enable_caching and request.prefix_cache_hit_limit != 0):
            p.n_lookups += 1
            return p.empty, 0, 0
        max_cache_hit_length = request.get_max_cache_hit_length(max_cache_hit_length)
    else:
        if not (self.enable_caching and not request.skip_reading_prefix_cache):
            p.n_lookups += 1
            return p.empty, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
    hashes = request.block_hashes
    if not _count(max_cache_hit_length, &max_length) or max_length < 0 \
            or not PyList_CheckExact(hashes):
        return _VLLM
    found = _lookup_specs(p, <list> hashes, max_length)
    if found is _VLLM:
        return _VLLM
    computed, num_new_computed, uncached = found
    p.n_lookups += 1
    if num_new_computed > 0 and self.enable_kv_cache_events and \
            getattr(request, "kv_cache_report_mode", "incremental") == "full":
        p.coordinator.emit_cached_block_events(request, computed)
    return (
        p.kv_cache_blocks(computed) if num_new_computed else p.empty,
        num_new_computed,
        num_new_computed + uncached if uncached else 0,
    )


def get_computed_blocks(self, request, max_cache_hit_length=None):
    """vLLM 0.33's ``KVCacheManager.get_computed_blocks``: the prefix-cache
    hit looked up in C for one full-attention group whose block is the hash
    block; vLLM's own method otherwise."""
    result = _computed_blocks(self, request, max_cache_hit_length)
    if result is _VLLM:
        return _vllm_base(self, "get_computed_blocks")(self, request, max_cache_hit_length)
    return result


def get_computed_blocks_0_34(self, request, max_cache_hit_length=None):
    """vLLM 0.34's ``KVCacheManager.get_computed_blocks`` (the request's
    ``prefix_cache_hit_limit`` and ``get_max_cache_hit_length``), as
    ``get_computed_blocks``."""
    result = _computed_blocks(self, request, max_cache_hit_length, True)
    if result is _VLLM:
        return _vllm_base(self, "get_computed_blocks")(self, request, max_cache_hit_length)
    return result


def get_computed_blocks_0_30(self, request):
    """vLLM 0.30-0.32's ``KVCacheManager.get_computed_blocks`` (no
    ``max_cache_hit_length``), as ``get_computed_blocks``."""
    result = _computed_blocks(self, request, None)
    if result is _VLLM:
        return _vllm_base(self, "get_computed_blocks")(self, request)
    return result


def estimate_cached_tokens(self, request):
    """vLLM's ``KVCacheManager.estimate_cached_tokens`` (0.30-0.33): per
    prefix-cacheable group the most tokens a block's hash of the request
    covers, the least of those over the groups (0 for none)."""
    return _estimate_cached_tokens(self, request, False)


def estimate_cached_tokens_0_34(self, request):
    """vLLM 0.34's ``estimate_cached_tokens``: as 0.33's, but a group counts
    the tokens of its last block with a non-zero count (0.34 relies on
    coverage growing along the table)."""
    return _estimate_cached_tokens(self, request, True)


cdef object _estimate_cached_tokens(self, request, bint last):
    cdef _Group g
    cdef Py_ssize_t j
    plan = self._kvpool_plan
    if plan is None:
        return _vllm_base(self, "estimate_cached_tokens")(self, request)
    p = <ManagerPlan> plan
    rid = request.request_id
    cached_tokens = None
    for g in p.groups:
        if not g.estimates:
            continue
        entry = g.rtb.get(rid) or ()
        group_cached = 0
        if last:
            for j in range(len(entry) - 1, -1, -1):
                covered = entry[j].block_hash_num_tokens
                if covered:
                    group_cached = covered
                    break
        else:
            for block in entry:
                covered = block.block_hash_num_tokens or 0
                if covered > group_cached:
                    group_cached = covered
        if cached_tokens is None or group_cached < cached_tokens:
            cached_tokens = group_cached
    return cached_tokens or 0


cdef Py_ssize_t _null_head_len(object blocks) except -1:
    # vLLM 0.33's null_head_len: leading null blocks, by the same bisection.
    cdef Py_ssize_t lo = 1, hi, mid
    if not blocks or not blocks[0].is_null:
        return 0
    hi = len(blocks)
    while lo < hi:
        mid = (lo + hi) // 2
        if blocks[mid].is_null:
            lo = mid + 1
        else:
            hi = mid
    return lo


def free(self, request):
    """vLLM's ``KVCacheManager.free``: each group's blocks leave the
    request's table and go back to the pool, tail first."""
    cdef _Group g
    cdef Py_ssize_t nhl
    plan = self._kvpool_plan
    if plan is None:
        return _vllm_base(self, "free")(self, request)
    p = <ManagerPlan> plan
    rid = request.request_id
    for g in p.groups:
        if g.align:
            # (its pop_blocks_for_free clears its own tables too: vLLM's)
            g.mgr.free(rid)
            continue
        # (pop_blocks_for_free, then free_blocks, group by group)
        blocks = g.rtb.pop(rid, [])
        g.ncb.pop(rid, None)
        g.phr.pop(rid, None)
        if p.trims_null_head:
            nhl = _null_head_len(blocks)
            if nhl:
                blocks = blocks[nhl:]
        p.pool.free_blocks(reversed(blocks))
    return None


def get_blocks(self, request_id):
    """vLLM's ``KVCacheManager.get_blocks``: the request's blocks per group
    (its tables' lists themselves), or the manager's empty blocks."""
    cdef _Group g
    cdef Py_ssize_t i
    cdef PyObject *entry
    plan = self._kvpool_plan
    if plan is None:
        return _vllm_base(self, "get_blocks")(self, request_id)
    p = <ManagerPlan> plan
    result = PyTuple_New(p.ngroups)
    any_blocks = False
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        entry = PyDict_GetItemWithError(g.rtb, request_id)
        blocks = <object> entry if entry != NULL else None
        if not blocks:
            blocks = []
        else:
            any_blocks = True
        Py_INCREF(blocks)
        PyTuple_SET_ITEM(result, i, blocks)
    return p.kv_cache_blocks(result) if any_blocks else p.empty


def get_block_ids_of(self, request_id):
    """vLLM's ``KVCacheManager.get_block_ids``: the ids of the request's
    blocks, per group."""
    return get_block_ids(get_blocks(self, request_id))


def take_new_block_ids(self):
    """vLLM's ``KVCacheManager.take_new_block_ids``: every group's new block
    ids since the last call (each group's list is taken and replaced)."""
    cdef _Group g
    plan = self._kvpool_plan
    if plan is None:
        return _vllm_base(self, "take_new_block_ids")(self)
    ids = []
    for g in (<ManagerPlan> plan).groups:
        taken = g.mgr.new_block_ids
        g.mgr.new_block_ids = []
        ids.extend(taken)
    return ids


def get_num_common_prefix_blocks_0_30(self, running_request_id):
    """vLLM 0.30's and 0.31's ``KVCacheManager.get_num_common_prefix_blocks``
    (the scheduler calls it once a step): per group, how many leading blocks
    of the request's table every request with blocks holds -- counted for a
    full-attention group, 0 for any other (sliding-window, chunked,
    cross-attention, Mamba, ring)."""
    cdef _Group g
    cdef Py_ssize_t i, j
    plan = self._kvpool_plan
    if plan is None or not (<ManagerPlan> plan).common_direct:
        return _vllm_base(self, "get_num_common_prefix_blocks")(self, running_request_id)
    p = <ManagerPlan> plan
    p.n_common += 1
    counts = [0] * p.ngroups
    for i in range(p.ngroups):
        g = <_Group> p.groups[i]
        if not g.full_like:
            continue
        # Indexed as vLLM's does: an unknown id gets an empty table
        # (req_to_blocks is a defaultdict) and counts 0.
        blocks = g.rtb[running_request_id]
        # vLLM reads the table count once per block; nothing here changes it.
        holders = len(g.rtb)
        j = 0
        # (Cython walks a list here by index itself.)
        for block in blocks:
            if block.ref_cnt != holders:
                break
            j += 1
        counts[i] = j
    return counts


def remove_skipped_blocks(self, request_id, processed_computed_tokens, num_prompt_tokens=None):
    """vLLM's ``KVCacheManager.remove_skipped_blocks``: a sliding-window or
    R-SWA group's manager is called only when it frees a block."""
    cdef Py_ssize_t processed
    plan = self._kvpool_plan
    if plan is None or not _count(processed_computed_tokens, &processed):
        return _vllm_base(self, "remove_skipped_blocks")(
            self, request_id, processed_computed_tokens, num_prompt_tokens)
    _free_early(<ManagerPlan> plan, request_id, processed, num_prompt_tokens)
    return None


def coordinator_get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks,
                                           num_encoder_tokens, total_computed_tokens,
                                           num_local_computed_tokens, num_tokens_main_model,
                                           apply_admission_cap=False, *args, **kwargs):
    """vLLM's ``KVCacheCoordinator.get_num_blocks_to_allocate`` (bound to the
    coordinator of a manager these paths serve; later arguments, such as
    0.31's ``prefill_end``, only matter to Mamba groups): in C when no group
    has new computed blocks."""
    cdef ManagerPlan p
    cdef Py_ssize_t tokens = 0, total = 0, required = 0, enc = 0
    plan = self._kvpool_plan
    if plan is None:
        return type(self).get_num_blocks_to_allocate(
            self, request_id, num_tokens, new_computed_blocks, num_encoder_tokens,
            total_computed_tokens, num_local_computed_tokens, num_tokens_main_model,
            apply_admission_cap, *args, **kwargs)
    p = <ManagerPlan> plan
    fast = _count(num_tokens, &tokens) and _count(total_computed_tokens, &total) \
        and (not p.has_cross or _count(num_encoder_tokens, &enc)) \
        and PyTuple_CheckExact(new_computed_blocks) and len(new_computed_blocks) == p.ngroups \
        and (not (args or kwargs) or (p.has_prefill_end and len(args) + len(kwargs) == 1
                                      and (args or "prefill_end" in kwargs)))
    if fast:
        # (an align-mode Mamba group's predictor may set a checkpoint: vLLM's)
        fast = not p.has_align
    if fast:
        for group_blocks in new_computed_blocks:
            if len(group_blocks) != 0:
                fast = False
                break
    if not fast:
        return p.base_num_blocks(self, request_id, num_tokens, new_computed_blocks,
                                 num_encoder_tokens, total_computed_tokens,
                                 num_local_computed_tokens, num_tokens_main_model,
                                 apply_admission_cap, *args, **kwargs)
    admission_cap = bool(apply_admission_cap)
    for g in p.groups:
        required += _group_blocks_to_allocate(<_Group> g, request_id, tokens, enc, None, total,
                                              0, admission_cap)
    return required


# kvpool's block classes, whose block_id is read from the handle.
from kvpool._core import KVCacheBlock as _B15, KVCacheBlock24 as _B24, KVCacheBlock33 as _B33

cdef frozenset _KVPOOL_BLOCKS = frozenset((_B15, _B24, _B33))
