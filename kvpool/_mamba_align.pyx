"""A Mamba group in ``mamba_cache_mode == "align"`` (prefix caching on), and
copy-on-write of a partial-block hit: vLLM's ``MambaManager`` count of
blocks to allocate (its prefill checkpoints), its new blocks, the state
blocks it frees early, and the proofs that its caching step has nothing to
do. docs/mamba-align.md reads vLLM's code this mirrors."""

from cpython.dict cimport PyDict_Contains, PyDict_GetItemWithError
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject
from cpython.exc cimport PyErr_Occurred
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from kvpool._plan cimport (
    _Group, ManagerPlan, PyList_CheckExact, PyTuple_CheckExact, PySet_Contains, PySet_Add,
    _count, _cdiv, _floordiv, _mod, _req_blocks, _exact_table, _skipped_tokens,
    _hybrid_cacheable, _new_blocks,
)


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


cdef bint _align_counts_ok(ManagerPlan p, object rid) except -1:
    # Whether _align_count can stand for every align-mode group's predictor
    # in a call of the coordinator's get_num_blocks_to_allocate that brings
    # no new computed blocks (the scheduler's remaining-blocks count, vLLM's
    # own allocate_slots past its adoption): the request's table in each is
    # absent (the predictor makes it, as vLLM's does) or an exact list. With
    # no hit, vLLM's predictor reads nothing else _align_count does not --
    # its same-step refusal needs a hit, its partial hit is the request's
    # pending copy-on-write (_partial_hit_reqs) -- and writes only the table
    # entry and, outside the admission count, _checkpoints.
    cdef _Group g
    cdef PyObject *entry
    for g in p.groups:
        if not g.align:
            continue
        entry = PyDict_GetItemWithError(g.rtb, rid)
        if entry == NULL:
            if PyErr_Occurred():
                return -1
        elif not PyList_CheckExact(<object> entry):
            return False
    return True


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


# Mamba caching (issue 52): what _cache does of an align-mode group's
# caching step (MambaManager.cache_blocks over the base class's).


cdef bint _align_tail_none(ManagerPlan p, _Group g, object request, object rid,
                           Py_ssize_t n) except -1:
    # Whether the group's _cache_partial_tail_block(request, n, ...) returns
    # None having changed nothing (``n``: the tokens the coordinator hands
    # the group, before the base step's cap at the hashed tokens). Its
    # checkpoint branch (a checkpoint recorded) always acts: False. Its
    # prompt-tail branch returns None at once for an n that is not on a hash
    # boundary (0.30, 0.31: also when the state block is the hash block, or
    # n ends a block; 0.32 on: also for no n), then for an n that is not the
    # prompt's last hash boundary -- 0.30, 0.31: floor(P / H) * H, EAGLE's
    # drop one H lower (not below 0); 0.32 on: the prefill's checkpoint
    # position, a proof limit of P with the drop, else P - max(1, lookahead
    # hashes) (0.32: P - 1), floored to H, less H with the drop, not below
    # 0 -- nor the shared-prefix junction (only with shared_prefix_checkpoint;
    # any n equal to the junction is left to vLLM, which tests more); then
    # for a block index (0.30, 0.31: n // bs; 0.32 on: cdiv(n, bs) - 1)
    # beyond the table or a null block. Anything else -- no exact table,
    # a negative index, a count that is not an int -- is not proven: False.
    cdef Py_ssize_t P, H = p.hash_block_size, bs = g.block_size, tail, limit, b, spb
    if PyDict_Contains(g.ckpts, rid):
        return False
    if p.align_rules >= 32:
        if n <= 0 or _mod(n, H) != 0:
            return True
    else:
        if bs == H or _mod(n, bs) == 0 or _mod(n, H) != 0:
            return True
    if not _count(request.num_prompt_tokens, &P):
        return False
    if p.align_rules >= 32:
        if g.mc_drop:
            limit = P
        else:
            limit = P - (p.mc_lookahead if p.mc_lookahead > 1 else 1)
        tail = _floordiv(limit, H) * H
        if g.mc_drop:
            tail -= H
    else:
        tail = _floordiv(P, H) * H
        if g.mc_drop:
            tail -= H
    if tail < 0:
        tail = 0
    if n != tail:
        if not g.mc_junction:
            return True
        if not _count(request.shared_prefix_boundary, &spb):
            return False
        if n != spb:
            return True
    b = _cdiv(n, bs) - 1 if p.align_rules >= 32 else _floordiv(n, bs)
    table = _exact_table(g, rid)
    if table is None or b < 0:
        return False
    return b >= PyList_GET_SIZE(table) or <object> PyList_GET_ITEM(table, b) is p.null_block


