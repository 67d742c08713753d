"""Differential tests for any vLLM release: the manager suite of ``python -m
kvpool.vllm --prove`` (``kvpool.vllm.proof.manager``, whose docstring says
what it compares), run here over kvpool's line of the release
(``kvpool.vllm.vllm_line(vllm.__version__)``) and over both cores.

The checks are the suite's own (``Suite``): each test below builds the case
``--prove`` runs and runs it, so CI runs exactly what ``--prove`` does:

- ``test_vllm_against_itself``: vLLM's pool again, under another name (the
  harness);
- ``test_kvpool_against_vllm``: kvpool's pool under vLLM's manager, per core
  (``--prove``: the compiled core only); skipped where kvpool has no line;
- ``test_kvpool_manager_against_vllm``: kvpool's manager against vLLM's,
  where the line has one;
- ``test_a_broken_pool_is_caught``, ``test_a_broken_manager_is_caught``: the
  planted faults.

The rest are checks of kvpool's manager that need pytest (``caplog``,
``monkeypatch``, ``pytest.raises``) or plant faults ``--prove`` does not.
``KVPOOL_MGR_SCALE`` (default 1) scales every workload's request count
(``.ci/vllm-mgr-all.sh``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator

import pytest
import vllm
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_coordinator
from vllm.v1.core.kv_cache_manager import KVCacheManager

import kvpool.vllm as kv_vllm
from kvpool.vllm.proof import manager
from kvpool.vllm.proof._base import Case, ProofFailure
from kvpool.vllm.proof._in_vllm import manager_in_vllm
from kvpool.vllm.proof._trace import first_difference

RELEASE = vllm.__version__


def _line() -> kv_vllm.VLLMLine | None:
    try:
        return kv_vllm.vllm_line(RELEASE)
    except kv_vllm.UnsupportedVLLMVersionError:
        return None


SUITE = manager.Suite(_line())
vw = SUITE.driver
LATE_DRIVER = SUITE.late
WORKLOADS = SUITE.workloads
CORES = SUITE.cores


def kvpool_line() -> kv_vllm.VLLMLine:
    """kvpool's line for this release; a skip where it has none (every
    release of ``kvpool.vllm.VLLM_LINES`` has one, by definition)."""
    if SUITE.line is None:
        pytest.skip(f"kvpool has no line for vLLM {RELEASE}")
    return SUITE.line


def kvpool_manager_class() -> type:
    """kvpool's manager of this release's line; a skip where it has none (or
    the compiled core is missing: the manager paths are compiled only)."""
    reason = SUITE.manager_declined()
    if reason is not None:
        pytest.skip(reason)
    return SUITE.manager_class()


def check(case: Case) -> None:
    """Run ``case`` as ``--prove`` does; its report, without a traceback
    into the suite, where it names a difference."""
    try:
        case()
    except ProofFailure as exc:
        if exc.__cause__ is not None:
            raise
        pytest.fail(f"{case.name}: {type(exc).__name__}: {exc}", pytrace=False)


@pytest.fixture(autouse=True)
def _vllm_pool_in_place() -> Iterator[None]:
    assert kv_cache_coordinator.BlockPool is vllm_block_pool.BlockPool
    yield
    assert kv_cache_coordinator.BlockPool is vllm_block_pool.BlockPool


def test_driver_for_release(record_testsuite_property) -> None:
    """The driver in use is the one for this release's manager API (named in
    the JUnit report, by its old test-module name, with kvpool's line, for
    .ci/vllm-mgr-all.sh)."""
    record_testsuite_property("driver", "vllm_workload33" if LATE_DRIVER else "vllm_workload")
    record_testsuite_property("kvpool_line", SUITE.line.name if SUITE.line else "none")
    assert vw is manager.driver()
    assert vw.__name__ == ("kvpool.vllm.proof._workload33" if LATE_DRIVER
                           else "kvpool.vllm.proof._workload")
    computed = vw.make_manager(WORKLOADS["full"]).get_computed_blocks(
        vw.build_requests(WORKLOADS["full"].scaled(num_requests=1))[0]
    )
    assert len(computed) == (3 if LATE_DRIVER else 2)


def test_prove_runs_these_checks() -> None:
    """``cases(line)`` is what the tests below run, for the compiled core."""
    if SUITE.line is None:
        pytest.skip(f"kvpool has no line for vLLM {RELEASE}")
    names = [c.name for c in manager.cases(SUITE.line)]
    expected = [SUITE.vllm_against_itself(k).name for k in WORKLOADS]
    expected += [SUITE.kvpool_against_vllm(k, "compiled").name for k in WORKLOADS]
    if SUITE.manager_declined() is None:
        expected += [SUITE.kvpool_manager_against_vllm(k).name for k in WORKLOADS]
        expected.append(SUITE.broken_manager_caught().name)
    expected += [SUITE.broken_pool_caught(b, f).name
                 for b in ("vllm", "kvpool") for f in manager.BROKEN_POOLS]
    assert sorted(names) == sorted(expected)


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_vllm_against_itself(workload: str) -> None:
    check(SUITE.vllm_against_itself(workload))


@pytest.mark.parametrize("core", list(CORES))
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_kvpool_against_vllm(workload: str, core: str) -> None:
    kvpool_line()
    check(SUITE.kvpool_against_vllm(workload, core))


@pytest.mark.parametrize("base", ["vllm", "kvpool"])
@pytest.mark.parametrize("fault", list(manager.BROKEN_POOLS))
def test_a_broken_pool_is_caught(base: str, fault: str) -> None:
    if base == "kvpool":
        kvpool_line()
    check(SUITE.broken_pool_caught(base, fault))


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_kvpool_manager_against_vllm(workload: str) -> None:
    kvpool_manager_class()
    check(SUITE.kvpool_manager_against_vllm(workload))


def test_a_broken_manager_is_caught() -> None:
    kvpool_manager_class()
    check(SUITE.broken_manager_caught())


@pytest.mark.parametrize("key", ["eagle", "mtp"])
def test_a_manager_that_keeps_the_eagle_block_is_caught(key: str) -> None:
    """The EAGLE workloads have teeth on the compiled lookup: kvpool's
    manager made to read an empty drop set (so its lookup keeps the last hit
    block, as without EAGLE) fails the comparison; the unbroken one passes
    (``test_kvpool_manager_against_vllm``)."""
    if not LATE_DRIVER:
        pytest.skip("no speculative decoding in the 0.15 driver")
    manager_class = kvpool_manager_class()

    class KeepsTheBlock(manager_class):  # type: ignore[misc, valid-type]
        _kvpool_eagle_drop_attr = "_kvpool_planted_no_drop"

    w = WORKLOADS[key].scaled(num_requests=SUITE.n(150))
    expected = vw.run(w)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            kv_cache_coordinator.KVCacheCoordinator,
            "_kvpool_planted_no_drop",
            frozenset(),
            raising=False,
        )
        broken, managers = SUITE.manager_run(KeepsTheBlock, w)
    assert all(m._kvpool_plan is not None for m in managers)
    diff = first_difference(expected.trace, broken.trace)
    assert diff is not None, "a lookup that keeps the EAGLE block went unnoticed"


@pytest.mark.parametrize("key", ["eagle+sliding", "eagle+mamba-ckpt"])
def test_a_hybrid_lookup_with_the_other_lines_eagle_margin_is_caught(key: str) -> None:
    """The EAGLE + sliding window workload, and EAGLE + Mamba align's, have
    teeth on the compiled hybrid lookups: kvpool's manager with the other
    lines' EAGLE margin (0.30, 0.31 look one block past the hit up to the
    lookup's bound, 0.32 on up to the hashed tokens: a repeated block-aligned
    prompt differs by a block) fails the comparison."""
    if not LATE_DRIVER:
        pytest.skip("no speculative decoding in the 0.15 driver")
    if key not in WORKLOADS:
        pytest.skip(f"no {key} workload in this driver")
    manager_class = kvpool_manager_class()

    class OtherMargin(manager_class):  # type: ignore[misc, valid-type]
        _kvpool_eagle_margin_to_hashes = not manager_class._kvpool_eagle_margin_to_hashes

    w = WORKLOADS[key]
    expected = SUITE.reference_run(key)
    broken, managers = SUITE.manager_run(OtherMargin, w)
    assert all(m._kvpool_plan is not None and m._kvpool_plan.counts["lookups"] for m in managers)
    diff = first_difference(expected.trace, broken.trace)
    assert diff is not None, "a hybrid lookup with the other lines' EAGLE margin went unnoticed"


def test_a_sink_group_fails_to_build_as_in_vllm() -> None:
    """vLLM 0.30-0.34 cannot build a ``SinkFullAttentionManager``: its
    ``__init__`` takes no ``needs_kv_cache_zeroing``, which the coordinator
    passes every manager, so a model with sink attention (openPangu's
    ``StaticSinkAttention``) fails at engine start. kvpool's manager fails
    the same way (nothing to serve). A release that fixes it fails this
    test: then kvpool's compiled paths should serve the group (full
    attention, as far as the scheduler's paths go)."""
    if not LATE_DRIVER:
        pytest.skip("the 0.15 driver has no sink groups")
    manager_class = kvpool_manager_class()
    w = WORKLOADS["full"].scaled(groups=(vw.Group("sink", 16),))
    for cls in (KVCacheManager, manager_class):
        with pytest.raises(TypeError, match="needs_kv_cache_zeroing"):
            vw.make_manager(w, cls)


