"""KV-cache events of the vLLM 0.22 line (mirrors ``vllm/distributed/kv_events.py``).

0.22 added ``kv_cache_spec_kind`` and ``kv_cache_spec_sliding_window`` to
``BlockStored``, after ``group_idx``, both defaulting to None (in the hash
too): the pool leaves them None, and vLLM's ``KVCacheManager.take_events``
fills them in from the group's spec -- on vLLM's own event class, which is
why inside vLLM the pool queues vLLM's events (``kvpool.vllm.events``).
``BlockRemoved`` stays 0.20's. Still tagged msgpack arrays.
"""

from __future__ import annotations

from typing import Any

from ..events import MEDIUM_GPU, AllBlocksCleared, EventBatch, KVCacheEvent
from ..v0_20.kv_events import BlockRemoved
from ..v0_20.kv_events import BlockStored as _BlockStored020

__all__ = [
    "MEDIUM_GPU",
    "EventBatch",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
]


class BlockStored(_BlockStored020):
    """Blocks entered the prefix cache (one event per ``cache_full_blocks``)."""

    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None

    def _hash_fields(self) -> tuple[Any, ...]:
        return (*super()._hash_fields(), self.kv_cache_spec_kind, self.kv_cache_spec_sliding_window)


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
