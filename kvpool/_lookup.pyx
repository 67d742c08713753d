"""The prefix-cache lookup of kvpool's manager
(``KVCacheManager.get_computed_blocks``): the finders of full attention,
a sliding window and chunked local attention over the core's hash map, and
the hybrid coordinator's spec groups, Mamba align beside full attention
among them (issue 52); ``estimate_cached_tokens``."""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject
from cpython.bytes cimport PyBytes_Check
from kvpool._core cimport BlockHashToBlockMap, PoolCore
from kvpool._plan cimport (
    _Group, _SpecGroup, ManagerPlan, PyList_CheckExact, _count, _cdiv, _floordiv, _vllm_base,
)


cdef object _VLLM = object()  # a call left to vLLM's code


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


# Mamba lookup (issue 52)

cdef inline int _truncate(_SpecGroup s, list out, Py_ssize_t n) except -1:
    # Each group's list of out cut to its first n blocks.
    cdef Py_ssize_t j
    for j in range(s.ngids):
        if PyList_GET_SIZE(<list> PyList_GET_ITEM(out, j)) > n:
            del (<list> PyList_GET_ITEM(out, j))[n:]
    return 0


cdef Py_ssize_t _find_full_sized(ManagerPlan p, _SpecGroup s, object get_cached_block, list hashes,
                                 Py_ssize_t max_length, bint drop, list out) except -1:
    # FullAttentionManager.find_longest_cache_hit at the spec's block s.block
    # (s.scale hash blocks) and the coordinator's alignment A: the blocks
    # from the first to the first miss, block i's hash the last hash block's
    # in it (vLLM's BlockHashListWithBlockSize); in the fine-grained branch
    # (A the hash block, below the block) then the first block past them
    # probed at its inner hash boundaries, highest first, the first hit
    # appended. EAGLE drops the least of A and the block; the hit is rounded
    # down to A and each list cut to the blocks it reaches.
    cdef Py_ssize_t i, f, top, k = 0, hit, a = p.lookup_align
    cdef Py_ssize_t bsz = s.block, sc = s.scale, nraw = PyList_GET_SIZE(hashes)
    cdef Py_ssize_t n = max_length // bsz
    cdef PyObject *got[8]
    cdef list holder = [None]
    if n > nraw // sc:
        n = nraw // sc
    for i in range(n):
        if not _probe(p, s, get_cached_block, _hash_at(hashes, (i + 1) * sc - 1), got, holder):
            break
        _append_hit(s, out, got)
        k += 1
    hit = k * bsz
    if s.fine:
        top = k * sc + sc - 1
        if top > max_length // a:
            top = max_length // a
        if top > nraw:
            top = nraw
        for f in range(top - 1, k * sc - 1, -1):
            if _probe(p, s, get_cached_block, _hash_at(hashes, f), got, holder):
                _append_hit(s, out, got)
                hit = (f + 1) * a
                break
    if drop and hit > 0:
        hit -= a if a < bsz else bsz
    hit -= hit % a  # (hit >= 0)
    _truncate(s, out, _cdiv(hit, bsz))
    return hit


