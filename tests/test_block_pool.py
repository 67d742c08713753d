"""BlockPool: the facade an engine talks to (SPEC section 3)."""

from __future__ import annotations

import logging
import random

import pytest

from hypothesis import given
from hypothesis import strategies as st

import kvpool
from kvpool import (
    AllBlocksCleared,
    BlockHashListWithBlockSize,
    BlockRemoved,
    BlockStored,
    KVCacheMetricsCollector,
)

from _helpers import (
    FakeLoRARequest,
    FakeRequest,
    check_invariants,
    event_hash,
    hash_chain,
    ids,
    key,
    make_hashes,
    pool_state,
)


def free_ids(pool):
    return ids(pool.free_block_queue.get_all_free_blocks())


def cached_pool(BlockPool, n=10, num_cached=3, group=0, **kwargs):
    """A pool with ``num_cached`` blocks cached for one request and freed."""
    pool = BlockPool(n, True, 16, **kwargs)
    hashes = make_hashes(num_cached)
    blocks = pool.get_new_blocks(num_cached)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, num_cached, 16, group)
    pool.free_blocks(reversed(blocks))
    return pool, hashes, blocks


# ---------------------------------------------------------------------------
# Construction


def test_construction(BlockPool, core):
    pool = BlockPool(10, True, 16)
    assert isinstance(pool, core.PoolCore)
    assert pool.num_gpu_blocks == 10
    assert pool.enable_caching is True
    assert pool.hash_block_size == 16
    assert pool.enable_kv_cache_events is False
    assert pool.kv_event_queue == []
    assert pool.metrics_collector is None
    assert type(pool.blocks) is list
    assert ids(pool.blocks) == list(range(10))
    assert all(isinstance(b, core.KVCacheBlock) for b in pool.blocks)
    assert isinstance(pool.free_block_queue, core.FreeKVCacheBlockQueue)
    assert isinstance(pool.cached_block_hash_to_block, core.BlockHashToBlockMap)
    assert len(pool.cached_block_hash_to_block) == 0
    assert pool.null_block is pool.blocks[0]
    assert pool.null_block.is_null is True
    assert pool.null_block.ref_cnt == 0
    assert [b.is_null for b in pool.blocks[1:]] == [False] * 9
    assert all(b.ref_cnt == 0 and b.block_hash is None for b in pool.blocks)
    assert free_ids(pool) == list(range(1, 10))
    assert pool.get_num_free_blocks() == 9
    check_invariants(pool)


def test_construction_keywords(BlockPool):
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool = BlockPool(
        num_gpu_blocks=4,
        enable_caching=False,
        hash_block_size=32,
        enable_kv_cache_events=True,
        metrics_collector=collector,
    )
    assert pool.num_gpu_blocks == 4
    assert pool.enable_caching is False
    assert pool.hash_block_size == 32
    assert pool.enable_kv_cache_events is True
    assert pool.metrics_collector is collector


def test_construction_positional(BlockPool):
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool = BlockPool(3, True, 16, True, collector)
    assert pool.enable_kv_cache_events is True
    assert pool.metrics_collector is collector


def test_single_block_pool(BlockPool):
    pool = BlockPool(1, True, 16)
    assert pool.blocks == [pool.null_block]
    assert pool.get_num_free_blocks() == 0
    assert pool.get_new_blocks(0) == []
    assert pool.get_usage() == 0
    assert type(pool.get_usage()) is int
    assert pool.reset_prefix_cache() is True
    check_invariants(pool)


def test_class_names(BlockPool):
    assert BlockPool.__name__ == "BlockPool"
    assert BlockPool.__qualname__ == "BlockPool"
    assert BlockPool.__module__ == "kvpool"


def test_package_block_pool_uses_selected_core():
    assert issubclass(kvpool.BlockPool, kvpool.CORE.PoolCore)
    assert kvpool.KVCacheBlock is kvpool.CORE.KVCacheBlock
    assert kvpool.FreeKVCacheBlockQueue is kvpool.CORE.FreeKVCacheBlockQueue
    assert kvpool.BlockHashToBlockMap is kvpool.CORE.BlockHashToBlockMap


def test_facade_attributes_are_writable(BlockPool):
    # vLLM code (and tests) assign these; the facade keeps them as plain attributes.
    pool = BlockPool(4, True, 16)
    pool.enable_kv_cache_events = True
    pool.kv_event_queue = []
    pool.enable_caching = False
    (b,) = pool.get_new_blocks(1)
    assert b.ref_cnt == 1


# ---------------------------------------------------------------------------
# get_new_blocks / free_blocks


def test_get_new_blocks_takes_from_head(BlockPool):
    pool = BlockPool(6, True, 16)
    got = pool.get_new_blocks(2)
    assert type(got) is list
    assert ids(got) == [1, 2]
    assert all(b.ref_cnt == 1 for b in got)
    assert got[0] is pool.blocks[1]
    assert pool.get_num_free_blocks() == 3
    assert free_ids(pool) == [3, 4, 5]
    assert pool.get_new_blocks(0) == []
    assert ids(pool.get_new_blocks(3)) == [3, 4, 5]
    assert pool.get_num_free_blocks() == 0
    check_invariants(pool)


