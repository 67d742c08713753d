"""vLLM 0.29.0-0.32.0: the per-release differences of the lines
``kvpool.v0_29`` ... ``kvpool.v0_32`` that the random workload of
``test_pool_diff.py`` does not reach, checked against the release's own
``BlockPool`` directly (both cores), each with a deliberately broken kvpool
pool -- the neighbouring release's rule -- that the check must catch.

- ``cache_partial_block`` on an entry that is not partial (``num_tokens`` a
  multiple of ``block_size``, or ``block_size == hash_block_size``): 0.29-0.31
  assert, 0.32 accepts (the workload only makes partial entries);
- the partial-block event's multimodal items when several items touch the
  block: 0.29/0.30 start from the last item, 0.31+ from the first overlapping;
- the null block's ``ref_cnt`` in ``touch``/``free_blocks`` (also through a
  free of another pool's null block, 0.30+), the constructor's parameters,
  ``KVCacheBlock.pool``, ``medium``/``unpin_blocks``/lookahead presence.

Only for those releases; elsewhere the module is skipped (it names them).
"""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import vllm
from vllm.utils.hashing import sha256
from vllm.v1.core import block_pool as vllm_block_pool

VERSION = vllm.__version__
RELEASES = ("0.29.0", "0.30.0", "0.31.0", "0.32.0")
if VERSION not in RELEASES:
    pytest.skip(f"vLLM {VERSION} is not one of {RELEASES}", allow_module_level=True)
MINOR = int(VERSION.split(".")[1])
LINE = importlib.import_module(f"kvpool.v0_{MINOR}")
CORES = [pytest.param("kvpool._core", marks=pytest.mark.c_extension), "kvpool._core_py"]


def kvpool_pool(core_name: str, mixins: tuple[type, ...] = (), **rules: Any) -> type:
    """This release's kvpool pool over the core; ``mixins`` (another line's
    facade class) and ``rules`` (class attributes) make a broken variant."""
    cls = LINE.make_block_pool_class(importlib.import_module(core_name))
    return type("BlockPool", (*mixins, cls), rules) if mixins or rules else cls


def request(features: list[Any]) -> Any:
    hashes = [sha256((i,)) for i in range(8)]
    return SimpleNamespace(
        block_hashes=hashes, all_token_ids=list(range(16)), lora_request=None,
        mm_features=features, cache_salt=None, prompt_embeds=None, session_id="s",
    )


def mm(identifier: str, offset: int, length: int) -> Any:
    from vllm.multimodal.inputs import PlaceholderRange

    return SimpleNamespace(
        identifier=identifier, mm_position=PlaceholderRange(offset=offset, length=length)
    )


def partial_outcomes(pool_cls: type) -> list[str]:
    """``cache_partial_block`` on a partial and two non-partial entries
    (hash_block_size 4): "ok", or "assert" (kvpool's PoolArgumentError is an
    AssertionError too)."""
    out = []
    for num_tokens, block_size in ((4, 8), (8, 8), (4, 4)):
        pool = pool_cls(6, True, 4)
        (block,) = pool.get_new_blocks(1)
        try:
            pool.cache_partial_block(request([]), block, num_tokens, 0, block_size)
            out.append("ok")
        except AssertionError:
            out.append("assert")
    return out


MM_LAYOUTS = [
    [("a", 9, 2), ("b", 12, 2)],
    [("a", 11, 2), ("b", 13, 2)],  # two items touch the last hash block
    [("a", 3, 2), ("b", 12, 3)],
]


def partial_event_bytes(pool_cls: type) -> list[bytes]:
    """The events of a partial entry at token 14 of an 8-token block
    (hash_block_size 2) under each multimodal layout."""
    out = []
    for layout in MM_LAYOUTS:
        pool = pool_cls(6, True, 2, True)
        blocks = pool.get_new_blocks(2)
        pool.cache_partial_block(request([mm(*f) for f in layout]), blocks[1], 14, 0, 8)
        out.append(msgspec.msgpack.encode(pool.take_events()))
    return out


