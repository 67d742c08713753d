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
from test_engine_identity import BASE, model_dir, run_engine  # noqa: F401 (a fixture)

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


@pytest.fixture(scope="module")
def stock_soak(model_dir: Path, tmp_path_factory) -> dict:
    return run_engine(model_dir, SOAK, tmp_path_factory.mktemp("soak-stock"), kvpool=False)


def test_soak_flat_and_identical(stock_soak: dict, model_dir: Path, tmp_path: Path) -> None:
    ours = run_engine(model_dir, SOAK, tmp_path, kvpool=True)
    scenario = {**BASE, **SOAK}
    assert ours["pool_class"].startswith("kvpool."), ours["pool_class"]
    assert not problems(stock_soak, ours, scenario, WARMUP), problems(stock_soak, ours, scenario,
                                                                      WARMUP)
    assert ours["events"] == stock_soak["events"]
    assert sum(w["reset_prefix_cache"] for w in ours["waves"]) == SOAK["waves"] // 3


def test_leaky_pool_is_caught(stock_soak: dict, model_dir: Path, tmp_path: Path) -> None:
    leaky = run_engine(model_dir, SOAK, tmp_path, kvpool=True, leaky=True)
    assert leaky["pool_class"].endswith("LeakyBlockPool")
    found = problems(stock_soak, leaky, {**BASE, **SOAK}, WARMUP)
    assert any("live objects grew" in p for p in found), (
        f"a pool keeping every block list it hands out passed the soak check: {found}")