def test_free_blocks_in_reverse_sets_queue_order(BlockPool):
    pool = BlockPool(8, True, 16)
    a = pool.get_new_blocks(3)  # 1, 2, 3
    b = pool.get_new_blocks(2)  # 4, 5
    pool.free_blocks(reversed(a))
    assert free_ids(pool) == [6, 7, 3, 2, 1]
    pool.free_blocks(b[::-1])
    assert free_ids(pool) == [6, 7, 3, 2, 1, 5, 4]
    assert all(x.ref_cnt == 0 for x in a + b)
    check_invariants(pool)
    # get_one_block-style LRU: the least recently freed comes out first, and
    # the tail of a chain (freed first) goes before its prefix.
    assert ids(pool.get_new_blocks(4)) == [6, 7, 3, 2]


def test_free_blocks_only_appends_at_zero(BlockPool):
    pool = BlockPool(5, True, 16)
    blocks = pool.get_new_blocks(2)
    pool.touch([blocks[0]])
    assert blocks[0].ref_cnt == 2
    pool.free_blocks(blocks)
    assert blocks[0].ref_cnt == 1 and blocks[1].ref_cnt == 0
    assert free_ids(pool) == [3, 4, 2]
    pool.free_blocks([blocks[0]])
    assert free_ids(pool) == [3, 4, 2, 1]
    check_invariants(pool)


def test_free_blocks_accepts_any_iterable(BlockPool):
    pool = BlockPool(6, True, 16)
    blocks = pool.get_new_blocks(4)
    pool.free_blocks(b for b in blocks[:2])
    pool.free_blocks(iter(blocks[2:3]))
    pool.free_blocks((blocks[3],))
    pool.free_blocks([])
    assert free_ids(pool) == [5, 1, 2, 3, 4]
    check_invariants(pool)


def test_free_blocks_counts_but_never_queues_the_null_block(BlockPool):
    # vLLM 0.15 decrements every block it is given, the null block too (its
    # ref_cnt goes below 0), and queues only non-null blocks reaching 0.
    pool = BlockPool(4, True, 16)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks([pool.null_block, blocks[1], pool.null_block, blocks[0]])
    assert pool.null_block.ref_cnt == -2
    assert free_ids(pool) == [3, 2, 1]
    pool.free_blocks([pool.null_block])
    assert pool.null_block.ref_cnt == -3
    check_invariants(pool)


def test_get_new_blocks_evicts_hashes_when_caching(BlockPool):
    pool, hashes, blocks = cached_pool(BlockPool, n=4, num_cached=3)
    assert free_ids(pool) == [3, 2, 1]
    got = pool.get_new_blocks(2)
    assert ids(got) == [3, 2]
    assert got[0].block_hash is None and got[1].block_hash is None
    assert pool.get_cached_block(hashes[2], [0]) is None
    assert pool.get_cached_block(hashes[1], [0]) is None
    assert pool.get_cached_block(hashes[0], [0]) == [pool.blocks[1]]
    assert len(pool.cached_block_hash_to_block) == 1
    check_invariants(pool)


def test_get_new_blocks_keeps_hashes_without_caching(BlockPool):
    pool = BlockPool(3, False, 16)
    blocks = pool.get_new_blocks(2)
    hashes = make_hashes(2)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 2, 16, 0)
    pool.free_blocks(blocks[::-1])
    got = pool.get_new_blocks(2)
    # As vLLM: with caching off nothing is evicted at allocation.
    assert ids(got) == [2, 1]
    assert [b.block_hash for b in got] == [key(hashes[1]), key(hashes[0])]
    assert pool.get_cached_block(hashes[0], [0]) == [blocks[0]]
    check_invariants(pool)


# ---------------------------------------------------------------------------
# touch


def test_touch_revives_a_free_cached_block(BlockPool):
    pool, hashes, blocks = cached_pool(BlockPool, n=6, num_cached=3)
    assert free_ids(pool) == [4, 5, 3, 2, 1]
    hit = [pool.get_cached_block(h, [0])[0] for h in hashes[:2]]
    assert hit == blocks[:2]
    pool.touch(hit)
    assert [b.ref_cnt for b in hit] == [1, 1]
    assert free_ids(pool) == [4, 5, 3]
    assert all(b.prev_free_block is None and b.next_free_block is None for b in hit)
    check_invariants(pool)


def test_touch_running_block_and_repeats(BlockPool):
    pool = BlockPool(5, True, 16)
    blocks = pool.get_new_blocks(2)
    pool.touch(blocks)
    assert [b.ref_cnt for b in blocks] == [2, 2]
    free_before = free_ids(pool)
    pool.touch([pool.blocks[3], pool.blocks[3]])
    assert pool.blocks[3].ref_cnt == 2
    assert free_ids(pool) == [x for x in free_before if x != 3]
    pool.touch([])
    pool.touch(())
    check_invariants(pool)