cdef inline int _mark(list mask, Py_ssize_t boundary, Py_ssize_t align, Py_ssize_t bs,
                      Py_ssize_t start, Py_ssize_t end) except -1:
    # reachable_block_mask's reachable boundary: the block ending on the
    # boundary floored to the alignment, if it is one of start..end.
    cdef Py_ssize_t blk = _floordiv(_floordiv(boundary, align) * align, bs) - 1
    if start <= blk < end:
        mask[blk - start] = True
    return 0


cdef object _align_mask(ManagerPlan p, _Group g, object request, Py_ssize_t start,
                        Py_ssize_t end, object retention, bint *ok):
    # The base step's block mask for blocks start..end (start < end), as
    # its reachable_block_mask builds it: None (dense)
    # without a retention interval or a hit alignment; else False per block,
    # with a positive interval True on the last block of each of its
    # segments (None if a segment is at most one block); then True on the
    # block ending at each reachable boundary, floored to the alignment: the
    # coordinator's replay boundaries (no EAGLE group: P - 1; else the
    # resend's and the extension's, each one scheduler block lower, not
    # below 0), the request's shared-prefix junction if any and, 0.33 on for
    # an EAGLE group, the junction one block lower. ``ok`` False (and None)
    # for a retention interval, prompt or junction that is not an int: the
    # coordinator's code decides.
    cdef Py_ssize_t r, per, first, i, n = end - start, P, spb, S = p.mc_sched
    cdef Py_ssize_t bs = g.block_size, A = g.mc_align_tokens
    cdef Py_ssize_t resend, ext
    ok[0] = True
    if retention is None or A == 0:
        return None
    if not (_count(retention, &r) and _count(request.num_prompt_tokens, &P)
            and _count(request.shared_prefix_boundary, &spb)):
        ok[0] = False
        return None
    if r != 0:
        per = _floordiv(r, bs)
        if per <= 1:
            return None
    mask = [False] * n
    if r != 0:
        first = _floordiv(start + per, per) * per - 1
        i = first - start
        while i < n:
            mask[i] = True
            i += per
    if p.mc_replay_eagle:
        resend = _floordiv(P - 1, S) * S - S
        ext = _floordiv(P, S) * S - S
        _mark(mask, resend if resend > 0 else 0, A, bs, start, end)
        _mark(mask, ext if ext > 0 else 0, A, bs, start, end)
    else:
        _mark(mask, P - 1, A, bs, start, end)
    if spb != 0:
        _mark(mask, spb, A, bs, start, end)
        if p.mc_junction_eagle and g.use_eagle:
            _mark(mask, spb - bs, A, bs, start, end)
    return mask


