"""A short soak run (the long one is ``benchmarks/soak_vllm_engine.py``):
waves of requests with new tails over shared prefixes through one engine, in
a cache small enough to evict, the prefix cache reset every third wave;
stock against kvpool, judged by ``soak.problems`` (same tokens every wave,
every request answered in full, live objects and RSS no higher than stock's
growth). ``test_leaky_pool_is_caught`` plants a pool that keeps every block
list it hands out: the flatness check must see it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from soak import problems
from test_engine_identity import BASE, model_dir, with_stock  # noqa: F401 (a fixture)

SOAK = {
    "num_requests": 32,
    "max_tokens": 16,
    "num_blocks": 96,
    "max_num_seqs": 16,
    "waves": 8,
    "new_tails_per_wave": True,
    "reset_prefix_cache_every": 3,
}
WARMUP = 2


def runs(model_dir: Path, tmp: Path, **kvpool_run) -> tuple[dict, dict]:
    """The stock soak run (once per session: the leak test compares with it
    too) and a kvpool one (``kvpool_run``: ``EngineRun``'s keyword arguments)."""
    return with_stock(model_dir, "soak", SOAK, tmp, **kvpool_run)


def test_soak_flat_and_identical(model_dir: Path, tmp_path: Path) -> None:
    stock, ours = runs(model_dir, tmp_path)
    scenario = {**BASE, **SOAK}
    assert ours["pool_class"].startswith("kvpool."), ours["pool_class"]
    found = problems(stock, ours, scenario, WARMUP)
    assert not found, found
    assert ours["events"] == stock["events"]
    assert sum(w["reset_prefix_cache"] for w in ours["waves"]) == SOAK["waves"] // 3


@pytest.mark.proof
def test_leaky_pool_is_caught(model_dir: Path, tmp_path: Path) -> None:
    stock, leaky = runs(model_dir, tmp_path, leaky=True)
    assert leaky["pool_class"].endswith("LeakyBlockPool")
    found = problems(stock, leaky, {**BASE, **SOAK}, WARMUP)
    assert any("live objects grew" in p for p in found), (
        f"a pool keeping every block list it hands out passed the soak check: {found}")