def test_touch_counts_the_null_block(BlockPool):
    # vLLM 0.15 adds a reference to the null block too; it never leaves (or
    # joins) the queue.
    pool = BlockPool(3, True, 16)
    pool.touch([pool.null_block, pool.null_block])
    assert pool.null_block.ref_cnt == 2
    assert free_ids(pool) == [1, 2]
    check_invariants(pool)


# ---------------------------------------------------------------------------
# get_cached_block / find_longest_cache_hit


def test_get_cached_block_miss_and_hit(BlockPool):
    pool, hashes, blocks = cached_pool(BlockPool, n=6, num_cached=3, group=2)
    assert pool.get_cached_block(hashes[1], [2]) == [blocks[1]]
    assert pool.get_cached_block(hashes[1], [0]) is None
    assert pool.get_cached_block(b"unknown", [2]) is None
    assert pool.get_cached_block(hashes[1], []) == []
    assert pool.get_cached_block(hashes[1], [2, 2]) == [blocks[1], blocks[1]]
    # Reads only.
    assert [b.ref_cnt for b in blocks] == [0, 0, 0]


def test_get_cached_block_all_or_nothing(BlockPool):
    pool = BlockPool(8, True, 16)
    h = make_hashes(1)
    g0 = pool.get_new_blocks(1)
    g1 = pool.get_new_blocks(1)
    pool.cache_full_blocks(FakeRequest(h), g0, 0, 1, 16, 0)
    assert pool.get_cached_block(h[0], [0]) == g0
    assert pool.get_cached_block(h[0], [0, 1]) is None
    assert pool.get_cached_block(h[0], [1, 0]) is None
    pool.cache_full_blocks(FakeRequest(h), g1, 0, 1, 16, 1)
    assert pool.get_cached_block(h[0], [0, 1]) == g0 + g1
    assert pool.get_cached_block(h[0], [1, 0]) == g1 + g0
    assert pool.get_cached_block(h[0], [1, 0, 5]) is None


def test_get_cached_block_returns_earliest_duplicate(BlockPool):
    pool = BlockPool(8, True, 16)
    h = make_hashes(1)
    first = pool.get_new_blocks(1)
    second = pool.get_new_blocks(1)
    pool.cache_full_blocks(FakeRequest(h), second, 0, 1, 16, 0)
    pool.cache_full_blocks(FakeRequest(h), first, 0, 1, 16, 0)
    assert len(pool.cached_block_hash_to_block) == 1
    assert pool.get_cached_block(h[0], [0]) == second
    pool.evict_blocks([second[0].block_id])
    assert pool.get_cached_block(h[0], [0]) == first
    check_invariants(pool)


def test_group_ids_at_the_edges(BlockPool):
    pool = BlockPool(4, True, 16)
    h = make_hashes(1)
    (b,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(FakeRequest(h), [b], 0, 1, 16, 2**32 - 1)
    assert b.block_hash == h[0] + b"\xff\xff\xff\xff"
    assert pool.get_cached_block(h[0], [2**32 - 1]) == [b]
    assert pool.get_cached_block(h[0], [0]) is None


def test_find_longest_cache_hit_basic(BlockPool):
    pool = BlockPool(10, True, 16)
    hashes = make_hashes(5)
    g0 = pool.get_new_blocks(4)
    g1 = pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(hashes), g0, 0, 4, 16, 0)
    pool.cache_full_blocks(FakeRequest(hashes), g1, 0, 2, 16, 1)
    before = pool_state(pool)
    assert pool.find_longest_cache_hit(hashes, [0]) == [g0]
    assert pool.find_longest_cache_hit(hashes, [0, 1]) == [g0[:2], g1]
    assert pool.find_longest_cache_hit(hashes, [1, 0]) == [g1, g0[:2]]
    assert pool.find_longest_cache_hit(hashes, [0], 3) == [g0[:3]]
    assert pool.find_longest_cache_hit(hashes, [0], 0) == [[]]
    assert pool.find_longest_cache_hit(hashes, [0], 100) == [g0]
    assert pool.find_longest_cache_hit(hashes, [0], max_blocks=None) == [g0]
    assert pool.find_longest_cache_hit(hashes, []) == []
    assert pool.find_longest_cache_hit([], [0, 1]) == [[], []]
    assert pool.find_longest_cache_hit([b"miss"] + hashes, [0]) == [[]]
    assert pool.find_longest_cache_hit(hashes[1:], [0]) == [g0[1:]]
    assert pool.find_longest_cache_hit(hashes, [3]) == [[]]
    assert pool.find_longest_cache_hit(tuple(hashes), (0,)) == [g0]
    assert pool_state(pool) == before


def test_find_longest_cache_hit_stops_at_first_miss(BlockPool):
    pool = BlockPool(10, True, 16)
    hashes = make_hashes(4)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 4, 16, 0)
    pool.evict_blocks([blocks[1].block_id])
    # hashes[2] and [3] still hit, but the prefix breaks at [1].
    assert pool.find_longest_cache_hit(hashes, [0]) == [blocks[:1]]


