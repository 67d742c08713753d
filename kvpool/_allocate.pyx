"""``KVCacheManager.allocate_slots`` in C: the coordinator's and each
single-type manager's count of blocks to allocate, the adoption of a
prefix-cache hit or a connector's external tokens, the new blocks, and the
blocks a window or chunk frees before the count (``remove_skipped_blocks``).
A Mamba group in "align" mode is counted and served by ``_mamba_align``;
the caching step that ends the call is ``_caching``'s."""

from cpython.dict cimport PyDict_Contains, PyDict_GetItemWithError
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject
from cpython.set cimport PySet_Add
from cpython.ref cimport Py_INCREF
from cpython.exc cimport PyErr_Occurred
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from kvpool._plan cimport (
    _Group, ManagerPlan, PyList_CheckExact, PyTuple_CheckExact, PySet_Contains, _count, _cdiv,
    _floordiv, _mod, _req_blocks, _free_blocks, _skipped_tokens, _new_blocks, _vllm_base,
)
from kvpool._mamba_align cimport (
    _align_has_left, _cow_ok, _align_steady, _align_count, _align_new_blocks, _cow_new_blocks,
    _align_counts_ok,
)
from kvpool._caching cimport _cache


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


# The marker of "not decided here": the caller hands the call to vLLM.
cdef object _VLLM = object()


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
    # (a connector's external tokens beside an align-mode group stay vLLM's:
    # issue 52's workload for them, connector+mamba-ckpt, makes no progress
    # under vLLM's own manager in the driver, so nothing proves a compiled
    # path against it yet -- and vLLM's fast path there, a load filling the
    # state's block, marks the request allocated, which the loop below does
    # not)
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
        if p.has_align:
            _mark_allocated(p, rid)
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
            if g.align:
                PySet_Add(g.allocated, rid)  # (vLLM's fast path marks it)
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


cdef int _mark_allocated(ManagerPlan p, object rid) except -1:
    # An align-mode group's allocate_new_blocks with blocks enough, no
    # checkpoint and no copy-on-write (its fast path, returning none) still
    # marks the request allocated: a request whose hit covers its chunk --
    # an adoption with no new tokens -- is then running, as in vLLM.
    cdef _Group g
    for g in p.groups:
        if g.align:
            PySet_Add(g.allocated, rid)
    return 0


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
    has new computed blocks -- an align-mode Mamba group's predictor
    included (the scheduler's remaining-blocks count, its checkpoint
    recorded or dropped outside the admission count)."""
    cdef ManagerPlan p
    cdef _Group g
    cdef Py_ssize_t tokens = 0, total = 0, required = 0, enc = 0, main = 0, prefill_end = 0
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
        # (a group's new computed blocks -- a hit, from vLLM's own
        # allocate_slots -- bring the same-step refusal, the partial hit
        # and the hit's evictable blocks of an align-mode predictor: vLLM's)
        for group_blocks in new_computed_blocks:
            if len(group_blocks) != 0:
                fast = False
                break
    if fast and p.has_align:
        # (an align-mode group's predictor over the main model's tokens from
        # the computed ones, with its prefill_end -- 0.31 on, 0 when not
        # passed, read only where a checkpoint is possible, as
        # _align_checkpoint applies the coordinator's retention rule itself;
        # a table that is not a list, or a count that is not an int: vLLM's)
        fast = _count(num_tokens_main_model, &main) and _align_counts_ok(p, request_id)
        if fast and p.has_prefill_end and p.align_ckpts and (args or kwargs):
            fast = _count(args[0] if args else kwargs["prefill_end"], &prefill_end)
    if not fast:
        p.n_coord_base += 1
        return p.base_num_blocks(self, request_id, num_tokens, new_computed_blocks,
                                 num_encoder_tokens, total_computed_tokens,
                                 num_local_computed_tokens, num_tokens_main_model,
                                 apply_admission_cap, *args, **kwargs)
    p.n_coord += 1
    admission_cap = bool(apply_admission_cap)
    for g in p.groups:
        if g.align:
            # (no hit: its partial hit is the request's pending copy-on-write;
            # the checkpoint recorded only outside the admission count)
            required += _align_count(p, g, request_id, total, main, prefill_end, None,
                                     PyDict_Contains(g.phr, request_id) == 1,
                                     not admission_cap)
            continue
        required += _group_blocks_to_allocate(g, request_id, tokens, enc, None, total,
                                              0, admission_cap)
    return required
