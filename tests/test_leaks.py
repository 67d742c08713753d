"""Memory: no growth over many allocate/cache/hit/free cycles, and a dropped
pool gives its memory back. Measured with tracemalloc (allocations through
Python's allocators) and reference counts; nothing here is timed."""

from __future__ import annotations

import gc
import sys
import tracemalloc

import pytest

from kvpool import KVCacheMetricsCollector

from _helpers import FakeRequest, check_invariants

CYCLES = 100_000
# Events and sampled metrics build Python objects on every call (the facade's
# part, the same for both cores), so that variant runs fewer cycles.
CYCLES_WITH_EVENTS = 20_000
# Allowed drift after the cycles: free lists, dict resizes, interned ints.
# One leaked object per cycle would be several megabytes.
GROWTH_LIMIT = 64 * 1024


def run_cycles(pool, start: int, count: int) -> None:
    """The engine's life in miniature: a request allocates, caches its full
    blocks, a second request hits that prefix, both free in reverse; now and
    then a block is evicted by id or the whole cache reset."""
    for i in range(start, start + count):
        tag = i.to_bytes(8, "big")
        hashes = [tag + b"a", tag + b"b"]  # fresh objects every cycle
        request = FakeRequest(hashes, list(range(8)))
        first = pool.get_new_blocks(3)
        pool.cache_full_blocks(request, first, 0, 2, 4, 0)
        (hit,) = pool.find_longest_cache_hit(hashes, [0])
        pool.touch(hit)
        second = hit + pool.get_new_blocks(1)
        pool.free_blocks(reversed(first))
        pool.free_blocks(reversed(second))
        if i % 7 == 0:
            pool.evict_blocks([first[1].block_id])
        if i % 1000 == 0:
            pool.reset_prefix_cache()
        pool.take_events()
        if pool.metrics_collector is not None:
            pool.metrics_collector.drain_events()


def traced_growth(fn) -> tuple[int, str]:
    """Bytes still allocated after ``fn()`` (and a GC), with the top sources."""
    gc.collect()
    tracemalloc.start()
    try:
        gc.collect()
        before_snapshot = tracemalloc.take_snapshot()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        after_snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    top = after_snapshot.compare_to(before_snapshot, "lineno")[:5]
    return after - before, "\n".join(str(stat) for stat in top)


@pytest.mark.parametrize("events", [False, True], ids=["plain", "events+metrics"])
def test_no_growth_over_many_cycles(BlockPool, events):
    collector = KVCacheMetricsCollector(sample_rate=1.0) if events else None
    pool = BlockPool(8, True, 4, enable_kv_cache_events=events, metrics_collector=collector)
    cycles = CYCLES_WITH_EVENTS if events else CYCLES
    run_cycles(pool, 0, 2_000)  # warm up: the map, free lists, small-int caches
    growth, top = traced_growth(lambda: run_cycles(pool, 2_000, cycles))
    assert growth < GROWTH_LIMIT, f"{growth} bytes more after {cycles} cycles:\n{top}"
    check_invariants(pool)


def test_misuse_does_not_leak(BlockPool):
    """Refused calls release what they looked at (error paths are where
    compiled code most often forgets a reference)."""
    pool = BlockPool(8, True, 4, enable_kv_cache_events=True)
    other = BlockPool(8, True, 4)
    run_cycles(pool, 0, 100)

    def misuse(count):
        for i in range(count):
            tag = i.to_bytes(8, "big")
            calls = [
                lambda: pool.get_new_blocks(pool.get_num_free_blocks() + 1),
                lambda: pool.free_blocks([pool.blocks[1], pool.blocks[1]]),
                lambda: pool.touch([pool.blocks[2], other.blocks[3]]),
                lambda: pool.evict_blocks([1, 99]),
                lambda: pool.cache_full_blocks(FakeRequest([tag]), pool.blocks[1:3], 0, 2, 4, 0),
                lambda: pool.cache_full_blocks(FakeRequest([tag, 5]), pool.blocks[1:3], 0, 2, 4, 0),
                lambda: pool.get_cached_block(str(i), [0]),
                lambda: pool.free_block_queue.popleft_n(99),
                lambda: pool.free_block_queue.append(pool.blocks[3]),
            ]
            for call in calls:
                try:
                    call()
                except (ValueError, TypeError, RuntimeError):
                    pass
                else:
                    raise AssertionError("a misuse was accepted")

    misuse(500)
    growth, top = traced_growth(lambda: misuse(5_000))
    assert growth < GROWTH_LIMIT, f"{growth} bytes more after refused calls:\n{top}"
    check_invariants(pool)


def test_dropped_pool_frees_its_memory(BlockPool):
    def build_use_drop():
        pool = BlockPool(20_000, True, 4, enable_kv_cache_events=True)
        blocks = pool.get_new_blocks(10_000)
        hashes = [i.to_bytes(8, "big") for i in range(10_000)]
        pool.cache_full_blocks(FakeRequest(hashes, []), blocks, 0, 10_000, 4, 0)
        pool.free_blocks(reversed(blocks))
        pool.take_events()
        del pool, blocks, hashes

    build_use_drop()  # first build: type caches, interned ints
    growth, top = traced_growth(build_use_drop)
    assert growth < GROWTH_LIMIT, f"{growth} bytes kept after the pool was dropped:\n{top}"


def test_blocks_kept_after_pool_then_dropped(BlockPool):
    def keep_then_drop():
        pool = BlockPool(5_000, True, 4)
        kept = pool.get_new_blocks(100) + [pool.blocks[4_000], pool.null_block]
        queue = pool.free_block_queue
        del pool
        gc.collect()
        assert sum(b.ref_cnt for b in kept) == 100  # still readable
        del kept, queue

    keep_then_drop()
    growth, top = traced_growth(keep_then_drop)
    assert growth < GROWTH_LIMIT, f"{growth} bytes kept:\n{top}"


def test_standalone_queue_and_map_freed(FreeKVCacheBlockQueue, BlockHashToBlockMap, KVCacheBlock):
    def build_and_drop():
        blocks = [KVCacheBlock(i) for i in range(5_000)]
        queue = FreeKVCacheBlockQueue(blocks)
        popped = queue.popleft_n(2_500)
        queue.append_n(popped[::-1])
        hash_map = BlockHashToBlockMap()
        for b in blocks[:1_000]:
            hash_map.insert(b.block_id.to_bytes(4, "big"), b)
            hash_map.insert(b"shared", b)
        for b in blocks[:500]:
            hash_map.pop(b"shared", b.block_id)
        del blocks, queue, popped, hash_map

    build_and_drop()
    growth, top = traced_growth(build_and_drop)
    assert growth < GROWTH_LIMIT, f"{growth} bytes kept:\n{top}"


def test_hash_references_released(BlockPool):
    """The pool keeps no reference to a request's hash objects once their
    blocks are evicted (the keys it stores are its own)."""
    pool = BlockPool(4, True, 4, enable_kv_cache_events=True)
    hashes = [bytes([65 + i]) * 33 for i in range(3)]  # not interned
    counts = [sys.getrefcount(h) for h in hashes]
    for _ in range(100):
        request = FakeRequest(hashes, list(range(12)))
        blocks = pool.get_new_blocks(3)
        pool.cache_full_blocks(request, blocks, 0, 3, 4, 0)
        pool.find_longest_cache_hit(hashes, [0])
        pool.get_cached_block(hashes[1], [0])
        pool.free_blocks(reversed(blocks))
        pool.evict_blocks([b.block_id for b in blocks])
        pool.take_events()
        del request, blocks
    gc.collect()
    assert [sys.getrefcount(h) for h in hashes] == counts