cdef Py_ssize_t _find_mamba(ManagerPlan p, _SpecGroup s, object get_cached_block, list hashes,
                            Py_ssize_t max_length, list out) except -1:
    # MambaManager.find_longest_cache_hit (align mode; EAGLE's drop ignored,
    # as vLLM's): from the right, the first hit. In the fine-grained branch
    # (the alignment A the hash block, below the block) over the hash
    # blocks, the hit (f + 1) * A; otherwise over the blocks (block i's hash
    # the last hash block's in it), a hit whose end is not a multiple of A
    # passed over. Each list: null blocks up to the hit's block, then it.
    cdef Py_ssize_t i, f, j, top, a = p.lookup_align, bsz = s.block, sc = s.scale
    cdef PyObject *got[8]
    cdef list holder = [None]
    if s.fine:
        top = max_length // a
        if top > PyList_GET_SIZE(hashes):
            top = PyList_GET_SIZE(hashes)
        for f in range(top - 1, -1, -1):
            if _probe(p, s, get_cached_block, _hash_at(hashes, f), got, holder):
                for j in range(s.ngids):
                    (<list> PyList_GET_ITEM(out, j)).extend([p.null_block] * (f // sc))
                _append_hit(s, out, got)
                return (f + 1) * a
        return 0
    for i in range(max_length // bsz - 1, -1, -1):
        # (the bound is at most the hashed tokens: _lookup_mamba's full
        # attention hit; _hash_at checks it)
        if _probe(p, s, get_cached_block, _hash_at(hashes, (i + 1) * sc - 1), got, holder):
            if bsz != a and (i + 1) * bsz % a != 0:
                continue
            for j in range(s.ngids):
                (<list> PyList_GET_ITEM(out, j)).extend([p.null_block] * i)
            _append_hit(s, out, got)
            return (i + 1) * bsz
    return 0


cdef object _lookup_mamba(ManagerPlan p, list hashes, Py_ssize_t max_length):
    # The hybrid coordinator's find_longest_cache_hit over full attention
    # and Mamba align (_mamba_specs): a simple hybrid, so one pass -- full
    # attention at the bound (an EAGLE drop's margin past it, capped at the
    # bound, 0.30-0.31, or the hashed tokens, 0.32 on), Mamba at its hit --
    # then full attention cut to the blocks of the hit (Mamba's lists are
    # not). Returns (blocks of each group, hit, uncached common prefix).
    cdef _SpecGroup full = <_SpecGroup> p.lookup_specs[0]
    cdef _SpecGroup mamba = <_SpecGroup> p.lookup_specs[1]
    cdef Py_ssize_t j, reach = max_length, cap, full_hit, curr, hit
    cdef list by_group = [None] * p.ngroups
    cdef list out_full = [[] for j in range(full.ngids)]
    cdef list out_mamba = [[] for j in range(mamba.ngids)]
    get_cached_block = p.pool.get_cached_block
    if full.drop_eagle:
        cap = PyList_GET_SIZE(hashes) * p.hash_block_size if p.margin_to_hashes else max_length
        reach = max_length + full.margin
        if reach > cap:
            reach = cap
    full_hit = _find_full_sized(p, full, get_cached_block, hashes, reach, full.drop_eagle, out_full)
    curr = _find_mamba(p, mamba, get_cached_block, hashes, full_hit, out_mamba)
    # (vLLM keeps the bound when the pass did not shrink it; the longest
    # hit is full attention's: Mamba's is at most its bound)
    hit = curr if curr < max_length else max_length
    _truncate(full, out_full, _cdiv(hit, full.block))
    for j in range(full.ngids):
        by_group[<Py_ssize_t> full.group_ids[j]] = out_full[j]
    for j in range(mamba.ngids):
        by_group[<Py_ssize_t> mamba.group_ids[j]] = out_mamba[j]
    for j in range(p.ngroups):
        if by_group[j] is None:
            by_group[j] = []
    return tuple(by_group), hit, (full_hit if full_hit > curr else curr) - hit


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
    if p.mamba_lookup:
        found = _lookup_mamba(p, <list> hashes, max_length)
    else:
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


cdef int _count_base(self) except -1:
    # A get_computed_blocks call handed to vLLM's method (counted where the
    # manager has a plan).
    plan = self._kvpool_plan
    if plan is not None:
        (<ManagerPlan> plan).n_lookups_base += 1
    return 0


def get_computed_blocks(self, request, max_cache_hit_length=None):
    """vLLM 0.33's ``KVCacheManager.get_computed_blocks``: the prefix-cache
    hit looked up in C where the plan says so (one full-attention or
    sliding-window group, the simple hybrids of the hash block, full
    attention + Mamba align: ``_plan_lookup``); vLLM's own method otherwise."""
    result = _computed_blocks(self, request, max_cache_hit_length)
    if result is _VLLM:
        _count_base(self)
        return _vllm_base(self, "get_computed_blocks")(self, request, max_cache_hit_length)
    return result


def get_computed_blocks_0_34(self, request, max_cache_hit_length=None):
    """vLLM 0.34's ``KVCacheManager.get_computed_blocks`` (the request's
    ``prefix_cache_hit_limit`` and ``get_max_cache_hit_length``), as
    ``get_computed_blocks``."""
    result = _computed_blocks(self, request, max_cache_hit_length, True)
    if result is _VLLM:
        _count_base(self)
        return _vllm_base(self, "get_computed_blocks")(self, request, max_cache_hit_length)
    return result


def get_computed_blocks_0_30(self, request):
    """vLLM 0.30-0.32's ``KVCacheManager.get_computed_blocks`` (no
    ``max_cache_hit_length``), as ``get_computed_blocks``."""
    result = _computed_blocks(self, request, None)
    if result is _VLLM:
        _count_base(self)
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