def test_find_longest_cache_hit_with_block_size_view(BlockPool):
    pool = BlockPool(10, True, 16)
    hashes = make_hashes(6)
    blocks = pool.get_new_blocks(3)
    request = FakeRequest(hashes)
    pool.cache_full_blocks(request, blocks, 0, 3, 32, 0)
    view = BlockHashListWithBlockSize(hashes, 16, 32)
    assert pool.find_longest_cache_hit(view, [0]) == [blocks]
    assert pool.find_longest_cache_hit(list(view), [0], 2) == [blocks[:2]]


def _per_block_loop(pool, hashes, group_ids, max_blocks):
    """What an engine does without the bulk API."""
    result = [[] for _ in group_ids]
    limit = len(hashes) if max_blocks is None else min(max_blocks, len(hashes))
    for h in hashes[:limit]:
        hit = pool.get_cached_block(h, group_ids)
        if hit is None:
            break
        for lst, b in zip(result, hit):
            lst.append(b)
    return result


def _random_cached_pool(BlockPool, rng, n_requests, alphabet=3, max_len=6):
    pool = BlockPool(64, True, 16)
    for _ in range(n_requests):
        contents = [rng.randrange(alphabet) for _ in range(rng.randrange(max_len + 1))]
        hashes = hash_chain(contents)
        group = rng.choice([0, 1])
        hit = pool.find_longest_cache_hit(hashes, [group])[0]
        need = len(hashes) - len(hit)
        if need > pool.get_num_free_blocks():
            break
        pool.touch(hit)
        blocks = hit + pool.get_new_blocks(need)
        pool.cache_full_blocks(FakeRequest(hashes), blocks, len(hit), len(hashes), 16, group)
        if rng.random() < 0.7:
            pool.free_blocks(reversed(blocks))
    check_invariants(pool)
    return pool


def test_find_longest_cache_hit_matches_loop_random(BlockPool):
    rng = random.Random(1234)
    for _ in range(30):
        pool = _random_cached_pool(BlockPool, rng, rng.randrange(1, 20))
        for _ in range(20):
            contents = [rng.randrange(3) for _ in range(rng.randrange(8))]
            hashes = hash_chain(contents)
            groups = rng.choice([[0], [1], [0, 1], [1, 0], [], [0, 0]])
            max_blocks = rng.choice([None, 0, 1, 2, 5, 100])
            before = pool_state(pool)
            got = pool.find_longest_cache_hit(hashes, groups, max_blocks)
            assert got == _per_block_loop(pool, hashes, groups, max_blocks)
            assert pool_state(pool) == before


@given(
    seed=st.integers(0, 2**32 - 1),
    n_requests=st.integers(0, 25),
    query=st.lists(st.integers(0, 2), max_size=8),
    groups=st.lists(st.integers(0, 2), max_size=3),
    max_blocks=st.none() | st.integers(0, 10),
)
def test_find_longest_cache_hit_matches_loop_hypothesis(
    BlockPool, seed, n_requests, query, groups, max_blocks
):
    pool = _random_cached_pool(BlockPool, random.Random(seed), n_requests)
    hashes = hash_chain(query)
    got = pool.find_longest_cache_hit(hashes, groups, max_blocks)
    assert got == _per_block_loop(pool, hashes, groups, max_blocks)
    check_invariants(pool)


# ---------------------------------------------------------------------------
# cache_full_blocks


def test_cache_full_blocks_sets_keys_and_map(BlockPool):
    pool = BlockPool(8, True, 16)
    hashes = make_hashes(4)
    blocks = pool.get_new_blocks(4)
    request = FakeRequest(hashes)
    pool.cache_full_blocks(request, blocks, 0, 2, 16, 1)
    assert [b.block_hash for b in blocks] == [key(hashes[0], 1), key(hashes[1], 1), None, None]
    assert len(pool.cached_block_hash_to_block) == 2
    pool.cache_full_blocks(request, blocks, 2, 4, 16, 1)
    assert [b.block_hash for b in blocks] == [key(h, 1) for h in hashes]
    for h, b in zip(hashes, blocks):
        assert pool.cached_block_hash_to_block.get_one_block(key(h, 1)) is b
        assert pool.get_cached_block(h, [1]) == [b]
    assert [b.ref_cnt for b in blocks] == [1] * 4
    check_invariants(pool)


def test_cache_full_blocks_noop_when_nothing_new(BlockPool):
    pool = BlockPool(4, True, 16, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(2)
    before = pool_state(pool)
    # Hashes are not even looked at: vLLM returns before its length check.
    pool.cache_full_blocks(FakeRequest([]), blocks, 2, 2, 16, 0)
    pool.cache_full_blocks(FakeRequest([]), blocks, 2, 1, 16, 0)
    pool.cache_full_blocks(FakeRequest([]), blocks, 0, 0, 16, 0)
    assert pool_state(pool) == before
    assert pool.take_events() == []


def test_cache_full_blocks_skips_null_blocks(BlockPool):
    pool = BlockPool(6, True, 16, enable_kv_cache_events=True)
    hashes = make_hashes(4)
    real = pool.get_new_blocks(2)
    blocks = [pool.null_block, real[0], pool.null_block, real[1]]
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 4, 16, 0)
    assert pool.null_block.block_hash is None
    assert real[0].block_hash == key(hashes[1])
    assert real[1].block_hash == key(hashes[3])
    assert pool.get_cached_block(hashes[0], [0]) is None
    assert pool.get_cached_block(hashes[2], [0]) is None
    assert len(pool.cached_block_hash_to_block) == 2
    (event,) = pool.take_events()
    assert event.block_hashes == [event_hash(hashes[1]), event_hash(hashes[3])]
    check_invariants(pool)


