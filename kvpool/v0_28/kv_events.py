"""KV-cache events of vLLM 0.27 and 0.28 (mirrors ``vllm/distributed/kv_events.py``
of vLLM 0.27.0, 0.27.1 and 0.28.0, which are byte-identical).

The 0.29 events (``kvpool.v0_29.kv_events``) without ``ownership``, which
0.29 added to ``BlockStored`` and ``BlockRemoved``. ``locality`` (0.26) is
a default the pool never sets, so a pool's events encode to the same bytes
as the 0.24 line's. The byte-for-byte contract with these releases is the
field names, their order and their defaults: do not reorder, rename or add.
"""

from __future__ import annotations

from typing import Any

from ..hashing import ExternalBlockHash
from ..v0_29.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    EventBatch,
    KVCacheEvent,
)

__all__ = [
    "MEDIUM_GPU",
    "MEDIUM_CPU",
    "MEDIUM_STORAGE",
    "EventBatch",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
]


class BlockStored(KVCacheEvent):
    """Blocks entered the prefix cache, or were reused from it."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # deprecated upstream in favour of lora_name; kept for the wire
    medium: str | None
    lora_name: str | None
    # Per block: its extra keys (LoRA name, multimodal items, cache salt, ...).
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    # Written by the manager (vLLM's KVCacheManager.take_events), not the pool.
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None  # LOCAL or REMOTE relative to the publisher

    def __hash__(self) -> int:
        # vLLM's fields (lora_name excluded): events counted across workers
        # by hash (vLLM's KVEventAggregator) collapse the same way.
        return hash(
            (
                tuple(self.block_hashes),
                self.parent_block_hash,
                tuple(self.token_ids),
                self.block_size,
                self.lora_id,
                self.medium,
                tuple(self.extra_keys) if self.extra_keys else None,
                self.group_idx,
                self.kv_cache_spec_kind,
                self.kv_cache_spec_sliding_window,
                self.locality,
            )
        )


class BlockRemoved(KVCacheEvent):
    """A hash key left the prefix cache (one event per key)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.medium, self.group_idx, self.locality))


class KVEventBatch(EventBatch):
    """What a publisher sends: a timestamp and the events (msgpack array)."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
