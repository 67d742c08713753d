"""Sampled block-residency metrics and the pool's collector hooks.

A fake clock replaces ``time.monotonic_ns`` inside ``kvpool.metrics`` so the
durations are exact numbers; nothing here measures real time.
"""

from __future__ import annotations

import types

import pytest

import kvpool.metrics
from kvpool import BlockMetricsState, KVCacheEvictionEvent, KVCacheMetricsCollector

from _helpers import FakeRequest, check_invariants, make_hashes


class FakeClock:
    def __init__(self) -> None:
        self.now_ns = 1_000_000_000

    def monotonic_ns(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1e9)


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(
        kvpool.metrics, "time", types.SimpleNamespace(monotonic_ns=fake.monotonic_ns)
    )
    return fake


class RecordingCollector(KVCacheMetricsCollector):
    """Records every hook call as (hook, block_id)."""

    def __init__(self) -> None:
        super().__init__(sample_rate=1.0)
        self.calls: list[tuple[str, int]] = []

    def on_block_allocated(self, block):
        self.calls.append(("allocated", block.block_id))
        super().on_block_allocated(block)

    def on_block_accessed(self, block):
        self.calls.append(("accessed", block.block_id))
        super().on_block_accessed(block)

    def on_block_evicted(self, block):
        self.calls.append(("evicted", block.block_id))
        super().on_block_evicted(block)

    def reset(self):
        self.calls.append(("reset", -1))
        super().reset()

    def take(self):
        calls, self.calls = self.calls, []
        return calls


# ---------------------------------------------------------------------------
# The collector alone


@pytest.mark.parametrize("rate", [0, -0.5, 1.5, 2])
def test_bad_sample_rate(rate):
    with pytest.raises(ValueError):
        KVCacheMetricsCollector(sample_rate=rate)


def test_default_sample_rate():
    assert KVCacheMetricsCollector().sample_rate == 0.01


def test_sample_rate_one_samples_everything():
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    assert all(collector.should_sample_block() for _ in range(1000))


def test_block_metrics_state(clock):
    state = BlockMetricsState()
    assert state.birth_time_ns == state.last_access_ns == clock.now_ns
    assert list(state.access_history) == []
    clock.advance(1)
    state.record_access()
    clock.advance(2)
    state.record_access()
    clock.advance(0.5)
    assert state.get_lifetime_seconds() == 3.5
    assert state.get_idle_time_seconds() == 0.5
    assert state.get_reuse_gaps_seconds() == [2.0]


def test_access_history_is_bounded(clock):
    state = BlockMetricsState()
    for _ in range(10):
        clock.advance(1)
        state.record_access()
    assert len(state.access_history) == 4
    assert state.get_reuse_gaps_seconds() == [1.0, 1.0, 1.0]


def test_collector_lifecycle(clock, KVCacheBlock):
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    b = KVCacheBlock(3)
    collector.on_block_allocated(b)
    assert set(collector.block_metrics) == {3}
    clock.advance(1)
    collector.on_block_accessed(b)
    clock.advance(3)
    collector.on_block_accessed(b)
    clock.advance(2)
    collector.on_block_evicted(b)
    assert collector.block_metrics == {}
    assert collector.drain_events() == [
        KVCacheEvictionEvent(lifetime_seconds=6.0, idle_seconds=2.0, reuse_gaps_seconds=(3.0,))
    ]
    assert collector.drain_events() == []
    # Unsampled blocks are ignored.
    collector.on_block_accessed(KVCacheBlock(9))
    collector.on_block_evicted(KVCacheBlock(9))
    assert collector.drain_events() == []


def test_collector_reset(KVCacheBlock):
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    for i in range(3):
        collector.on_block_allocated(KVCacheBlock(i))
    collector.on_block_evicted(KVCacheBlock(0))
    collector.reset()
    assert collector.block_metrics == {}
    assert collector.drain_events() == []


# ---------------------------------------------------------------------------
# The pool's hooks