def test_cache_full_blocks_all_null_still_emits_event(BlockPool):
    pool = BlockPool(3, True, 16, enable_kv_cache_events=True)
    hashes = make_hashes(2)
    pool.cache_full_blocks(FakeRequest(hashes), [pool.null_block] * 2, 0, 2, 16, 0)
    (event,) = pool.take_events()
    assert event.block_hashes == []
    assert len(pool.cached_block_hash_to_block) == 0


def test_cache_full_blocks_shorter_block_list(BlockPool):
    # blocks[num_cached:num_full] has slice semantics: a short list caches what it has.
    pool = BlockPool(6, True, 16)
    hashes = make_hashes(4)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 1, 4, 16, 0)
    assert blocks[0].block_hash is None
    assert blocks[1].block_hash == key(hashes[1])
    assert len(pool.cached_block_hash_to_block) == 1
    check_invariants(pool)


def test_cache_full_blocks_block_size_multiple(BlockPool):
    pool = BlockPool(8, True, 16)
    hashes = make_hashes(7)  # 7 hashes at 16 tokens = 2 full 48-token blocks
    request = FakeRequest(hashes, all_token_ids=list(range(7 * 16 + 5)))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, blocks, 0, 1, 48, 0)
    pool.cache_full_blocks(request, blocks, 1, 2, 48, 0)
    assert blocks[0].block_hash == key(b"".join(hashes[0:3]))
    assert blocks[1].block_hash == key(b"".join(hashes[3:6]))
    assert blocks[2].block_hash is None
    assert pool.get_cached_block(b"".join(hashes[3:6]), [0]) == [blocks[1]]
    check_invariants(pool)


def test_cache_full_blocks_block_size_multiple_exact(BlockPool):
    pool = BlockPool(8, True, 16, enable_kv_cache_events=True)
    hashes = make_hashes(6)
    request = FakeRequest(hashes, all_token_ids=list(range(6 * 16)))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, blocks, 0, 1, 32, 4)
    pool.cache_full_blocks(request, blocks, 1, 3, 32, 4)
    joined = [hashes[0] + hashes[1], hashes[2] + hashes[3], hashes[4] + hashes[5]]
    assert [b.block_hash for b in blocks] == [key(h, 4) for h in joined]
    assert pool.get_cached_block(joined[1], [4]) == [blocks[1]]
    assert pool.get_cached_block(hashes[2], [4]) is None
    first, second = pool.take_events()
    assert first == BlockStored(
        block_hashes=[event_hash(joined[0])],
        parent_block_hash=None,
        token_ids=list(range(0, 32)),
        block_size=32,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    assert second == BlockStored(
        block_hashes=[event_hash(joined[1]), event_hash(joined[2])],
        parent_block_hash=event_hash(joined[0]),
        token_ids=list(range(32, 96)),
        block_size=32,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    check_invariants(pool)


def test_cache_full_blocks_events(BlockPool):
    pool = BlockPool(8, True, 4, enable_kv_cache_events=True)
    hashes = make_hashes(3)
    tokens = list(range(100, 114))  # 3 full blocks + 2 tokens
    request = FakeRequest(hashes, tokens, FakeLoRARequest(7, "sql-adapter"))
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    pool.cache_full_blocks(request, blocks, 2, 3, 4, 0)
    events = pool.take_events()
    assert events == [
        BlockStored(
            block_hashes=[event_hash(hashes[0]), event_hash(hashes[1])],
            parent_block_hash=None,
            token_ids=tokens[0:8],
            block_size=4,
            lora_id=7,
            medium="GPU",
            lora_name="sql-adapter",
        ),
        BlockStored(
            block_hashes=[event_hash(hashes[2])],
            parent_block_hash=event_hash(hashes[1]),
            token_ids=tokens[8:12],
            block_size=4,
            lora_id=7,
            medium="GPU",
            lora_name="sql-adapter",
        ),
    ]


def test_cache_full_blocks_accepts_tuple_of_hashes(BlockPool):
    pool = BlockPool(4, True, 16)
    hashes = tuple(make_hashes(2))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 2, 16, 0)
    assert [b.block_hash for b in blocks] == [key(h) for h in hashes]


def test_free_cached_block_stays_cached_until_reused(BlockPool):
    pool, hashes, blocks = cached_pool(BlockPool, n=5, num_cached=2)
    assert all(b.ref_cnt == 0 for b in blocks)
    assert [b.block_hash for b in blocks] == [key(h) for h in hashes]
    assert pool.get_cached_block(hashes[0], [0]) == [blocks[0]]
    check_invariants(pool)


# ---------------------------------------------------------------------------
# Eviction


def test_maybe_evict_cached_block(BlockPool):
    pool, hashes, blocks = cached_pool(BlockPool, n=5, num_cached=2, enable_kv_cache_events=True)
    assert pool._maybe_evict_cached_block(blocks[0]) is True
    assert blocks[0].block_hash is None
    assert pool.get_cached_block(hashes[0], [0]) is None
    assert pool._maybe_evict_cached_block(blocks[0]) is False
    assert pool._maybe_evict_cached_block(pool.null_block) is False
    assert pool._maybe_evict_cached_block(pool.blocks[4]) is False
    assert pool.take_events()[-1:] == [
        BlockRemoved(block_hashes=[event_hash(hashes[0])], medium="GPU")
    ]
    # The free queue is not touched.
    assert free_ids(pool) == [3, 4, 2, 1]
    check_invariants(pool)


def test_maybe_evict_keeps_hash_not_found_in_map(BlockPool):
    pool = BlockPool(4, True, 16, enable_kv_cache_events=True)
    b = pool.blocks[1]
    b.block_hash = key(b"dangling")  # set directly, never inserted in the map
    assert pool._maybe_evict_cached_block(b) is False
    assert b.block_hash == key(b"dangling")
    assert pool.take_events() == []
    # get_new_blocks evicts the same way: a hash not found in the map stays.
    (got,) = pool.get_new_blocks(1)
    assert got is b and b.block_hash == key(b"dangling")
    assert pool.take_events() == []


def test_maybe_evict_other_block_under_same_key(BlockPool):
    pool = BlockPool(4, True, 16)
    a, b = pool.get_new_blocks(2)
    h = make_hashes(1)
    pool.cache_full_blocks(FakeRequest(h), [a], 0, 1, 16, 0)
    b.block_hash = key(h[0])  # same key, but the map holds only a
    assert pool._maybe_evict_cached_block(b) is False
    assert b.block_hash == key(h[0])
    assert pool.get_cached_block(h[0], [0]) == [a]


def test_evict_blocks(BlockPool):
    pool = BlockPool(8, True, 16, enable_kv_cache_events=True)
    hashes = make_hashes(4)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 4, 16, 0)
    pool.free_blocks(reversed(blocks[2:]))
    pool.take_events()
    queue_before = free_ids(pool)
    pool.evict_blocks([blocks[1].block_id, blocks[3].block_id, 0, 7])
    # Hashes dropped, allocations and queue kept.
    assert [b.block_hash for b in blocks] == [key(hashes[0]), None, key(hashes[2]), None]
    assert [b.ref_cnt for b in blocks] == [1, 1, 0, 0]
    assert free_ids(pool) == queue_before
    assert pool.take_events() == [
        BlockRemoved(block_hashes=[event_hash(hashes[1])], medium="GPU"),
        BlockRemoved(block_hashes=[event_hash(hashes[3])], medium="GPU"),
    ]
    check_invariants(pool)


