"""Bad input to kvpool's 0.33 KV-cache manager: where vLLM's manager fails
an ``assert`` (possibly after it changed the request's blocks, and not at
all under ``python -O``), kvpool's raises a ``ValueError`` naming the
request, and nothing changed (docs/compatibility.md)."""

from __future__ import annotations

import pytest
import vllm_workload33 as vw
from vllm.v1.core.kv_cache_manager import KVCacheBlocks as VLLMKVCacheBlocks

from _manager33 import BLOCK
from _manager33 import kvpool_manager as _manager
from _manager33 import new_request as _request

from kvpool.v0_33.kv_cache_manager import KVCacheBlocks


def _state(mgr) -> tuple:
    managers = mgr.coordinator.single_type_managers
    return (
        mgr.block_pool.get_num_free_blocks(),
        tuple({r: [b.block_id for b in bs] for r, bs in m.req_to_blocks.items()} for m in managers),
        tuple(dict(m.num_cached_block) for m in managers),
    )


def _some_hit(mgr, n: int = 1) -> KVCacheBlocks:
    return KVCacheBlocks((mgr.block_pool.get_new_blocks(n),))


def test_a_running_request_adopting_blocks_raises_and_changes_nothing() -> None:
    w, mgr = _manager()
    req = _request(w, "a", 2 * BLOCK)
    assert mgr.allocate_slots(req, 2 * BLOCK) is not None
    req.num_computed_tokens = 2 * BLOCK
    assert "a" in mgr.coordinator.single_type_managers[0].num_cached_block  # running
    hit = _some_hit(mgr)
    before = _state(mgr)
    with pytest.raises(ValueError, match="'a' is running"):
        mgr.allocate_slots(req, 1, num_new_computed_tokens=BLOCK, new_computed_blocks=hit)
    assert _state(mgr) == before


def test_a_request_with_blocks_adopting_blocks_raises_and_changes_nothing() -> None:
    w, mgr = _manager()
    req = _request(w, "b", BLOCK // 2)  # no full block: not in num_cached_block
    assert mgr.allocate_slots(req, BLOCK // 2) is not None
    assert "b" not in mgr.coordinator.single_type_managers[0].num_cached_block
    hit = _some_hit(mgr)
    before = _state(mgr)
    with pytest.raises(ValueError, match="already has 1 blocks"):
        mgr.allocate_slots(req, 1, num_new_computed_tokens=BLOCK, new_computed_blocks=hit)
    assert _state(mgr) == before


def test_adopting_blocks_with_caching_off_raises_and_changes_nothing() -> None:
    w, mgr = _manager(caching=False)
    req = _request(w, "c", 3 * BLOCK)
    hit = _some_hit(mgr)
    before = _state(mgr)
    with pytest.raises(ValueError, match="prefix caching is off"):
        mgr.allocate_slots(req, BLOCK, num_new_computed_tokens=BLOCK, new_computed_blocks=hit)
    assert _state(mgr) == before


def test_vllms_manager_fails_an_assert_there() -> None:
    """The same call to vLLM's manager: an AssertionError (so kvpool's
    ValueError replaces an assert, it does not refuse a valid call)."""
    w = vw.FULL.scaled(num_requests=4, num_blocks=64)
    mgr = vw.make_manager(w, vw.KVCacheManager)
    req = _request(w, "a", 2 * BLOCK)
    assert mgr.allocate_slots(req, 2 * BLOCK) is not None
    req.num_computed_tokens = 2 * BLOCK
    hit = VLLMKVCacheBlocks((mgr.block_pool.get_new_blocks(1),))
    with pytest.raises(AssertionError):
        mgr.allocate_slots(req, 1, num_new_computed_tokens=BLOCK, new_computed_blocks=hit)