def null_counts(pool_cls: type) -> list[int]:
    """The null block's ref_cnt after touch, free, free (and, where blocks
    know their pool, another pool's null block freed through this pool)."""
    pool, other = pool_cls(6, True, 4), pool_cls(4, True, 4)
    null = pool.null_block
    out = []
    pool.touch([null])
    out.append(null.ref_cnt)
    pool.free_blocks([null])
    pool.free_blocks(reversed([null]))
    out.append(null.ref_cnt)
    if MINOR >= 30:
        pool.free_blocks([other.null_block])
        out.append(other.null_block.ref_cnt)
    return out


def surface(pool_cls: type) -> dict[str, Any]:
    """The constructor's parameters and which release-specific names a pool
    and its blocks have."""
    pool = pool_cls(4, True, 4)
    names = ("medium", "num_hash_lookahead_tokens", "unpin_blocks", "is_block_writable",
             "cache_partial_block", "emit_cached_block_events", "move_block_hashes")
    return {
        "init": list(inspect.signature(pool_cls.__init__).parameters)[1:],
        "partial": list(inspect.signature(pool_cls.cache_partial_block).parameters)[1:],
        "names": {n: hasattr(pool, n) for n in names},
        "block pool": hasattr(pool.blocks[1], "pool"),
    }


CHECKS = {
    "partial": partial_outcomes,
    "mm": partial_event_bytes,
    "null": null_counts,
    "surface": surface,
}


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("core", CORES)
def test_same_as_vllm(core: str, check: str) -> None:
    fn = CHECKS[check]
    assert fn(kvpool_pool(core)) == fn(vllm_block_pool.BlockPool)


def _broken() -> list[tuple[str, str, dict[str, Any]]]:
    """(check, what, mixins, class attributes): kvpool's pool with the rule
    of the neighbouring release, which the check must catch."""
    from kvpool.v0_30.block_pool import BlockPoolMixin as Mixin30
    from kvpool.v0_31.block_pool import BlockPoolMixin as Mixin31
    from kvpool.v0_32.block_pool import BlockPoolMixin as Mixin32

    out = [("null", "null block skipped (0.33)", (), {"_kvpool_counts_null": False})]
    if MINOR <= 31:
        out.append(("partial", "no partial check (0.32)", (),
                    {"_check_partial_block_args": Mixin32._check_partial_block_args}))
    else:
        out.append(("partial", "partial check (0.31)", (Mixin31,), {}))
    if MINOR <= 30:
        out.append(("mm", "items from the first overlapping (0.31)", (),
                    {"_partial_block_mm_idx": Mixin31._partial_block_mm_idx}))
    else:
        out.append(("mm", "items from the last (0.30)", (),
                    {"_partial_block_mm_idx": Mixin30._partial_block_mm_idx}))
    return out


@pytest.mark.parametrize(
    "check, what, mixins, rules", [pytest.param(*b, id=b[1]) for b in _broken()]
)
@pytest.mark.parametrize("core", CORES)
def test_check_catches_broken_pool(
    core: str, check: str, what: str, mixins: tuple[type, ...], rules: dict[str, Any]
) -> None:
    fn = CHECKS[check]
    assert fn(kvpool_pool(core, mixins, **rules)) != fn(vllm_block_pool.BlockPool), what


@pytest.mark.parametrize("core", CORES)
def test_differential_harness_catches_uncounted_null(core: str, monkeypatch) -> None:
    """The random workload of test_pool_diff.py, with kvpool's pool skipping
    the null block as 0.33 does: the first step that touches or frees the
    null block is reported."""
    import test_pool_diff as diff

    cls = kvpool_pool(core, _kvpool_counts_null=False)
    for seed in diff.SEEDS:
        cand = ("kvpool uncounted null", cls, LINE.BlockStored, diff.VllmCollector)
        driver, r = diff.make_driver(seed, cand, monkeypatch)
        try:
            driver.run(r, diff.STEPS)
        except diff.Mismatch as exc:
            assert "block 0: expected vs got: ref_cnt" in str(exc), exc
            return
    pytest.fail("the uncounted null block was never reported")
