"""The core rule ``_kvpool_free_caching_off`` (a class attribute of
``PoolCore`` a facade overrides, read once when a pool is built), on both
cores: where the 0.33-style ``free_blocks`` puts a block released while
caching is off.

Measured on each release's own pool (``docs/lines-0.24-0.28.md``): a
caching-off pool of 6 blocks, blocks [1, 2, 3] allocated and freed reversed,
gives [3, 2, 1, 4, 5] in 0.24-0.26 and 0.28+, [4, 5, 3, 2, 1] in 0.27.x;
with block 1 cached (``cache_full_blocks`` does not look at
``enable_caching``) 0.24-0.26 give [3, 2, 4, 5, 1], 0.27.x [4, 5, 3, 2, 1],
0.28+ [3, 2, 1, 4, 5].
"""

from __future__ import annotations

from types import ModuleType

import pytest

from _helpers import ids
from kvpool.v0_33 import make_block_pool_class as make_v033

RULES = ["front", "by_hash", "back"]

_classes: dict[tuple[str, str], type] = {}


def pool_class(core: ModuleType, rule: str) -> type:
    key = (core.__name__, rule)
    cls = _classes.get(key)
    if cls is None:
        cls = _classes[key] = type(
            "BlockPool", (make_v033(core),), {"_kvpool_free_caching_off": rule}
        )
    return cls


class _Request:
    lora_request = None
    mm_features: list = []
    cache_salt = None
    prompt_embeds = None
    session_id = None

    def __init__(self, num_blocks: int) -> None:
        self.block_hashes = [bytes([i + 1]) * 32 for i in range(num_blocks)]
        self.all_token_ids = list(range(4 * num_blocks))


def free_reversed(core: ModuleType, rule: str, caching: bool, cache_first: bool,
                  as_iterator: bool = False) -> list[int]:
    """The queue after [1, 2, 3] of a 6-block pool are freed reversed (block
    1 cached first if ``cache_first``)."""
    pool = pool_class(core, rule)(6, caching, 4)
    blocks = pool.get_new_blocks(3)
    if cache_first:
        pool.cache_full_blocks(_Request(3), blocks, 0, 1, 4, 0)
    # reversed(list) is the engine's call, which the compiled core walks in place.
    pool.free_blocks(reversed(blocks) if as_iterator else blocks[::-1])
    return ids(pool.free_block_queue.get_all_free_blocks())


def test_default_is_front(core: ModuleType) -> None:
    assert core.PoolCore._kvpool_free_caching_off == "front"
    assert make_v033(core)._kvpool_free_caching_off == "front"


@pytest.mark.parametrize("as_iterator", [False, True])
@pytest.mark.parametrize(
    "rule, plain, with_hash",
    [
        ("front", [3, 2, 1, 4, 5], [3, 2, 1, 4, 5]),  # vLLM 0.28+
        ("by_hash", [3, 2, 1, 4, 5], [3, 2, 4, 5, 1]),  # vLLM 0.24-0.26
        ("back", [4, 5, 3, 2, 1], [4, 5, 3, 2, 1]),  # vLLM 0.27.x
    ],
)
def test_caching_off(
    core: ModuleType, rule: str, plain: list[int], with_hash: list[int], as_iterator: bool
) -> None:
    assert free_reversed(core, rule, False, False, as_iterator) == plain
    assert free_reversed(core, rule, False, True, as_iterator) == with_hash


@pytest.mark.parametrize("rule", RULES)
def test_caching_on_is_the_same_for_every_rule(core: ModuleType, rule: str) -> None:
    # A block without a hash in front, a cached one at the back.
    assert free_reversed(core, rule, True, False) == [3, 2, 1, 4, 5]
    assert free_reversed(core, rule, True, True) == [3, 2, 4, 5, 1]


def test_read_once_at_construction(core: ModuleType) -> None:
    cls = type("BlockPool", (make_v033(core),), {"_kvpool_free_caching_off": "back"})
    pool = cls(6, False, 4)
    cls._kvpool_free_caching_off = "front"  # too late for `pool`
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(blocks[::-1])
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [4, 5, 3, 2, 1]


@pytest.mark.parametrize("bad", ["FRONT", "tail", None, 1])
def test_bad_rule_is_refused(core: ModuleType, bad: object) -> None:
    cls = type("BlockPool", (make_v033(core),), {"_kvpool_free_caching_off": bad})
    with pytest.raises(ValueError, match="_kvpool_free_caching_off must be one of"):
        cls(6, False, 4)