@pytest.mark.parametrize("key, single", [("rswa", "RSWAManager"),
                                         ("full+chunked", "ChunkedLocalAttentionManager"),
                                         ("full+cross", "CrossAttentionManager"),
                                         ("full+mamba", "MambaManager"),
                                         ("full+ring", "CircularBufferManager")])
def test_a_class_with_a_method_of_its_own_falls_back(key: str, single: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-type manager class the compiled paths serve only as vLLM
    ships it: given a method they do not know of (a later release's, a
    plugin's), its groups run vLLM's code, and the manager says why."""
    if key not in WORKLOADS:
        pytest.skip(f"no {key} workload in this driver")
    manager_class = kvpool_manager_class()
    from vllm.v1.core import single_type_kv_cache_manager as single_types

    cls = getattr(single_types, single)
    pool_class = SUITE.pool_class("compiled")
    with manager_in_vllm(manager_class, pool_class):
        assert vw.make_manager(WORKLOADS[key]).kvpool_fallback_reason is None
        monkeypatch.setattr(cls, "a_method_of_its_own", lambda self: None, raising=False)
        manager = vw.make_manager(WORKLOADS[key])
    assert manager._kvpool_plan is None
    assert manager.kvpool_fallback_reason == f"a {single} group"


def test_each_group_says_what_serves_it(caplog: pytest.LogCaptureFixture) -> None:
    """At manager build, one INFO line per KV-cache group: its spec, the
    single-type manager serving it, and whether kvpool's compiled paths or
    vLLM's code run it (and why); each manager's set of lines once per
    process."""
    manager_class = kvpool_manager_class()
    module = importlib.import_module("kvpool.v0_33.kv_cache_manager")
    pool_class = SUITE.pool_class("compiled")
    compiled = "kvpool's compiled paths"
    lookup = " (its prefix-cache lookup: vLLM's code, for these groups' block sizes or specs)"
    expected = {
        "full": [("FullAttentionSpec", "FullAttentionManager", compiled)],
        "full+sliding": [("FullAttentionSpec", "FullAttentionManager", compiled),
                         ("SlidingWindowSpec", "SlidingWindowManager", compiled)],
        "full32+sliding16": [("FullAttentionSpec", "FullAttentionManager", compiled + lookup),
                             ("SlidingWindowSpec", "SlidingWindowManager", compiled + lookup)],
    }
    if "mamba-cow" in WORKLOADS:
        steady = ("kvpool's compiled paths; vLLM's code for a connector's tokens "
                  "(mamba_cache_mode 'align')")
        # (its lookup in C too: issue 52)
        expected["mamba-cow"] = [("FullAttentionSpec", "FullAttentionManager", compiled),
                                 ("MambaSpec", "MambaManager", steady)]
    if "full+ring" in WORKLOADS:
        expected["full+ring"] = [
            ("FullAttentionSpec", "FullAttentionManager", compiled),
            ("CircularBufferSpec", "CircularBufferManager", compiled)]
    if "full+mamba" in WORKLOADS:
        expected["full+mamba"] = [("FullAttentionSpec", "FullAttentionManager", compiled),
                                  ("MambaSpec", "MambaManager", compiled)]
    if "mamba-all" in WORKLOADS:
        hits = ("kvpool's compiled paths; vLLM's code for an admission with a prefix-cache hit "
                "(mamba_cache_mode 'all')")
        expected["mamba-all"] = [("FullAttentionSpec", "FullAttentionManager", compiled + lookup),
                                 ("MambaSpec", "MambaManager", hits + lookup)]
    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.INFO, "kvpool.vllm"):
        patch.setattr(module, "_logged", set())
        for key, groups in expected.items():
            caplog.clear()
            with manager_in_vllm(manager_class, pool_class):
                manager = vw.make_manager(WORKLOADS[key])
                vw.make_manager(WORKLOADS[key])  # (said once)
            lines = [r.getMessage() for r in caplog.records if r.name == "kvpool.vllm"]
            assert lines == module.group_lines(manager), (key, lines)
            assert len(lines) == len(groups), (key, lines)
            for i, (line, (spec, single, served)) in enumerate(zip(lines, groups)):
                assert line.startswith(f"kvpool: KV-cache group {i} ({spec}, "), line
                assert line.endswith(f" is served by {single}: {served}"), line


def test_align_steady_step_counts_below_zero() -> None:
    """A running request whose Mamba "align" table holds more blocks than
    its next step needs (its drafts rejected after a state block was added)
    makes vLLM's predictor count below zero for it; the step's total then
    fits a pool short by one block, and vLLM allocates. kvpool's steady
    step, done in C, must count the same (a count floored at zero refuses
    the step: returns None)."""
    manager_class = kvpool_manager_class()
    if "eagle+mamba-ckpt" not in WORKLOADS:
        pytest.skip("MambaSpec has no prefill-checkpoint blocks before 0.30")
    w = WORKLOADS["eagle+mamba-ckpt"]
    pool_class = SUITE.pool_class("compiled")
    hasher = vw.request_block_hasher(w)
    prompt = list(range(1, 63))  # 62 tokens: the draft step crosses the state block
    results = []
    for cls, pool in ((KVCacheManager, vllm_block_pool.BlockPool), (manager_class, pool_class)):
        with manager_in_vllm(cls, pool):
            mgr = vw.make_manager(w, cls)
        req = vw.new_request("r", prompt, 8, hasher)
        steps = []
        # The prompt, then one token and 3 drafts (a new state block: 5 blocks).
        for num_new in (len(prompt), 4):
            steps.append(mgr.allocate_slots(req, num_new, num_lookahead_tokens=3))
            req.num_computed_tokens += num_new
            if num_new == 4:
                req.num_computed_tokens -= 3  # every draft rejected
            req.append_output_token_ids(7)
        # One token, no drafts: the state needs 4 blocks; with no block to
        # spare beyond what the step's count frees, vLLM still allocates.
        free = mgr.block_pool.get_num_free_blocks()
        steps.append(mgr.allocate_slots(req, 1, num_lookahead_tokens=3, reserved_blocks=free + 1))
        results.append([None if s is None else s.get_block_ids() for s in steps])
        if cls is manager_class:
            # (the prompt, the new state block and the steady step: all C's)
            counts = mgr._kvpool_plan.counts if mgr._kvpool_plan is not None else None
            assert counts is not None and counts["fast"] == 3 and counts["base"] == 0, counts
    assert results[0][2] is not None, results[0]
    assert results[1] == results[0]
