"""The plan of a kvpool KV-cache manager (``plan_for``): what vLLM's
``KVCacheManager``, its coordinator and its single-type managers fix when
they are built, read once, and whether the compiled paths may serve them at
all (each refusal says why). Data layout: ``_plan.pxd``."""

cimport cython
from libc.stdint cimport uint32_t
from kvpool._core cimport PoolCore
from kvpool._plan cimport MAX_COUNT, PyDict_Check, PySet_Check, _cdiv


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
        built here; caching steps with an align-mode Mamba group or a
        full-attention group registering partial tails done here
        (``mamba_cache``), the tail steps of those handed to vLLM's
        ``_cache_partial_tail_block`` (``mamba_tail_calls``,
        ``full_tail_calls``: something unusual), the sparse retention block
        masks built here (``sparse_masks``) and the tail steps' pool calls
        made here (``partial_blocks``: cache_partial_block, or
        _maybe_evict_cached_block for a transient checkpoint);
        ``lookups_base``: ``get_computed_blocks`` calls handed to
        vLLM's method;
        the coordinator's ``get_num_blocks_to_allocate`` (the
        scheduler's remaining-blocks count, vLLM's own ``allocate_slots``)
        done here (``coord_counts``) and handed to vLLM's (``coord_base``)."""
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
            "mamba_cache": self.n_mc_steps,
            "mamba_tail_calls": self.n_mc_tails,
            "full_tail_calls": self.n_mc_fa_tails,
            "sparse_masks": self.n_mc_masks,
            "partial_blocks": self.n_mc_partials,
            "lookups_base": self.n_lookups_base,
            "coord_counts": self.n_coord,
            "coord_base": self.n_coord_base,
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
    _plan_mamba_caching(p, coordinator, pool, eagle_drop_attr, cap_at_hashed, align_rules)
    return p, None


cdef int _plan_mamba_caching(ManagerPlan p, object coordinator, object pool,
                             str eagle_drop_attr, bint cap_at_hashed,
                             int align_rules) except -1:
    # Mamba caching (issue 52): whether _cache does the caching step of an
    # align-mode (or mode "all") group, and of a full-attention group registering partial
    # tails, itself (else the coordinator's, as before), and what it reads
    # that the manager fixes when built. Anything unexpected: not here.
    cdef _Group g
    sched = getattr(coordinator, "scheduler_block_size", None)
    lookahead = getattr(pool, "num_hash_lookahead_tokens", 0) if cap_at_hashed else 0
    eagle = getattr(coordinator, eagle_drop_attr, None)
    if not (type(sched) is int and sched > 0 and type(lookahead) is int and lookahead >= 0
            and isinstance(eagle, (set, frozenset))):
        return 0
    p.mc_sched = sched
    p.mc_lookahead = lookahead
    p.mc_replay_eagle = bool(eagle)
    p.mc_junction_eagle = cap_at_hashed
    for x in p.groups:
        g = <_Group> x
        mgr = g.mgr
        # (an align group; or 0.30, 0.31's mode "all": the same steps but
        # the tail step and the offers)
        if not (g.caches and (g.align or (g.mamba and mgr.mamba_cache_mode == "all"))):
            continue
        tokens = mgr.cache_hit_alignment_tokens
        drop = mgr.use_eagle if align_rules == 30 else mgr.drop_eagle_checkpoint_block
        junction = (mgr.fine_grained_prefix_cache if align_rules == 30
                    else mgr.shared_prefix_checkpoint)
        if not (tokens is None or (type(tokens) is int and tokens > 0)):
            continue
        if mgr.kv_cache_spec.prefix_cacheable is not True:
            continue  # (0.31 on, its base step returns early: vLLM's code)
        g.mc_align_tokens = 0 if tokens is None else tokens
        g.mc_drop = bool(drop)
        g.mc_junction = bool(junction)
        g.mc_direct = True
    p.mc_on = True
    return 0


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
# calls it), or vLLM's own: its lookup (outside "align"; in "align"
# _mamba_specs plans it beside full attention), a call adopting its hit
# (its count refuses a hit cached this step: _allocate hands the call to
# vLLM's code), its cache_blocks (the
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
    # lookup's block is then the hash block -- but with a Mamba align group
    # (issue 52), whose lookup beside full attention _mamba_specs plans.
    cdef _Group g
    cdef tuple specs
    cdef Py_ssize_t bs = p.hash_block_size
    if p.ngroups == 0:
        return 0
    if p.has_align and type(coordinator) is hybrid_cls:
        # Mamba lookup (issue 52): full attention + Mamba align, or vLLM's.
        specs = _mamba_specs(p, coordinator, full_cls, bs)
        if specs is not None and None not in specs:
            p.lookup_specs = specs
            p.mamba_lookup = True
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