def test_evict_blocks_accepts_set_and_generator(BlockPool):
    pool, hashes, blocks = cached_pool(BlockPool, n=6, num_cached=3)
    pool.evict_blocks({blocks[0].block_id})
    pool.evict_blocks(b.block_id for b in blocks[1:2])
    pool.evict_blocks(set())
    pool.evict_blocks([])
    assert [b.block_hash for b in blocks] == [None, None, key(hashes[2])]
    check_invariants(pool)


def test_evict_blocks_same_id_twice(BlockPool):
    pool, hashes, blocks = cached_pool(BlockPool, n=4, num_cached=1, enable_kv_cache_events=True)
    pool.take_events()
    pool.evict_blocks([1, 1])
    assert blocks[0].block_hash is None
    assert len(pool.take_events()) == 1


def test_evict_blocks_without_events(BlockPool):
    pool, hashes, blocks = cached_pool(BlockPool, n=4, num_cached=2)
    pool.evict_blocks([1, 2])
    assert pool.kv_event_queue == []
    assert len(pool.cached_block_hash_to_block) == 0


# ---------------------------------------------------------------------------
# reset_prefix_cache


def test_reset_prefix_cache_success(BlockPool, caplog):
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool, hashes, blocks = cached_pool(
        BlockPool, n=6, num_cached=3, enable_kv_cache_events=True, metrics_collector=collector
    )
    pool.take_events()
    old_map = pool.cached_block_hash_to_block
    queue_before = free_ids(pool)
    assert collector.block_metrics
    with caplog.at_level(logging.INFO, logger="kvpool.block_pool"):
        assert pool.reset_prefix_cache() is True
    assert "Successfully reset prefix cache" in caplog.text
    assert all(b.block_hash is None for b in pool.blocks)
    assert pool.cached_block_hash_to_block is not old_map
    assert len(pool.cached_block_hash_to_block) == 0
    assert all(pool.get_cached_block(h, [0]) is None for h in hashes)
    assert free_ids(pool) == queue_before
    assert pool.take_events() == [AllBlocksCleared()]
    assert collector.block_metrics == {}
    assert collector.drain_events() == []
    check_invariants(pool)


