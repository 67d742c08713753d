"""BlockPool: allocation, prefix-cache hits, caching, construction. One call
of a benchmarked function handles 256 blocks (construction excepted)."""

from __future__ import annotations

import pytest

from kvpool import bench

CONSTRUCT_BLOCKS = 100_000  # python -m kvpool.bench measures 1,000,000 in a subprocess


@pytest.mark.benchmark(group="pool: get_new_blocks(256) + free_blocks")
def test_get_new_blocks_free_blocks(benchmark, core, BlockPool):
    benchmark(bench.NewAndFree(core, BlockPool).step)


@pytest.mark.benchmark(group="pool: prefix hit on 256 blocks, per-block API")
def test_prefix_hit_per_block(benchmark, core, BlockPool):
    benchmark(bench.PrefixHitPerBlock(core, BlockPool).step)


@pytest.mark.benchmark(group="pool: prefix hit on 256 blocks, bulk API")
def test_prefix_hit_bulk(benchmark, core, BlockPool):
    benchmark(bench.PrefixHitBulk(core, BlockPool).step)


@pytest.mark.benchmark(group="pool: cache_full_blocks cycle (256, with eviction)")
def test_cache_full_blocks_cycle(benchmark, core, BlockPool):
    benchmark(bench.CacheFullCycle(core, BlockPool).step)


@pytest.mark.benchmark(group=f"pool: BlockPool({CONSTRUCT_BLOCKS:_}, True, 16)")
def test_construct(benchmark, core, BlockPool):
    benchmark.pedantic(BlockPool, args=(CONSTRUCT_BLOCKS, True, bench.BLOCK_SIZE),
                       rounds=5, iterations=1, warmup_rounds=1)