cdef bint _spec_is(object spec, str name):
    # isinstance(spec, <vLLM's spec class called name>), by the class's MRO.
    return any(c.__name__ == name for c in type(spec).__mro__)


cdef tuple _mamba_specs(ManagerPlan p, object coordinator, object full_cls, Py_ssize_t bs):
    # Mamba lookup (issue 52). The hybrid coordinator's lookup done in C
    # (_lookup_mamba) when its spec groups are one of full attention then one
    # of Mamba in "align" mode (NemotronH; Qwen3-Next's three Mamba groups
    # of one spec look up as one), beside only circular buffers' groups,
    # which vLLM's lookup leaves out: a "simple hybrid", whose fixed-point
    # loop ends after one pass. Each finder runs at its spec's block (a
    # multiple of the hash block, vLLM asserts it), through vLLM's view of
    # the hashes at that block or, in the finders' fine-grained branch, the
    # hashes themselves, with the coordinator's alignment (the hash block
    # when partial hash hits are on, else the scheduler block). EAGLE: full
    # attention looks one margin further and drops (the line's cap on the
    # margin: margin_to_hashes), Mamba's finder ignores the drop. None (the
    # lookup is vLLM's) for anything else: a sliding window beside Mamba
    # (vLLM's fixed point over three spec groups, a window finder at a block
    # other than the hash block -- not proven here), two full-attention
    # specs, a fine-grained branch whose alignment is not the hash block
    # (vLLM's would index the hashes at the alignment), a group that retains
    # longer hits, Mamba outside "align", more than 8 groups of a spec.
    cdef _SpecGroup s
    cdef _Group g
    cdef Py_ssize_t align, block
    cdef bint partial = bool(getattr(coordinator, "enable_partial_hash_hits", False))
    alignment = coordinator._cache_hit_alignment_tokens
    if not isinstance(alignment, int) or not 0 < alignment <= MAX_COUNT:
        return None
    align = alignment
    for x in p.groups:
        g = <_Group> x
        if g.unlooked:
            continue
        if (g.mamba and not g.align) or getattr(g.mgr, "retains_longer_hit", False):
            return None
    groups = coordinator.attention_groups
    if len(groups) != 2 or align % bs or not _covers(p, tuple(groups)):
        return None
    specs = []
    for k in range(2):
        group = groups[k]
        spec = group.spec
        if not isinstance(spec.block_size, int) or not 0 < spec.block_size <= MAX_COUNT:
            return None
        block = spec.block_size
        if block % bs:
            return None
        for gid in group.group_ids:
            if not (isinstance(gid, int) and 0 <= gid < p.ngroups):
                return None
            g = <_Group> p.groups[gid]
            if type(g.mgr) is not group.manager_cls or g.block_size != block:
                return None
            if k == 0 and group.manager_cls is not full_cls:
                return None
            if k == 1 and not g.align:
                return None
        if not (_spec_is(spec, "FullAttentionSpec") if k == 0 else
                _spec_is(spec, "MambaSpec") and not _spec_is(spec, "FullAttentionSpec")):
            return None
        if not group.manager_cls.supports_fine_grained_hash_lookup:
            return None
        s = _spec_group(group.group_ids, False, bool(group.use_eagle), 0, bs)
        if s is None:
            return None
        s.mamba = k == 1
        s.block = block
        s.scale = block // bs
        s.fine = align < block and block % align == 0
        if s.fine and align != bs:
            return None
        # (vLLM's eagle_proof_margin, 0.30 and 0.31 inline: a hash block for
        # a fine-grained lookup, else the group's block; none for Mamba)
        s.margin = 0 if s.mamba else (bs if partial and block > bs else block)
        specs.append(s)
    p.lookup_align = align
    return tuple(specs)


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
