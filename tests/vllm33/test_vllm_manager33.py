"""Differential tests: vLLM 0.33.x's own ``KVCacheManager`` driven the way its
scheduler drives it (``vllm_workload33``), once over vLLM's ``BlockPool`` and
once over kvpool's 0.33 pool (each core), must make identical decisions and
publish identical bytes.

What is compared (see ``vllm_workload33.run``): every ``allocate_slots``
result (block ids per group, or ``None``), every ``get_computed_blocks``
result (block ids, token count, shared-prefix boundary), preemptions and
frees, the per-step copy-on-write pairs and new-block ids, the cached-token
estimate of each request's first token, ``reset_prefix_cache`` results, and
after every step the msgpack bytes of vLLM's own ``KVEventBatch`` built from
``take_events()``, the ``PrefixCacheStats``, usage, free-block count,
common-prefix counts and (with a metrics collector) the number of eviction
samples.

Copy-on-write: vLLM 0.33's manager copies a block only on a *partial* prefix
hit (a hit ending inside a block, ``_apply_cow``), and partial hits are only
enabled by ``partial_hash_hits_enabled``: a hybrid model with a Mamba group in
"align" cache mode whose block is larger than the hash block. Attention-only
models never take it (on any device; ``test_copy_on_write_needs_mamba_align``
pins that down); the manager is pure Python, so on CPU it takes it exactly as
on a GPU. The ``mamba-cow`` workload (full attention + Mamba "align", 64-token
blocks, 16-token hashes, repeated prompts) does: partial hits, ``_apply_cow``,
``move_block_hashes``, ``ref_cnt += 1`` on pool blocks from outside the pool,
and the scheduler's free of the retained copy endpoints, where a source block
copied for two requests in one step is in one ``free_blocks`` call twice.
What attention-only models do take, and what the ``shared-running-prefix``
workload exercises, is a prefix hit on blocks that a running request holds at
that moment (``touch`` of blocks with ``ref_cnt > 0``).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest

try:
    # Not just ``import vllm``: a checkout's tests/vllm directory on sys.path
    # would satisfy that as an empty namespace package.
    import vllm.v1.core.kv_cache_manager  # noqa: F401
    from vllm import __version__ as _vllm_version
except ImportError as exc:
    pytest.skip(f"vLLM 0.33.x is not importable here ({exc})", allow_module_level=True)
if not _vllm_version.startswith("0.33."):
    pytest.skip(f"vLLM {_vllm_version} is not 0.33.x", allow_module_level=True)

import vllm_workload33 as vw  # noqa: E402
from _manager_trace import (  # noqa: E402
    counters,
    events_broken,
    first_difference,
    free_order_broken,
    step_fields,
)
from _vllm_helpers import pool_in_vllm  # noqa: E402
from vllm.v1.core import block_pool as vllm_block_pool  # noqa: E402
from vllm.v1.core import kv_cache_coordinator  # noqa: E402
from vllm.v1.core.kv_cache_utils import partial_hash_hits_enabled  # noqa: E402

import kvpool  # noqa: E402
import kvpool.vllm as kv_vllm  # noqa: E402
from kvpool.v0_33.vllm_events import vllm_block_pool_class  # noqa: E402

WORKLOADS = {
    "full": vw.FULL.scaled(num_requests=900),
    "full+sliding": vw.HYBRID.scaled(num_requests=600),  # metrics collector on
    "full32+sliding16": vw.MIXED_BLOCK_SIZES.scaled(num_requests=600),
    "events+metrics": vw.FULL.scaled(
        name="events on, metrics collector (every block)",
        metrics_sample_rate=1.0,
        num_requests=500,
    ),
    "full-bytes-hashes": vw.FULL.scaled(
        name="full, raw-bytes event hashes", num_requests=400
    ),
    "no-prefix-caching": vw.FULL.scaled(
        name="prefix caching off", enable_caching=False, num_requests=400
    ),
    "events-off": vw.FULL.scaled(
        name="events off", enable_events=False, num_requests=400
    ),
    # Requests trickle in while others with the same prefix run: prefix hits
    # on blocks in use (ref_cnt > 0), in a tight pool.
    "shared-running-prefix": vw.FULL.scaled(
        name="hits on a prefix shared with running requests",
        num_requests=500,
        num_prefixes=6,
        arrivals_per_step=2,
        num_blocks=400,
        metrics_sample_rate=0.5,
    ),
    # Sub-block prefix hits and their copy-on-write (see the module docstring).
    "mamba-cow": vw.FULL.scaled(
        name="full attention + Mamba align: partial hits, copy-on-write",
        groups=(vw.Group("full", 64), vw.Group("mamba", 64)),
        hash_block_size=16,
        num_requests=300,
        num_prefixes=6,
        arrivals_per_step=2,
        repeat_every=3,
        num_blocks=400,
        metrics_sample_rate=0.5,
    ),
}


def _cores() -> dict[str, ModuleType]:
    cores = {"pure-python": importlib.import_module("kvpool._core_py")}
    try:
        cores["compiled"] = importlib.import_module("kvpool._core")
    except ImportError:
        pass
    return cores


CORES = _cores()

@contextlib.contextmanager
def kvpool_in_vllm(pool_class: type) -> Iterator[None]:
    """vLLM builds ``pool_class`` inside the block: for the core in use
    through ``kvpool.vllm.enabled()``, exactly as a user installs it; for the
    other core by rebinding the same names."""
    if pool_class is vllm_block_pool_class():
        with kv_vllm.enabled():
            yield
        return
    with pool_in_vllm(pool_class):
        yield


@pytest.fixture(autouse=True)
def _vllm_pool_in_place() -> Iterator[None]:
    assert kv_cache_coordinator.BlockPool is vllm_block_pool.BlockPool
    yield
    assert kv_cache_coordinator.BlockPool is vllm_block_pool.BlockPool


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


_reference: dict[str, vw.Run] = {}


def reference_run(key: str, w: vw.Workload) -> vw.Run:
    """vLLM's own pool on the workload (once per session per workload)."""
    if key not in _reference:
        _reference[key] = vw.run(w)
    return _reference[key]


