"""The caching step of kvpool's manager: ``KVCacheManager.cache_blocks``
and the end of ``allocate_slots`` -- whether any group has a block to
cache, the pool's ``cache_full_blocks`` called from C for full attention,
a plain request's ``BlockStored`` event built in C; every other group's
step is vLLM's coordinator's."""

from libc.stdint cimport uint32_t
from cpython.dict cimport PyDict_GetItemWithError
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromUnsignedLongLong
from kvpool._core cimport PoolCore, _be_tail
from kvpool._plan cimport (
    _Group, ManagerPlan, PyList_CheckExact, PyObject_Vectorcall, _count, _floordiv, _mod,
    _req_blocks, _exact_table, _hybrid_cacheable, _vllm_base,
)
from kvpool._mamba_align cimport _align_tail_idle, _align_tail_none, _align_mask, _align_tail

from kvpool.hashing import _use_int_block_hashes
from kvpool.hashing import maybe_convert_block_hash as _maybe_convert_block_hash


# What _cache does for a group (its plan's step, bits of ``how``): the
# base step's pool call and cached count; then, for a full-attention group
# registering partial tails, its tail step (_full_tail: decided after that
# call, as a full block cached may drop the tail's partial key); for an
# align-mode Mamba group, its tail step (_align_tail), then the Mamba part's
# bookkeeping of the blocks the base step cached.
cdef enum:
    _BASE = 1
    _FULL_TAIL = 2
    _ALIGN_TAIL = 4
    _ALIGN_POST = 8


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
    # may cache a partial tail or re-key a checkpoint: without ``mc_on``
    # vLLM's code decides for them whenever that is not provably nothing.
    #
    # Mamba caching (issue 52), with ``mc_on``: their steps are done here
    # too, group by group in the coordinator's order. A partial-tail
    # full-attention group: the base step's pool call and count, then its
    # tail step (_full_tail; when the group cached no block, skipped if
    # _full_tail_none proves it does nothing -- decided before anything, as
    # no other group's step touches its keys). An align-mode group
    # (MambaManager.cache_blocks over the base class's): the base step with
    # its block mask (_align_mask: the sparse retention the coordinator's
    # retention_interval asks for, read once per call), then its tail step
    # (_align_tail: a checkpoint re-keyed or evicted, the prompt's tail or
    # a junction keyed; skipped if _align_tail_none proves it returns None
    # having done nothing, decided before anything: no step of any group
    # changes what it reads), the hash it returns added to
    # cached_blocks_this_step, then, for the blocks the base step cached
    # (its count before the tail step, which may lower it), each keyed
    # one's hash added to cached_blocks_this_step and its boundary state
    # offered (_align_offers). Everything decided, and anything unusual
    # sent to the coordinator, before any change; a tail step's own unusual
    # cases are its manager's method (counted).
    #
    # With ``cap_at_num_tokens`` (allocate_slots), ``num_tokens`` is capped
    # at the request's ``num_tokens`` first -- read only if a group could
    # cache without the cap (a decode step seldom fills a block).
    cdef _Group g
    cdef Py_ssize_t cacheable, given, full, cached, hashed = -1, i, ntodo = 0
    cdef Py_ssize_t todo_cached[64]
    cdef Py_ssize_t todo_full[64]
    cdef Py_ssize_t todo_given[64]
    cdef int todo_index[64]
    cdef int todo_how[64]
    cdef int how, any_how = 0
    cdef bint mc, ok, have_retention = False
    cdef PyObject *entry
    cdef object retention = None
    cdef object masks = None    # a list: each group's block mask (align groups)
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
        mc = p.mc_on and (g.mc_direct or (g.partial_tail and g.direct_cache))
        if g.align and not mc and not _align_tail_idle(p, g, request, rid, num_tokens):
            return _cache_in_vllm(p, request, num_tokens)
        if p.hybrid:
            cacheable = _hybrid_cacheable(p, g, num_tokens)
        else:
            cacheable = num_tokens - p.reprefillable
            if cacheable < 0:
                cacheable = 0
        given = cacheable
        if 0 <= hashed < cacheable:
            cacheable = hashed
        full = _floordiv(cacheable, g.block_size)
        entry = PyDict_GetItemWithError(g.ncb, rid)
        if entry == NULL:
            cached = 0
        elif not _count(<object> entry, &cached):
            return _cache_in_vllm(p, request, num_tokens)  # not an int: vLLM's code sees it
        how = 0
        if mc and g.mamba:
            # (mode "all", 0.30 and 0.31: no tail step, no offers)
            if cached < full or (g.align and not _align_tail_none(p, g, request, rid, given)):
                if not have_retention:
                    retention = p.coordinator.retention_interval
                    have_retention = True
            if cached < full:
                mask = _align_mask(p, g, request, cached, full, retention, &ok)
                if not ok:
                    return _cache_in_vllm(p, request, num_tokens)
                if mask is not None:
                    if masks is None:
                        masks = [None] * p.ngroups
                    masks[i] = mask
                how = _BASE | _ALIGN_POST
            if g.align and not _align_tail_none(p, g, request, rid, given):
                how |= _ALIGN_TAIL
        elif mc:
            if cached < full:
                how = _BASE | _FULL_TAIL
            elif not _full_tail_none(p, g, request, rid, given):
                how = _FULL_TAIL
        elif cached < full:
            # (a partial-tail group's full blocks first: caching them may
            # promote its tail block's partial key, which its tail step then
            # registers again)
            if not g.direct_cache or g.partial_tail:
                return _cache_in_vllm(p, request, num_tokens)
            how = _BASE
        elif g.partial_tail and not _full_tail_idle(p, g, request, rid):
            return _cache_in_vllm(p, request, num_tokens)
        if how == 0:
            continue
        todo_index[ntodo] = i
        todo_cached[ntodo] = cached
        todo_full[ntodo] = full
        todo_given[ntodo] = given
        todo_how[ntodo] = how
        any_how |= how
        ntodo += 1
    if ntodo == 0:
        p.n_cache_skips += 1
        return 0
    # vLLM's coordinator calls each group manager's cache_blocks through the
    # instance: one replaced on the instance after the plan was made (a
    # test's spy, a connector's wrapper) is the step's, so the coordinator's.
    for x in p.groups:
        if _instance_cache_blocks(<_Group> x):
            return _cache_in_vllm(p, request, num_tokens)
    if any_how & _BASE:
        p.n_cache_direct += 1
    if any_how & ~_BASE:
        p.n_mc_steps += 1
    for i in range(ntodo):
        g = <_Group> p.groups[todo_index[i]]
        how = todo_how[i]
        if how & _BASE:
            mask = None if masks is None else masks[todo_index[i]]
            if mask is not None:
                p.n_mc_masks += 1
            if p.core_caches and (g.block_size == p.hash_block_size or (
                    _mod(g.block_size, p.hash_block_size) == 0
                    and PyList_CheckExact(request.block_hashes))):
                _core_caches(p, g, request, _req_blocks(g, rid), todo_cached[i], todo_full[i],
                             mask)
            else:
                p.pool.cache_full_blocks(
                    request=request,
                    blocks=_req_blocks(g, rid),
                    num_cached_blocks=todo_cached[i],
                    num_full_blocks=todo_full[i],
                    block_size=g.block_size,
                    kv_cache_group_id=g.group_id,
                    block_mask=mask,
                )
            g.ncb[rid] = todo_full[i]
        if how & _FULL_TAIL:
            _full_tail(p, g, request, rid, todo_given[i])
        if how & _ALIGN_TAIL:
            key = _align_tail(p, g, request, rid, todo_given[i], retention)
            if key is not None:
                g.mgr.cached_blocks_this_step.add(key)
        if how & _ALIGN_POST:
            _align_offers(g, rid, todo_cached[i], todo_full[i])
    return 0


