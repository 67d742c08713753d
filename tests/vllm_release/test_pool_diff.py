"""The pool traces of ``python -m kvpool.vllm --prove``
(``kvpool/vllm/proof/pool.py``, which says what they compare) for one vLLM
release, whichever is importable: kvpool's line for that release over each
core, and as installed into vLLM, against the release's own ``BlockPool``,
plus the checks that the harness reaches every operation and path the
release has and that broken pools are caught where their bug shows.

Environment: ``KVPOOL_RELEASE_SEEDS`` (default 24; the coverage check runs
at least 16), ``KVPOOL_RELEASE_STEPS`` (default 200),
``KVPOOL_RELEASE_CANDIDATES`` (comma-separated candidate names, default all;
``vllm`` alone proves the harness on a release kvpool has no line for yet).
"""

from __future__ import annotations

import collections
import os

import pytest

from kvpool.vllm.proof import pool as proof
from kvpool.vllm.proof._base import ProofFailure
from kvpool.vllm.proof.pool import (  # the names the other release tests import
    ALL_CANDIDATES,
    BROKEN,
    CORE_MODULES,
    FEATURES,
    Mismatch,
    REPEATS,
    SEEDS,
    STEPS,
    VERSION,
    VllmCollector,
    kvpool_line,
    make_driver,
)

COVERAGE_SEEDS = range(max(16, len(SEEDS)))  # enough for every path to show

_chosen = os.environ.get("KVPOOL_RELEASE_CANDIDATES", "")
CANDIDATES = [c.strip() for c in _chosen.split(",") if c.strip()] or ALL_CANDIDATES
if set(CANDIDATES) - set(ALL_CANDIDATES):
    raise pytest.UsageError(
        f"KVPOOL_RELEASE_CANDIDATES: unknown {sorted(set(CANDIDATES) - set(ALL_CANDIDATES))}; "
        f"known: {ALL_CANDIDATES}"
    )
KVPOOL_CANDIDATES = [c for c in CANDIDATES if c != "vllm"]


@pytest.fixture(autouse=True)
def _quiet_pools() -> None:
    proof.quiet_pools()


def check_same(name: str, seed: int, monkeypatch, repeats: bool = False):
    try:
        return proof.check_same(name, seed, monkeypatch, repeats)
    except ProofFailure as exc:
        pytest.fail(f"{exc}", pytrace=False)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", CANDIDATES)
def test_same_as_vllm(name: str, seed: int, monkeypatch) -> None:
    check_same(name, seed, monkeypatch)


if REPEATS:

    @pytest.mark.parametrize("seed", SEEDS[: max(1, len(SEEDS) // 4)])
    @pytest.mark.parametrize("name", CANDIDATES)
    def test_same_as_vllm_with_repeated_blocks(name: str, seed: int, monkeypatch) -> None:
        """As above, plus one free_blocks call naming a block twice, each
        covered by a reference (the scheduler's copy-on-write frees)."""
        check_same(name, seed, monkeypatch, repeats=True)


def test_features_detected() -> None:
    """What the driver uses of this release, read off its classes, is
    consistent with itself (and printed: ``-s`` shows it)."""
    print(f"vLLM {VERSION}: {FEATURES.describe()}")
    f = FEATURES
    if f.move_hashes or f.emit_cached or f.replace_hashes:
        assert f.partial
    if f.unpin:
        assert f.block_pool_attr and f.medium
    if f.free_prepend:
        assert f.prepend_n


def test_workload_covers_every_operation(monkeypatch) -> None:
    """Over at least 16 seeds, the release's pool against itself: every operation
    the release has is applied and the interesting paths are taken."""
    ops: collections.Counter[str] = collections.Counter()
    seen: collections.Counter[str] = collections.Counter()
    configs = []
    for seed in COVERAGE_SEEDS:
        driver = check_same("vllm", seed, monkeypatch, repeats=REPEATS)
        ops.update(driver.counts)
        seen.update(driver.sides[0].pool.seen)
        configs.append(driver.cfg)
    missing = [name for name in driver.ops if not ops[name] and (REPEATS or name != "cow_retained")]
    assert not missing, f"operations never applied: {missing} ({ops})"
    wanted = (
        "null block freed, reset done, reset refused, evicted, "
        "lora_request, cache_salt, mm_features, prompt_embeds"
    )
    by_feature = {
        "block_mask": "block_mask",
        "free_prepend": "prepend",
        "partial": "partial, promotion candidate, block with several keys removed",
        "unpin": "watcher fired",
        "block_pool_attr": "cross-pool free, session_id",
        "lookahead": "lookahead events",
    }
    for feature, paths in by_feature.items():
        if getattr(FEATURES, feature):
            wanted += ", " + paths
    for what in wanted.split(", "):
        assert seen[what], f"never exercised: {what} ({seen})"
    for attr in ("enable_caching", "events", "metrics", "int_hashes", "positional"):
        assert {getattr(c, attr) for c in configs} == {True, False}, attr
    if FEATURES.medium:
        assert {c.medium for c in configs} >= {"GPU", "CPU"}
    assert any(c.lookahead for c in configs) == FEATURES.lookahead
    assert any(len(set(c.group_block_sizes)) > 1 for c in configs)


@pytest.mark.parametrize("broken", [b for b in BROKEN if b.applies()], ids=lambda c: c.__name__)
def test_harness_catches_broken_pool(broken: type, monkeypatch) -> None:
    """Each broken pool the release can have fails the comparison at the
    first step whose result its bug changed (over the first seeds that reach
    the bug at all)."""
    proof.broken_pool_caught(broken, monkeypatch)


def test_some_broken_pool_applies() -> None:
    assert proof.applicable_broken()


def test_prove_runs_these_checks() -> None:
    """What ``--prove`` runs on this release's line: the API, both
    candidates over every seed, every applicable broken pool."""
    names = [c.name for c in proof.cases(kvpool_line(), seeds=range(2))]
    assert names[0] == "the line has the release's API"
    assert {"vllm, seed 1", "c-extension-vllm-events, seed 1"} <= set(names)
    assert {f"broken pool {b.__name__} caught" for b in proof.applicable_broken()} <= set(names)


if KVPOOL_CANDIDATES:

    @pytest.mark.parametrize("name", KVPOOL_CANDIDATES)
    def test_kvpool_line_has_the_release_api(name: str) -> None:
        proof.line_has_the_release_api(name)
