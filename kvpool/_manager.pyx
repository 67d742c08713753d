# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled hot paths of vLLM's ``KVCacheManager`` (the 0.30 to 0.34 lines).

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

Where each rule lives (one extension module each, sharing through
``.pxd`` files; the lines import every entry point from this module):

* ``_plan`` (``.pxd``: the data layout, and the small rules every path
  inlines): ``ManagerPlan`` and its groups, built once by ``plan_for``.
* ``_allocate``: ``allocate_slots`` -- counting, adopting a hit or a
  connector's tokens, new blocks, the blocks a window frees early -- and
  the coordinator's ``get_num_blocks_to_allocate``.
* ``_caching``: the caching step (``cache_blocks``) and its events.
* ``_lookup``: the prefix-cache finders (``get_computed_blocks``) and
  ``estimate_cached_tokens``.
* ``_mamba_align``: a Mamba group in "align" mode, and copy-on-write.
* this module: the rest of the manager's methods (``free``, the block
  tables read back).
"""
from cpython.dict cimport PyDict_GetItemWithError
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_New, PyTuple_SET_ITEM
from kvpool._core cimport KVCacheBlock
from kvpool._plan cimport _Group, ManagerPlan, PyList_CheckExact, PyTuple_CheckExact, _vllm_base


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


# kvpool's block classes, whose block_id is read from the handle.
from kvpool._core import KVCacheBlock as _B15, KVCacheBlock24 as _B24, KVCacheBlock33 as _B33


cdef frozenset _KVPOOL_BLOCKS = frozenset((_B15, _B24, _B33))


# The entry points the lines bind as methods, from the modules that hold them.
from kvpool._plan import plan_for, refresh
from kvpool._allocate import (
    allocate_slots, allocate_slots_0_30, coordinator_get_num_blocks_to_allocate,
    remove_skipped_blocks,
)
from kvpool._caching import cache_blocks
from kvpool._lookup import (
    estimate_cached_tokens, estimate_cached_tokens_0_34, get_computed_blocks,
    get_computed_blocks_0_30, get_computed_blocks_0_34,
)
