"""The harness catches a kvpool line with another release's caching-off free
order (the core rule ``_kvpool_free_caching_off``, the one rule that tells
vLLM 0.24-0.26, 0.27.x and 0.28+ apart, ``docs/lines-0.24-0.28.md``): the
importable release's kvpool line over the compiled core, with each rule it
does not have, must differ from the release's own pool on some seed.

Only for releases whose line uses the 0.33-style store (vLLM 0.24 and
later); the others have no such rule.
"""

from __future__ import annotations

import importlib

import pytest
from test_pool_diff import SEEDS, STEPS, VllmCollector, kvpool_line, make_driver

from _release_driver import Mismatch
from kvpool._rules import FREE_CACHING_OFF


def _line_pool() -> type:
    module = importlib.import_module(kvpool_line().module)
    return module.make_block_pool_class(importlib.import_module("kvpool._core"))


def _store_is_033() -> bool:
    try:
        return _line_pool()._kvpool_line == 33
    except Exception:  # no kvpool line for this release: nothing to break
        return False


pytestmark = pytest.mark.skipif(
    not _store_is_033(), reason="the release's line has no caching-off free rule"
)


@pytest.mark.parametrize("rule", sorted(FREE_CACHING_OFF))
def test_harness_catches_another_releases_caching_off_rule(rule: str, monkeypatch) -> None:
    base = _line_pool()
    if rule == base._kvpool_free_caching_off:
        pytest.skip(f"{rule!r} is the release's own rule")
    module = importlib.import_module(kvpool_line().module)
    broken = type("BlockPool", (base,), {"_kvpool_free_caching_off": rule})
    cand = (f"kvpool {kvpool_line().module} freeing {rule!r}", broken, module.BlockStored,
            VllmCollector)
    for seed in SEEDS:
        driver, r = make_driver(seed, cand, monkeypatch)
        try:
            driver.run(r, STEPS)
        except Mismatch as exc:
            assert "free" in str(exc), exc  # the free queue (or the free count) differs
            return
    pytest.fail(f"no seed of {len(SEEDS)} told {rule!r} from {base._kvpool_free_caching_off!r}")