cdef object _align_tail(ManagerPlan p, _Group g, object request, object rid, Py_ssize_t n,
                        object retention):
    # The group's _cache_partial_tail_block(request, n, retention_interval=
    # retention), done here: its hash (or None). Decided first, then done;
    # anything unusual -- a checkpoint that is not two ints, or its index
    # outside the table (vLLM asserts), a count or junction that is not an
    # int, a hit alignment of None, a negative block index -- is its own
    # code, before any change (counted: n_mc_tails).
    #
    # A checkpoint recorded (pos, idx): its block, the table's at idx, is
    # transient -- evicted from the pool's map (_maybe_evict_cached_block)
    # -- when 0.30: the retention interval is 0, n is below the prompt and
    # pos is not the junction; 0.31: also pos is not the prompt's own
    # checkpoint position (the proof limit P - 1 floored to H, EAGLE's drop
    # one H lower, not below 0); 0.32 on: pos is not the prompt's position
    # (_prompt_position, over the hit alignment), nor retained (pos ends a
    # state block that reachable_block_mask keeps with no boundaries: no
    # interval, or a segment of at most one block, or a segment's last
    # block), nor the junction. Else, unless its hash covers pos already,
    # the pool's cache_partial_block re-keys it at pos, replacing its keys.
    # No checkpoint: _align_tail_none's tests (the junction's exactly:
    # with shared_prefix_checkpoint, n the junction, past the computed
    # tokens and within the prompt), then the block at the tail's index:
    # beyond the table or null, or (0.33 on) keyed at n already -- None;
    # else the pool's cache_partial_block keys it at n and, if it returned
    # a hash (0.32 on: and n ends inside the block), the pending
    # copy-on-write, the lowered cached count and the producer's tail are
    # recorded, in vLLM's order.
    cdef Py_ssize_t P, H = p.hash_block_size, bs = g.block_size, pos, idx, spb, r = -1
    cdef Py_ssize_t limit, prompt_pos, start, per, first, computed, nblocks
    cdef bint transient, retained
    cdef PyObject *entry = PyDict_GetItemWithError(g.ckpts, rid)
    if not _count(request.num_prompt_tokens, &P):
        return _tail_in_vllm(p, g, request, n, retention)
    if retention is not None and not _count(retention, &r):
        return _tail_in_vllm(p, g, request, n, retention)
    if entry != NULL and <object> entry is not None:
        cp = <object> entry
        if not (PyTuple_CheckExact(cp) and PyTuple_GET_SIZE(cp) == 2
                and _count(<object> PyTuple_GET_ITEM(cp, 0), &pos)
                and _count(<object> PyTuple_GET_ITEM(cp, 1), &idx)
                and _count(request.shared_prefix_boundary, &spb)):
            return _tail_in_vllm(p, g, request, n, retention)
        table = _exact_table(g, rid)
        if table is None or not (0 <= idx < PyList_GET_SIZE(table)):
            return _tail_in_vllm(p, g, request, n, retention)
        if p.align_rules < 32:
            transient = retention is not None and r == 0 and n < P and pos != spb
            if transient and p.align_rules == 31:
                prompt_pos = _floordiv(P - 1, H) * H - (H if g.mc_drop else 0)
                transient = pos != (prompt_pos if prompt_pos > 0 else 0)
        else:
            if g.mc_align_tokens == 0:
                return _tail_in_vllm(p, g, request, n, retention)
            limit = P if g.mc_drop else P - (p.mc_lookahead if p.mc_lookahead > 1 else 1)
            prompt_pos = (_floordiv(limit, g.mc_align_tokens) * g.mc_align_tokens
                          - (g.mc_align_tokens if g.mc_drop else 0))
            retained = False
            if _mod(pos, bs) == 0:
                if retention is None:
                    retained = True
                elif r != 0:
                    per = _floordiv(r, bs)
                    start = _floordiv(pos, bs) - 1
                    first = _floordiv(start + per, per) * per - 1
                    retained = per <= 1 or first == start
            transient = (pos != (prompt_pos if prompt_pos > 0 else 0)
                         and not retained and pos != spb)
        block = <object> PyList_GET_ITEM(table, idx)
        if transient:
            p.n_mc_partials += 1
            p.pool._maybe_evict_cached_block(block)
            return None
        if block.block_hash_num_tokens == pos:
            return None
        p.n_mc_partials += 1
        return p.pool.cache_partial_block(
            request=request, block=block, num_tokens=pos, kv_cache_group_id=g.group_id,
            block_size=bs, replace_existing_hashes=True)
    if _align_tail_none(p, g, request, rid, n):
        return None
    # (the tail, or the junction: _align_tail_none found one of them)
    if p.align_rules >= 32:
        limit = P if g.mc_drop else P - (p.mc_lookahead if p.mc_lookahead > 1 else 1)
        prompt_pos = _floordiv(limit, H) * H - (H if g.mc_drop else 0)
    else:
        prompt_pos = _floordiv(P, H) * H - (H if g.mc_drop else 0)
    if n != (prompt_pos if prompt_pos > 0 else 0):
        # (the junction, as _align_tail_none found it: n, with
        # shared_prefix_checkpoint)
        if not (_count(request.shared_prefix_boundary, &spb)
                and _count(request.num_computed_tokens, &computed)):
            return _tail_in_vllm(p, g, request, n, retention)
        if not (g.mc_junction and n == spb and computed < n <= P):
            return None
    idx = _cdiv(n, bs) - 1 if p.align_rules >= 32 else _floordiv(n, bs)
    table = _exact_table(g, rid)
    if table is None or idx < 0:
        return _tail_in_vllm(p, g, request, n, retention)
    nblocks = PyList_GET_SIZE(table)
    if idx >= nblocks:
        return None
    source = <object> PyList_GET_ITEM(table, idx)
    if source.is_null:
        return None
    if p.cap_at_hashed and source.block_hash_num_tokens == n:
        return None
    p.n_mc_partials += 1
    key = p.pool.cache_partial_block(
        request=request, block=source, num_tokens=n, kv_cache_group_id=g.group_id,
        block_size=bs)
    if key is not None and (p.align_rules < 32 or _mod(n, bs) != 0):
        g.phr[rid] = (idx, source)
        g.ncb[rid] = idx
        g.mgr._producer_partial_tail_reqs[rid] = (source, n)
    return key


cdef object _tail_in_vllm(ManagerPlan p, _Group g, object request, Py_ssize_t n,
                          object retention):
    p.n_mc_tails += 1
    return g.mgr._cache_partial_tail_block(request, n, retention_interval=retention)
