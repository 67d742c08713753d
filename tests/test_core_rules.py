"""The core's per-release rules (class attributes of ``PoolCore`` that a
facade overrides, read once when a pool is built), on both cores and both
stores (``_kvpool_line`` 15 and 33).

``_kvpool_counts_null``: vLLM before 0.33 counts the null block's
``ref_cnt`` in ``touch`` and ``free_blocks`` (1 after a touch, -1 after a
touch and two frees: ``shared/VLLM-VERSIONS.md``'s table); 0.33 skips it.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from _helpers import block_pool_class, check_raises, ids
from kvpool.v0_33 import make_block_pool_class as make_v033

_classes: dict[tuple[str, int, bool], type] = {}


def pool_class(core: ModuleType, line: int, counts_null: bool) -> type:
    """The 0.15 or 0.33 facade over ``core`` with the rule set as given."""
    key = (core.__name__, line, counts_null)
    cls = _classes.get(key)
    if cls is None:
        base = block_pool_class(core) if line == 15 else make_v033(core)
        cls = _classes[key] = type("BlockPool", (base,), {"_kvpool_counts_null": counts_null})
    return cls


LINES = [15, 33]


@pytest.mark.parametrize("line", LINES)
def test_defaults_skip_the_null_block(core: ModuleType, line: int) -> None:
    # The core's default skips it; the 0.15 facade (vLLM 0.15-0.23) counts
    # it, as vLLM before 0.33 does; the 0.33 facade skips it.
    assert core.PoolCore._kvpool_counts_null is False
    assert block_pool_class(core)._kvpool_counts_null is True
    assert make_v033(core)._kvpool_counts_null is False
    pool = pool_class(core, line, False)(6, True, 4)
    null = pool.null_block
    pool.touch([null])
    assert null.ref_cnt == 0
    pool.free_blocks([null])
    pool.free_blocks([null])
    assert null.ref_cnt == 0


@pytest.mark.parametrize("line", LINES)
def test_counted_null_block(core: ModuleType, line: int) -> None:
    pool = pool_class(core, line, True)(6, True, 4)
    null = pool.null_block
    queue_before = ids(pool.free_block_queue.get_all_free_blocks())
    pool.touch([null])
    assert null.ref_cnt == 1
    pool.free_blocks([null])
    pool.free_blocks([null])
    assert null.ref_cnt == -1  # vLLM's figure: never checked, never queued
    pool.free_blocks(reversed([null, null]))  # the engine's reversed() path
    assert null.ref_cnt == -3
    pool.touch([null, null, null])
    assert null.ref_cnt == 0
    assert ids(pool.free_block_queue.get_all_free_blocks()) == queue_before
    assert pool.get_num_free_blocks() == 5


@pytest.mark.parametrize("line", LINES)
def test_counted_null_block_with_others(core: ModuleType, line: int) -> None:
    pool = pool_class(core, line, True)(6, True, 4)
    null = pool.null_block
    blocks = pool.get_new_blocks(2)
    pool.touch([null, blocks[0]])
    assert (null.ref_cnt, blocks[0].ref_cnt) == (1, 2)
    pool.free_blocks([blocks[1], null, blocks[0]])
    assert (null.ref_cnt, blocks[0].ref_cnt, blocks[1].ref_cnt) == (0, 1, 0)


@pytest.mark.parametrize("line", LINES)
def test_failed_free_leaves_the_null_count(core: ModuleType, line: int) -> None:
    pool = pool_class(core, line, True)(6, True, 4)
    null = pool.null_block
    [block] = pool.get_new_blocks(1)
    pool.free_blocks([block])
    check_raises(ValueError, pool.free_blocks, [null, block], match="double free")
    assert null.ref_cnt == 0
    assert pool.get_num_free_blocks() == 5


def test_counted_null_of_another_pool_is_freed_by_it(core: ModuleType) -> None:
    # vLLM 0.30-0.32: the pool check comes before the null check, so another
    # pool's null block goes to that pool's free_blocks (0.33 skips it).
    cls = pool_class(core, 33, True)
    pool, other = cls(6, True, 4), cls(4, True, 4)
    pool.free_blocks([other.null_block, pool.null_block])
    assert (pool.null_block.ref_cnt, other.null_block.ref_cnt) == (-1, -1)
    skipping = pool_class(core, 33, False)(6, True, 4)
    skipping.free_blocks([other.null_block])
    assert other.null_block.ref_cnt == -1


def test_rule_is_read_at_construction(core: ModuleType) -> None:
    cls = type("BlockPool", (pool_class(core, 33, False),), {})
    pool = cls(6, True, 4)
    cls._kvpool_counts_null = True  # too late for `pool`
    pool.touch([pool.null_block])
    assert pool.null_block.ref_cnt == 0
    fresh = cls(6, True, 4)
    fresh.touch([fresh.null_block])
    assert fresh.null_block.ref_cnt == 1


def pool24_class(core: ModuleType) -> type:
    key = (core.__name__, 24, False)
    cls = _classes.get(key)
    if cls is None:
        cls = _classes[key] = type("BlockPool", (make_v033(core),), {"_kvpool_block_pool": False})
    return cls


def test_blocks_without_pool(core: ModuleType) -> None:
    # vLLM 0.24-0.29: the 0.33-style block without the ``pool`` field.
    assert make_v033(core)._kvpool_block_pool is True
    pool = pool24_class(core)(6, True, 4)
    other = make_v033(core)(4, True, 4)
    for block in (pool.null_block, pool.blocks[1], pool.free_block_queue.fake_free_list_head):
        assert type(block) is core.KVCacheBlock24
        assert not hasattr(block, "pool")
    assert type(other.blocks[1]) is core.KVCacheBlock33 and other.blocks[1].pool is other
    check_raises(TypeError, core.KVCacheBlock24, 3, pool=pool)
    b = core.KVCacheBlock24(3, 1, b"h", 8)
    assert (b.block_id, b.ref_cnt, b.block_hash, b.block_hash_num_tokens) == (3, 1, b"h", 8)
    assert isinstance(b, core.KVCacheBlock33) and isinstance(b, core.KVCacheBlock)
    assert repr(b) == (
        "KVCacheBlock(block_id=3, ref_cnt=1, _block_hash=b'h', "
        "_block_hash_num_tokens=8, prev_free_block=None, next_free_block=None)"
    )
    # The core still knows each block's pool: another pool's block goes back.
    [mine] = pool.get_new_blocks(1)
    other.free_blocks([mine])
    assert mine.ref_cnt == 0 and pool.get_num_free_blocks() == 5
    # Standalone blocks: a queue of one kind; a pool adopts only its kind.
    queue = core.FreeKVCacheBlockQueue([core.KVCacheBlock24(i) for i in range(3)])
    assert [type(x) for x in queue.get_all_free_blocks()] == [core.KVCacheBlock24] * 3
    check_raises(TypeError, core.FreeKVCacheBlockQueue, [core.KVCacheBlock24(1), core.KVCacheBlock33(2)])
    stray = core.KVCacheBlock33(9, 1)
    check_raises(TypeError, pool.free_blocks, [stray])
    assert stray.ref_cnt == 1
    lone = core.KVCacheBlock24(9, 1)
    pool.free_blocks([lone])  # adopted, as vLLM takes a block without a pool as its own
    assert lone.ref_cnt == 0 and pool.get_num_free_blocks() == 6
