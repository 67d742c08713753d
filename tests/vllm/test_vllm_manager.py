"""Differential tests: vLLM 0.15.x's own ``KVCacheManager`` driven by a
scheduler-like workload, once over vLLM's ``BlockPool`` and once over
kvpool's, must make identical decisions and publish identical bytes.

What is compared (see ``vllm_workload.run``): every ``allocate_slots`` result
(block ids per group, or ``None``), every ``get_computed_blocks`` result
(block ids and token count), preemptions and frees, ``reset_prefix_cache``
results, and after every step the msgpack bytes of vLLM's own
``KVEventBatch`` built from ``take_events()``, the ``PrefixCacheStats`` from
``make_prefix_cache_stats()``, usage, free-block count, common-prefix counts
and (where a metrics collector is on) the number of eviction samples.
"""

from __future__ import annotations

import importlib

import msgspec
import pytest
import vllm_workload as vw
from _manager_trace import counters, first_difference
from vllm.distributed import kv_events as vllm_kv_events
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_coordinator

import kvpool
from kvpool.vllm import vllm_block_pool_class
import kvpool.vllm as kv_vllm

WORKLOADS = {
    "full": vw.FULL.scaled(num_requests=2000),
    "full+sliding": vw.HYBRID.scaled(num_requests=1200),
    "full32+sliding16": vw.MIXED_BLOCK_SIZES.scaled(num_requests=1200),
    "full-bytes-hashes": vw.FULL.scaled(
        name="full, raw-bytes event hashes", num_requests=600
    ),
    "no-prefix-caching": vw.FULL.scaled(
        name="prefix caching off", enable_caching=False, num_requests=600
    ),
    "events-off": vw.FULL.scaled(
        name="events off", enable_events=False, num_requests=600
    ),
}


def _cores() -> dict[str, object]:
    cores = {"pure-python": kvpool._core_py}
    try:
        cores["compiled"] = importlib.import_module("kvpool._core")
    except ImportError:
        pass
    return cores


CORES = _cores()
# Pools under test: the package's default through the public install(), and
# each other core that is importable, over the same facade.
POOLS = ["kvpool"] + [
    f"kvpool-{name}" for name, core in CORES.items() if core is not kvpool.CORE
]

_reference: dict[str, vw.Run] = {}


@pytest.fixture
def workload(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> vw.Workload:
    name = request.param
    if name == "full-bytes-hashes":
        monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    else:
        monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    return WORKLOADS[name]


def reference_run(key: str, w: vw.Workload) -> vw.Run:
    """vLLM's own pool on the workload (once per session per workload)."""
    if key not in _reference:
        assert kv_cache_coordinator.BlockPool is vllm_block_pool.BlockPool
        _reference[key] = vw.run(w)
    return _reference[key]


def candidate_run(pool: str, w: vw.Workload, monkeypatch: pytest.MonkeyPatch) -> vw.Run:
    if pool == "kvpool":
        with kv_vllm.enabled():
            mgr_pool = vw.make_manager(w).block_pool
            assert type(mgr_pool) is vllm_block_pool_class("0.15")
            return vw.run(w)
    other = kvpool.make_block_pool_class(CORES[pool.removeprefix("kvpool-")])
    monkeypatch.setattr(kv_cache_coordinator, "BlockPool", other)
    return vw.run(w)


# Field names in wire order (array_like structs, after the tag), from vLLM's
# own event classes.
EVENT_FIELDS = {
    cls.__name__: tuple(f.name for f in msgspec.structs.fields(cls))
    for cls in (vllm_kv_events.BlockStored, vllm_kv_events.BlockRemoved)
}


def assert_same_trace(expected: list[tuple], got: list[tuple], label: str) -> None:
    """Fail at the first differing entry, showing what differs and the calls
    that led to it."""
    diff = first_difference(expected, got, EVENT_FIELDS)
    if diff:
        pytest.fail(f"{label}: {diff}", pytrace=False)


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("workload", list(WORKLOADS), indirect=True)
def test_same_decisions_and_events(
    workload: vw.Workload, pool: str, request: pytest.FixtureRequest, monkeypatch
) -> None:
    key = request.node.callspec.params["workload"]
    expected = reference_run(key, workload)
    # The workload must actually exercise what it claims to.
    assert expected.finished == workload.num_requests
    assert expected.busy_resets_refused > 0
    assert any(e[0] == "evict" for e in expected.trace)
    if workload.enable_caching:
        assert expected.preemptions > 0
        assert expected.prefix_hit_tokens > 0
        assert any(e[0] == "reset" and e[2] for e in expected.trace)
    if workload.enable_events:
        assert expected.events > 0

    got = candidate_run(pool, workload, monkeypatch)
    assert_same_trace(expected.trace, got.trace, f"{workload.name} / {pool}")
    assert counters(got) == counters(expected)


def test_event_hash_format_follows_env(monkeypatch) -> None:
    """The bytes-hash variant really publishes bytes (so the comparison above
    covers both wire formats)."""
    w = WORKLOADS["full-bytes-hashes"].scaled(num_requests=40)
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    with kv_vllm.enabled():
        mgr = vw.make_manager(w)
        reqs = vw.build_requests(w)
        computed, n = mgr.get_computed_blocks(reqs[0])
        mgr.allocate_slots(reqs[0], reqs[0].num_tokens - n, n, computed)
        (stored,) = mgr.take_events()
    assert type(stored).__name__ == "BlockStored"
    assert stored.block_hashes and all(
        isinstance(h, bytes) for h in stored.block_hashes
    )