def test_hooks_get_new_blocks_with_caching(BlockPool):
    collector = RecordingCollector()
    pool = BlockPool(5, True, 16, metrics_collector=collector)
    pool.get_new_blocks(2)
    # Each popped block is first evicted (its old metrics closed), then allocated.
    assert collector.take() == [
        ("evicted", 1),
        ("allocated", 1),
        ("evicted", 2),
        ("allocated", 2),
    ]
    assert set(collector.block_metrics) == {1, 2}


def test_hooks_get_new_blocks_without_caching(BlockPool):
    collector = RecordingCollector()
    pool = BlockPool(5, False, 16, metrics_collector=collector)
    pool.get_new_blocks(2)
    assert collector.take() == [("allocated", 1), ("allocated", 2)]


def test_hooks_touch_and_free(BlockPool):
    collector = RecordingCollector()
    pool = BlockPool(5, True, 16, metrics_collector=collector)
    blocks = pool.get_new_blocks(2)
    collector.take()
    pool.touch([blocks[1], pool.null_block, blocks[0]])
    assert collector.take() == [("accessed", 2), ("accessed", 0), ("accessed", 1)]
    pool.free_blocks(blocks)
    assert collector.take() == []


def test_hooks_evict_blocks_and_maybe_evict(BlockPool):
    collector = RecordingCollector()
    pool = BlockPool(5, True, 16, metrics_collector=collector)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(make_hashes(2)), blocks, 0, 2, 16, 0)
    collector.take()
    pool.evict_blocks([2, 4])
    assert collector.take() == [("evicted", 2), ("evicted", 4)]
    assert pool._maybe_evict_cached_block(blocks[0]) is True
    assert collector.take() == [("evicted", 1)]
    # Even a block with no hash reports the eviction (the metrics close).
    assert pool._maybe_evict_cached_block(blocks[0]) is False
    assert collector.take() == [("evicted", 1)]


def test_hooks_reset_prefix_cache(BlockPool):
    collector = RecordingCollector()
    pool = BlockPool(4, True, 16, metrics_collector=collector)
    blocks = pool.get_new_blocks(1)
    collector.take()
    assert pool.reset_prefix_cache() is False
    assert collector.take() == []
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert collector.take() == [("reset", -1)]
    assert collector.block_metrics == {}


def test_pool_metrics_end_to_end(BlockPool, clock):
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool = BlockPool(4, True, 16, metrics_collector=collector)
    hashes = make_hashes(2)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 2, 16, 0)
    pool.free_blocks(reversed(blocks))
    clock.advance(1)
    hit = [pool.get_cached_block(h, [0])[0] for h in hashes]
    pool.touch(hit)
    clock.advance(2)
    pool.touch(hit[:1])
    pool.free_blocks([hit[0]])
    pool.free_blocks(reversed(hit))
    clock.advance(4)
    # Reallocation evicts the cached blocks: their lives are reported.
    assert [b.block_id for b in pool.get_new_blocks(3)] == [3, 2, 1]
    events = collector.drain_events()
    assert events == [
        KVCacheEvictionEvent(lifetime_seconds=7.0, idle_seconds=6.0, reuse_gaps_seconds=()),
        KVCacheEvictionEvent(lifetime_seconds=7.0, idle_seconds=4.0, reuse_gaps_seconds=(2.0,)),
    ]
    assert set(collector.block_metrics) == {1, 2, 3}
    check_invariants(pool)


def test_no_collector_means_no_hooks(BlockPool):
    pool = BlockPool(4, True, 16)
    blocks = pool.get_new_blocks(2)
    pool.touch(blocks)
    pool.free_blocks(blocks)
    pool.evict_blocks([1])
    assert pool.metrics_collector is None


def test_touch_with_an_iterator_reports_every_block(BlockPool):
    collector = kvpool.KVCacheMetricsCollector(sample_rate=1.0)
    pool = BlockPool(6, True, 16, metrics_collector=collector)
    blocks = pool.get_new_blocks(3)
    accessed = []
    collector.on_block_accessed = lambda block: accessed.append(block.block_id)
    pool.touch(iter(blocks))
    assert accessed == [b.block_id for b in blocks]
    assert [b.ref_cnt for b in blocks] == [2, 2, 2]
