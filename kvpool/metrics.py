"""Sampled block-residency metrics (vLLM 0.15.1 ``kv_cache_metrics``).

Only a ``sample_rate`` fraction of allocated blocks is followed, because
following every block would cost more than the pool itself. This module is
pure Python on purpose: the pool calls it only when a collector was given, so
an engine that does not collect pays nothing on its hot paths.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["BlockMetricsState", "KVCacheEvictionEvent", "KVCacheMetricsCollector"]

_ACCESS_HISTORY = 4  # bounded, so a hot block cannot grow its history forever


@dataclass
class KVCacheEvictionEvent:
    """One sampled block's life, reported when its hash is evicted."""

    lifetime_seconds: float
    idle_seconds: float
    reuse_gaps_seconds: tuple[float, ...]


class BlockMetricsState:
    """Birth, last access and the last few access times of one sampled block."""

    def __init__(self) -> None:
        now_ns = time.monotonic_ns()
        self.birth_time_ns = now_ns
        self.last_access_ns = now_ns
        self.access_history: deque[int] = deque(maxlen=_ACCESS_HISTORY)

    def record_access(self) -> None:
        now_ns = time.monotonic_ns()
        self.last_access_ns = now_ns
        self.access_history.append(now_ns)

    def get_lifetime_seconds(self) -> float:
        return (time.monotonic_ns() - self.birth_time_ns) / 1e9

    def get_idle_time_seconds(self) -> float:
        return (time.monotonic_ns() - self.last_access_ns) / 1e9

    def get_reuse_gaps_seconds(self) -> list[float]:
        history = list(self.access_history)
        return [(b - a) / 1e9 for a, b in zip(history, history[1:])]


class KVCacheMetricsCollector:
    """Collects residency metrics for a random sample of blocks.

    ``sample_rate`` must satisfy ``0 < sample_rate <= 1``.
    """

    def __init__(self, sample_rate: float = 0.01) -> None:
        if not (0 < sample_rate <= 1.0):
            raise ValueError(f"sample_rate must be in (0, 1.0], got {sample_rate}")
        self.sample_rate = sample_rate
        self.block_metrics: dict[int, BlockMetricsState] = {}
        self._eviction_events: list[KVCacheEvictionEvent] = []

    def should_sample_block(self) -> bool:
        return random.random() < self.sample_rate

    def on_block_allocated(self, block: Any) -> None:
        if self.should_sample_block():
            self.block_metrics[block.block_id] = BlockMetricsState()

    def on_block_accessed(self, block: Any) -> None:
        metrics = self.block_metrics.get(block.block_id)
        if metrics:
            metrics.record_access()

    def on_block_evicted(self, block: Any) -> None:
        metrics = self.block_metrics.pop(block.block_id, None)
        if not metrics:
            return
        self._eviction_events.append(
            KVCacheEvictionEvent(
                lifetime_seconds=metrics.get_lifetime_seconds(),
                idle_seconds=metrics.get_idle_time_seconds(),
                reuse_gaps_seconds=tuple(metrics.get_reuse_gaps_seconds()),
            )
        )

    def reset(self) -> None:
        """Forget every sampled block and pending event (prefix-cache reset)."""
        self.block_metrics.clear()
        self._eviction_events.clear()

    def drain_events(self) -> list[KVCacheEvictionEvent]:
        """Return the eviction events collected so far and start a new list."""
        events = self._eviction_events
        self._eviction_events = []
        return events
