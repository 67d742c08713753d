"""Each kvpool line's delta is needed: the line below it, run against this
release, is caught by the harness (``test_pool_diff``). The 0.17 line's pool
lacks 0.19's multimodal keys, the 0.19 line's lacks ``group_idx``, the 0.20
line's ``block_mask``, the 0.22 line's ``prepend``, the 0.15 line's
``extra_keys``, and the 0.33 line's blocks, map and ``free_blocks`` (0.34
shows the hash fields and the map by other names, holds the pool weakly and
frees with ``evict_first``): as broken pools for the newer release they must fail, at
some seed, with a mismatch (never a harness error).

Lines whose pool equals the one below (0.18 is 0.17 pool-wise) and releases
of other lines are skipped."""

from __future__ import annotations

import importlib

import pytest
from _release_driver import Mismatch
from test_pool_diff import CORE_MODULES, FEATURES, STEPS, VERSION, VllmCollector, kvpool_line, make_driver

#: line -> the line below it, where the two differ pool-wise.
PRIOR = {
    "0.17": "kvpool.v0_15",
    "0.19": "kvpool.v0_17",
    "0.20": "kvpool.v0_19",
    "0.22": "kvpool.v0_20",
    "0.23": "kvpool.v0_22",
    "0.34": "kvpool.v0_33",
}


def _line_name() -> str | None:
    try:
        return kvpool_line().name
    except Exception:  # a release kvpool has no line for
        return None


@pytest.mark.skipif(_line_name() not in PRIOR, reason=f"vLLM {VERSION}: no prior line to break with")
@pytest.mark.parametrize("core_name", list(CORE_MODULES))
def test_prior_line_is_caught(core_name: str, monkeypatch) -> None:
    prior = importlib.import_module(PRIOR[kvpool_line().name])
    cls = prior.make_block_pool_class(importlib.import_module(CORE_MODULES[core_name]))
    # "kvpool" in the label: the comparison keeps the lines' known deviations.
    cand = (f"kvpool {prior.__name__} (prior line, {core_name})", cls, prior.BlockStored, VllmCollector)
    for seed in range(48):
        try:
            # (a pool whose fresh state differs is caught as it is built)
            driver, r = make_driver(seed, cand, monkeypatch)
            driver.run(r, STEPS)
        except Mismatch:
            return
    pytest.fail(f"{prior.__name__} passed against vLLM {VERSION} (features {FEATURES})")
