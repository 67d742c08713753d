"""KV-cache events of the vLLM 0.20 line (mirrors ``vllm/distributed/kv_events.py``).

0.20 added ``group_idx`` (the KV-cache group of the blocks) to
``BlockStored``, after ``extra_keys``, and to ``BlockRemoved``, after
``medium``, both defaulting to None and both in the events' hash. Still
tagged msgpack arrays; ``AllBlocksCleared`` is unchanged.
"""

from __future__ import annotations

from typing import Any

from ..events import MEDIUM_GPU, AllBlocksCleared, EventBatch, KVCacheEvent
from ..hashing import ExternalBlockHash
from ..v0_17.kv_events import BlockStored as _BlockStored017

__all__ = [
    "MEDIUM_GPU",
    "EventBatch",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
]


class BlockStored(_BlockStored017):
    """Blocks entered the prefix cache (one event per ``cache_full_blocks``)."""

    group_idx: int | None = None

    def _hash_fields(self) -> tuple[Any, ...]:
        return (*super()._hash_fields(), self.group_idx)


class BlockRemoved(KVCacheEvent):
    """A block's hash left the prefix cache (eviction)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.medium, self.group_idx))


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