def test_reset_prefix_cache_failure(BlockPool, caplog):
    pool, hashes, blocks = cached_pool(BlockPool, n=6, num_cached=3, enable_kv_cache_events=True)
    pool.take_events()
    pool.get_new_blocks(2)
    before = pool_state(pool)
    with caplog.at_level(logging.WARNING, logger="kvpool.block_pool"):
        assert pool.reset_prefix_cache() is False
    assert "not freed yet" in caplog.text
    assert pool_state(pool) == before
    assert pool.take_events() == []


def test_reset_prefix_cache_with_touched_block_fails(BlockPool):
    pool, hashes, blocks = cached_pool(BlockPool, n=6, num_cached=3)
    pool.touch([blocks[0]])
    assert pool.reset_prefix_cache() is False
    pool.free_blocks([blocks[0]])
    assert pool.reset_prefix_cache() is True
    check_invariants(pool)


def test_reset_prefix_cache_without_events(BlockPool):
    pool, _, _ = cached_pool(BlockPool, n=4, num_cached=2)
    assert pool.reset_prefix_cache() is True
    assert pool.kv_event_queue == []
    assert pool.take_events() == []


def test_reset_then_cache_again(BlockPool):
    pool, hashes, _ = cached_pool(BlockPool, n=4, num_cached=2)
    pool.reset_prefix_cache()
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 2, 16, 0)
    assert pool.get_cached_block(hashes[1], [0]) == [blocks[1]]
    check_invariants(pool)


# ---------------------------------------------------------------------------
# get_usage / get_num_free_blocks / take_events


def test_get_usage(BlockPool):
    pool = BlockPool(5, True, 16)
    assert pool.get_usage() == 0.0
    blocks = pool.get_new_blocks(2)
    assert pool.get_usage() == 0.5
    pool.get_new_blocks(2)
    assert pool.get_usage() == 1.0
    pool.free_blocks(blocks)
    assert pool.get_usage() == 0.5
    assert isinstance(pool.get_usage(), float)


def test_get_num_free_blocks_follows_queue(BlockPool):
    pool = BlockPool(7, True, 16)
    assert pool.get_num_free_blocks() == 6
    blocks = pool.get_new_blocks(4)
    assert pool.get_num_free_blocks() == 2 == pool.free_block_queue.num_free_blocks
    pool.free_blocks(blocks[:1])
    assert pool.get_num_free_blocks() == 3


def test_take_events_disabled(BlockPool):
    pool, _, _ = cached_pool(BlockPool, n=4, num_cached=2)
    pool.get_new_blocks(3)
    assert pool.take_events() == []
    assert pool.kv_event_queue == []


def test_take_events_returns_and_empties(BlockPool):
    pool = BlockPool(4, True, 16, enable_kv_cache_events=True)
    hashes = make_hashes(2)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 2, 16, 0)
    queue = pool.kv_event_queue
    events = pool.take_events()
    assert events is queue
    assert len(events) == 1
    assert pool.kv_event_queue == [] and pool.kv_event_queue is not queue
    assert pool.take_events() == []
    pool.free_blocks(reversed(blocks))
    pool.get_new_blocks(3)
    assert pool.take_events() == [
        BlockRemoved(block_hashes=[event_hash(hashes[1])], medium="GPU"),
        BlockRemoved(block_hashes=[event_hash(hashes[0])], medium="GPU"),
    ]


def test_full_request_lifecycle(BlockPool):
    """Two requests sharing a prefix, as the scheduler drives them."""
    pool = BlockPool(10, True, 16, enable_kv_cache_events=True)
    shared = hash_chain([1, 2, 3])
    a_hashes = shared + hash_chain([4], parent=shared[-1])
    b_hashes = shared + hash_chain([5, 6], parent=shared[-1])

    a_blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(FakeRequest(a_hashes), a_blocks, 0, 4, 16, 0)

    (hit,) = pool.find_longest_cache_hit(b_hashes, [0])
    assert hit == a_blocks[:3]
    pool.touch(hit)
    b_blocks = hit + pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(b_hashes), b_blocks, 3, 5, 16, 0)
    assert [b.ref_cnt for b in a_blocks] == [2, 2, 2, 1]

    pool.free_blocks(reversed(a_blocks))
    assert free_ids(pool) == [7, 8, 9, 4]
    pool.free_blocks(reversed(b_blocks))
    assert free_ids(pool) == [7, 8, 9, 4, 6, 5, 3, 2, 1]
    check_invariants(pool)
    # Everything is still cached; allocation evicts from the LRU end.
    got = pool.get_new_blocks(5)
    assert ids(got) == [7, 8, 9, 4, 6]
    assert pool.find_longest_cache_hit(b_hashes, [0]) == [b_blocks[:4]]
    check_invariants(pool)


# ---------------------------------------------------------------------------
# PoolCore: the core's own methods, which the facade builds on


def test_pool_core_ignores_facade_arguments(core):
    pool = core.PoolCore(4, True, 16, enable_kv_cache_events=True, metrics_collector=None)
    assert pool.num_gpu_blocks == 4
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [1, 2, 3]
    assert pool.null_block is pool.blocks[0]
    assert core.PoolCore(num_gpu_blocks=2).num_gpu_blocks == 2


