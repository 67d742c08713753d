"""KV-cache events of vLLM 0.30-0.32 (mirrors ``vllm/distributed/kv_events.py``).

The 0.33 line's events (``kvpool.v0_33.kv_events``) but for ``BlockStored``,
which has no ``lookahead_token_ids`` before 0.33 (0.30 added ``session_id``;
the 0.31 changes to this module are in the publisher only). The byte-for-byte
contract with these releases is the field names, their order and their
defaults: do not reorder, rename or add.
"""

from __future__ import annotations

from typing import Any

from ..hashing import ExternalBlockHash
from ..v0_33.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    BlockRemoved,
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
    # Per block: its untagged extra keys (see kv_cache_utils.to_event_extra_keys).
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None  # LOCAL or REMOTE relative to the publisher
    ownership: str | None = None  # a secondary offloading tier's id
    session_id: str | None = None  # the session whose request stored or reused

    def __hash__(self) -> int:
        # Events are counted across workers (vLLM's KVEventAggregator).
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
                self.ownership,
                self.session_id,
            )
        )


class KVEventBatch(EventBatch):
    """What a publisher sends: a timestamp and the events (msgpack array)."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