cdef inline bint _instance_cache_blocks(_Group g) except -1:
    # Whether the group's manager has a cache_blocks of its own instance.
    d = getattr(g.mgr, "__dict__", None)
    return d is not None and "cache_blocks" in d


cdef int _align_offers(_Group g, object rid, Py_ssize_t before, Py_ssize_t after) except -1:
    # MambaManager.cache_blocks' end in align mode (mode "all": the hashes
    # only), for the blocks
    # before..after its base step cached (after > before): each block keyed
    # (not null, its primary hash set; read after the tail step, which may
    # have re-keyed or evicted a checkpoint) has that hash added to the
    # manager's cached_blocks_this_step and its boundary state offered --
    # (request id, group id, block, its hash's token count) appended to
    # _pending_boundary_state_offloads, read off the manager as vLLM does
    # (free() rebinds it). A keyed block without a token count fails vLLM's
    # assertion: the same AssertionError here, the earlier blocks' offers
    # made, as there.
    cdef Py_ssize_t idx
    mgr = g.mgr
    blocks = _req_blocks(g, rid)
    for idx in range(before, after):
        block = blocks[idx]
        if block.is_null:
            continue
        key = block.block_hash
        if key is None:
            continue
        mgr.cached_blocks_this_step.add(key)
        if not g.align:
            continue  # (mode "all": no offers)
        ntok = block.block_hash_num_tokens
        if ntok is None:
            raise AssertionError
        mgr._pending_boundary_state_offloads.append((rid, g.group_id, block, ntok))
    return 0


