"""The 0.34 line's blocks, map and frees on each core (the differential
tests against vLLM 0.34.0's own pool are tests/vllm_release; these pin what
kvpool promises of its own): ``KVCacheBlock34``'s fields and weak ``pool``,
``BlockHashToBlockMap34(blocks)`` showing ids, its refusals (each changing
nothing), ``free_blocks(evict_first=)`` and the reset that keeps the map."""

from __future__ import annotations

import copy
import gc
import weakref
from types import ModuleType

import pytest

from _helpers import ids, key
from kvpool.v0_34 import make_block_pool_class

_classes: dict[str, type] = {}


def pool_class(core: ModuleType) -> type:
    cls = _classes.get(core.__name__)
    if cls is None:
        cls = _classes[core.__name__] = make_block_pool_class(core)
    return cls


def test_blocks_hold_their_pool_weakly(core: ModuleType) -> None:
    pool = pool_class(core)(6, True, 4)
    block = pool.blocks[2]
    assert isinstance(block, core.KVCacheBlock34)
    assert block.pool is pool._weak_self and block.pool() is pool
    assert repr(block).startswith("KVCacheBlock(block_id=2, ref_cnt=0, block_hash=None, ")
    for private in ("_block_hash", "_block_hash_num_tokens"):
        with pytest.raises(AttributeError):
            getattr(block, private)
    alone = core.KVCacheBlock34(9, block_hash=key(b"h"), block_hash_num_tokens=4,
                                pool=weakref.ref(pool))
    assert (alone.block_hash, alone.block_hash_num_tokens) == (key(b"h"), 4)
    alone.block_hash_num_tokens = 8
    assert alone.block_hash_num_tokens == 8
    with pytest.raises(RuntimeError):  # a second hash would leave the map behind
        alone.block_hash = key(b"other")
    assert alone.block_hash == key(b"h")


def test_the_map_shows_ids(core: ModuleType) -> None:
    blocks = [core.KVCacheBlock34(i) for i in range(4)]
    cache = core.BlockHashToBlockMap34(blocks)
    k0, k1 = key(b"a"), key(b"b")
    cache.insert(k0, blocks[0])
    cache.insert(k0, blocks[3])
    cache.insert(k1, blocks[1])
    assert cache._cache == {k0: 0, k1: 1} and copy.copy(cache._cache) == {k0: 0, k1: 1}
    assert cache._dup_ids == {k0: {0: None, 3: None}}
    assert cache.pop(k0, 0) is blocks[0]
    assert cache._cache == {k0: 3, k1: 1} and cache._dup_ids == {}
    assert cache._cache.pop(k1) == 1 and cache.get_one_block(k1) is None
    cache._cache[k1] = 2
    assert cache.get_one_block(k1) is blocks[2]
    cache.clear()
    assert len(cache) == 0 and cache._cache == {}
    if core.__name__ == "kvpool._core":
        assert not gc.is_tracked(cache._cache)


def test_the_map_refuses_and_changes_nothing(core: ModuleType) -> None:
    blocks = [core.KVCacheBlock34(i) for i in range(3)]
    cache = core.BlockHashToBlockMap34(blocks)
    k0 = key(b"a")
    cache.insert(k0, blocks[1])
    stranger = core.KVCacheBlock34(1)  # block 1, but not the list's block 1
    with pytest.raises(ValueError):
        cache.insert(k0, stranger)
    with pytest.raises(ValueError):
        cache.insert(key(b"b"), core.KVCacheBlock34(7))  # no block 7 in the list
    for bad, error in ((-1, IndexError), (3, IndexError), ("1", TypeError), (True, TypeError)):
        with pytest.raises(error):
            cache._cache[k0] = bad
    assert cache._cache == {k0: 1} and cache.get_one_block(k0) is blocks[1]


def test_evict_first_puts_cached_blocks_in_front(core: ModuleType) -> None:
    pool = pool_class(core)(8, True, 4)
    a = pool.get_new_blocks(3)
    b = pool.get_new_blocks(2)
    for i, block in enumerate(a + b):
        block.set_block_hash(key(bytes([i])))
        pool.cached_block_hash_to_block.insert(key(bytes([i])), block)
    before = ids(pool.free_block_queue.get_all_free_blocks())
    pool.free_blocks(reversed(a))  # cached: to the back
    pool.free_blocks(reversed(b), evict_first=True)  # cached, but to the front
    queue = ids(pool.free_block_queue.get_all_free_blocks())
    assert queue == ids(reversed(b)) + before + ids(reversed(a))


def test_reset_clears_the_same_map(core: ModuleType) -> None:
    pool = pool_class(core)(6, True, 4)
    cache = pool.cached_block_hash_to_block
    block = pool.get_new_blocks(1)[0]
    block.set_block_hash(key(b"x"))
    cache.insert(key(b"x"), block)
    pool.free_blocks([block])
    assert pool.reset_prefix_cache()
    assert pool.cached_block_hash_to_block is cache and len(cache) == 0
    assert block.block_hash is None