def test_pool_core_allocate_evict_and_removed(core):
    pool = core.PoolCore(5)
    hashes = make_hashes(3)
    got = pool._allocate(3, True, None)
    assert ids(got) == [1, 2, 3] and all(b.ref_cnt == 1 for b in got)
    stored = []
    pool._cache_blocks(got, 0, 3, hashes, 2, stored)
    assert stored == hashes  # the hashes, without the group suffix
    pool.free_blocks(reversed(got))
    removed = []
    again = pool._allocate(2, True, removed)
    assert ids(again) == [4, 3]
    assert removed == [key(hashes[2], 2)]  # the key, with the group suffix
    assert again[1].block_hash is None
    # Without eviction the hash stays on the block and in the map.
    kept = pool._allocate(1, False, removed)
    assert kept == [got[1]] and got[1].block_hash == key(hashes[1], 2)
    assert removed == [key(hashes[2], 2)]
    assert pool._allocate(0, True, None) == []


def test_pool_core_evict_block(core):
    pool = core.PoolCore(4)
    blocks = pool._allocate(2, True, None)
    h = make_hashes(2)
    pool._cache_blocks(blocks, 0, 2, h, 0, None)
    removed = []
    assert pool._evict_block(blocks[0], removed) is True
    assert removed == [key(h[0])]
    assert pool._evict_block(blocks[0], removed) is False
    assert pool._evict_block(pool.null_block, removed) is False
    assert pool._evict_block(blocks[1], None) is True
    assert removed == [key(h[0])]
    assert [b.ref_cnt for b in blocks] == [1, 1]


def test_pool_core_evict_block_ids(core):
    pool = core.PoolCore(6)
    blocks = pool._allocate(3, True, None)
    h = make_hashes(3)
    pool._cache_blocks(blocks, 0, 3, h, 0, None)
    removed = []
    pool._evict_block_ids([3, 0, 5, 1], removed)
    assert removed == [key(h[2]), key(h[0])]
    assert [b.block_hash for b in blocks] == [None, key(h[1]), None]


def test_pool_core_cache_blocks_slice_and_nulls(core):
    pool = core.PoolCore(6)
    blocks = pool._allocate(3, True, None)
    h = make_hashes(5)
    stored = []
    pool._cache_blocks([pool.null_block] + blocks, 1, 5, h, 7, stored)
    # blocks[1:5] of a 4-long list is 3 blocks: hashes 1, 2, 3.
    assert stored == h[1:4]
    assert [b.block_hash for b in blocks] == [key(x, 7) for x in h[1:4]]
    pool._cache_blocks(blocks, 2, 2, [], 0, stored)  # start >= stop: a no-op
    pool._cache_blocks(blocks, 3, 1, [], 0, stored)
    assert stored == h[1:4]


def test_pool_core_touch_and_reset(core):
    pool = core.PoolCore(4)
    blocks = pool._allocate(2, True, None)
    pool._cache_blocks(blocks, 0, 2, make_hashes(2), 0, None)
    pool.free_blocks(blocks)
    pool._touch([blocks[1], pool.null_block])
    assert blocks[1].ref_cnt == 1 and pool.null_block.ref_cnt == 0
    old_map = pool.cached_block_hash_to_block
    assert pool._reset_cache() is False
    assert pool.cached_block_hash_to_block is old_map and len(old_map) == 2
    pool.free_blocks([blocks[1]])
    assert pool._reset_cache() is True
    assert pool.cached_block_hash_to_block is not old_map
    assert len(pool.cached_block_hash_to_block) == 0
    assert all(b.block_hash is None for b in pool.blocks)
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [3, 1, 2]


# ---------------------------------------------------------------------------
# free_blocks(reversed(list)): the engine's call, which the compiled core
# walks in place instead of copying.


def test_free_reversed_iterator_frees_in_reverse_and_exhausts_it(BlockPool):
    pool = BlockPool(8, True, 16)
    blocks = pool.get_new_blocks(5)
    it = reversed(blocks)
    assert next(it) is blocks[4]  # partly consumed: the rest is freed
    pool.free_blocks(it)
    assert list(it) == []
    assert [b.ref_cnt for b in blocks] == [0, 0, 0, 0, 1]
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [6, 7, 4, 3, 2, 1]
    done = reversed([blocks[4]])
    list(done)
    pool.free_blocks(done)  # an exhausted iterator frees nothing
    assert blocks[4].ref_cnt == 1
    pool.free_blocks(reversed([]))
    assert pool.get_num_free_blocks() == 6


def test_free_reversed_iterator_error_changes_nothing(BlockPool):
    pool = BlockPool(8, True, 16)
    blocks = pool.get_new_blocks(4)
    pool.free_blocks([blocks[0]])
    before = pool_state(pool)
    # Walked backwards: blocks 4, 3, 2 reach zero and are linked, then
    # block 1 (ref_cnt 0) is a double free: all of it must be undone.
    with pytest.raises(ValueError):
        pool.free_blocks(reversed(blocks))
    assert pool_state(pool) == before
    with pytest.raises(ValueError):
        pool.free_blocks(reversed([blocks[2], blocks[2]]))
    assert pool_state(pool) == before