cdef int _core_caches(ManagerPlan p, _Group g, object request, object blocks,
                      Py_ssize_t cached, Py_ssize_t full, object mask) except -1:
    # kvpool's facade cache_full_blocks (kvpool.v0_33.block_pool), cached <
    # full, for a group whose block is the hash block or a multiple of it
    # over a request whose hashes are a list (the facade's two cases that
    # index the raw hashes; a Mamba group's block mask and null blocks
    # skipped by the core as there): the core's _cache_run33, then with
    # events the same events in the same order -- the BlockRemoved of
    # promoted partial keys, then one BlockStored built by the line's own
    # _build_block_stored_event, with the line's extra keys and lookahead
    # over the blocks stored -- without the facade's Python between.
    cdef PoolCore core = <PoolCore> p.pool_core
    cdef Py_ssize_t i, bs = g.block_size, lookahead = 0
    cdef Py_ssize_t scale = bs // p.hash_block_size
    hashes = request.block_hashes
    if not core._events:
        core._cache_run33(blocks, cached, full, hashes, scale, g.group_id, bs, mask, None, None)
        return 0
    removed = []
    stored = []
    core._cache_run33(blocks, cached, full, hashes, scale, g.group_id, bs, mask, removed, stored)
    pool = p.pool
    if PyList_GET_SIZE(removed):
        pool._emit_block_removed_events(removed)
    use_int = _use_int_block_hashes()
    parent = None if cached == 0 else _event_hash(hashes[cached * scale - 1], use_int)
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
    indices = [i for i in range(cached, full)
               if not blocks[i].is_null and (mask is None or mask[i - cached])]
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


cdef int _full_boundary(ManagerPlan p, _Group g, object request, Py_ssize_t n,
                        Py_ssize_t *boundary) except -1:
    # FullAttentionManager._cache_partial_tail_block(request, n)'s boundary
    # (its block larger than the hash block): the prompt's last hash
    # boundary -- its proof limit P (0.32 on without EAGLE: P - 1) floored
    # to the hash block, 0.33 on no more hash blocks than the request has.
    # 0: it returns at once (no boundary, one past n, or one ending a
    # block); 1: ``boundary`` is one to key; 2: unusual (a prompt that is
    # not an int, a negative boundary): its own code.
    cdef Py_ssize_t P, limit, nh, H = p.hash_block_size
    if not _count(request.num_prompt_tokens, &P):
        return 2
    limit = P if (g.use_eagle or not p.tail_eagle_limit) else P - 1
    nh = _floordiv(limit, H)
    if p.cap_at_hashed:
        hashes = request.block_hashes
        if len(hashes) < nh:
            nh = len(hashes)
    boundary[0] = nh * H
    if nh == 0 or nh * H > n:
        return 0
    if nh < 0:
        return 2
    return 0 if (nh * H) % g.block_size == 0 else 1


cdef bint _full_tail_none(ManagerPlan p, _Group g, object request, object rid,
                          Py_ssize_t n) except -1:
    # Whether the group's tail step (_full_tail) does nothing.
    cdef Py_ssize_t boundary
    cdef int k = _full_boundary(p, g, request, n, &boundary)
    return k == 0 or (k == 1 and _full_tail_idle(p, g, request, rid))


cdef int _full_tail(ManagerPlan p, _Group g, object request, object rid,
                    Py_ssize_t n) except -1:
    # FullAttentionManager._cache_partial_tail_block(request, n), done here:
    # at a boundary to key (_full_boundary), the table's block that holds
    # it (the table made if the request has none, as vLLM's defaultdict
    # does), if there is one, keyed at the boundary by the pool's
    # cache_partial_block -- skipped when _full_tail_idle proves that call
    # changes nothing (the key on that block already). Unusual cases: its
    # own code (counted: n_mc_fa_tails).
    cdef Py_ssize_t boundary, idx
    cdef int k = _full_boundary(p, g, request, n, &boundary)
    if k == 0:
        return 0
    if k == 2:
        p.n_mc_fa_tails += 1
        g.mgr._cache_partial_tail_block(request, n)
        return 0
    if _full_tail_idle(p, g, request, rid):
        return 0
    blocks = _req_blocks(g, rid)
    idx = boundary // g.block_size
    if idx >= len(blocks):
        return 0
    p.n_mc_partials += 1
    p.pool.cache_partial_block(
        request=request,
        block=blocks[idx],
        num_tokens=boundary,
        kv_cache_group_id=g.group_id,
        block_size=g.block_size,
    )
    return 0


cdef int _cache_in_vllm(ManagerPlan p, object request, Py_ssize_t num_tokens) except -1:
    p.n_cache_calls += 1
    p.coordinator.cache_blocks(request, num_tokens)
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