def candidate_run(pool_class: type, w: vw.Workload) -> vw.Run:
    with kvpool_in_vllm(pool_class):
        assert type(vw.make_manager(w).block_pool) is pool_class
        return vw.run(w)


# -------------------------------------------------------------------- tests


@pytest.mark.parametrize("core", list(CORES))
@pytest.mark.parametrize("workload", list(WORKLOADS), indirect=True)
def test_same_decisions_and_events(
    workload: vw.Workload, core: str, request: pytest.FixtureRequest
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
    if workload.metrics_sample_rate:
        assert any(e[0] == "step" and e[7] for e in expected.trace)
    if key == "shared-running-prefix":
        assert expected.hits_on_blocks_in_use > 0
    if key == "mamba-cow":
        assert expected.cow_copies > 0
        # A source copied for two requests in one step: freed twice in one call.
        assert any(e[0] == "drain" and len(set(e[3])) < len(e[3]) for e in expected.trace)
    if key == "full32+sliding16":
        # Prompts ending inside a 32-token block: cache_partial_block, whose
        # BlockStored covers fewer tokens than the block.
        assert any(
            ev["type"] == "BlockStored" and len(ev["token_ids"]) % 32
            for e in expected.trace
            if e[0] == "step" and e[2]
            for ev in step_fields(e)["events"]
        ), "no partial-block key was ever stored"

    got = candidate_run(vllm_block_pool_class(CORES[core]), workload)
    diff = first_difference(expected.trace, got.trace)
    if diff:
        pytest.fail(f"{workload.name} / kvpool ({core}): {diff}", pytrace=False)
    assert counters(got) == counters(expected)


def _free_order_broken(core: ModuleType) -> type:
    """kvpool's pool over ``core``, freeing in the opposite order."""
    return free_order_broken(vllm_block_pool_class(core))


def _events_broken(core: ModuleType) -> type:
    """kvpool's pool over ``core``, dropping the last event of every batch."""
    return events_broken(vllm_block_pool_class(core))


@pytest.mark.parametrize("core", list(CORES))
@pytest.mark.parametrize(
    "breakage, where",
    [(_free_order_broken, "expected (vLLM's pool)"), (_events_broken, "KV events differ")],
    ids=["free-order", "dropped-event"],
)
def test_a_broken_pool_is_caught(core: str, breakage, where: str) -> None:
    """The comparison is not vacuous: a pool that differs from vLLM's in one
    detail fails it, and the report names the first difference."""
    w = WORKLOADS["full"].scaled(num_requests=150)
    expected = vw.run(w)
    got = candidate_run(breakage(CORES[core]), w)
    diff = first_difference(expected.trace, got.trace)
    assert diff is not None, f"{breakage.__name__} went unnoticed"
    assert where in diff, diff
    # And the unbroken pool passes on the same workload.
    assert first_difference(expected.trace, candidate_run(
        vllm_block_pool_class(CORES[core]), w
    ).trace) is None


def test_copy_on_write_needs_mamba_align() -> None:
    """vLLM 0.33 takes its copy-on-write path (``_apply_cow``, reported by
    ``take_kv_cache_block_copies``) only on partial hash hits, and enables
    those only for a Mamba "align" group with a block larger than the hash
    block. None of the attention-only workloads qualifies, so none of them
    ever copies; they do hit blocks held by running requests."""
    for key, w in WORKLOADS.items():
        groups = vw.kv_cache_config(w).kv_cache_groups
        assert partial_hash_hits_enabled(groups, w.hash_block_size) == (
            key == "mamba-cow"
        ), key
    r = reference_run("shared-running-prefix", WORKLOADS["shared-running-prefix"])
    assert r.cow_copies == 0
    assert r.hits_on_blocks_in_use > 0
    assert all(not e[2] for e in r.trace if e[0] == "drain")


def test_event_hash_format_follows_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bytes-hash variant really publishes bytes through kvpool's pool
    (so the comparison above covers both wire formats), as vLLM's own event
    class, annotated by the manager."""
    w = WORKLOADS["full-bytes-hashes"].scaled(num_requests=40)
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    from vllm.distributed.kv_events import BlockStored

    with kvpool_in_vllm(vllm_block_pool_class(kvpool.CORE)):
        mgr = vw.make_manager(w)
        reqs = vw.build_requests(w)
        computed, n, _ = mgr.get_computed_blocks(reqs[0])
        mgr.allocate_slots(reqs[0], reqs[0].num_tokens - n, n, computed)
        (stored,) = mgr.take_events()
    assert type(stored) is BlockStored
    assert stored.kv_cache_spec_kind is not None
    assert stored.block_hashes and all(
        isinstance(h, bytes) for h in stored.block_hashes
    )
