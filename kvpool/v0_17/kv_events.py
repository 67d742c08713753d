"""KV-cache events of the vLLM 0.17 line (mirrors ``vllm/distributed/kv_events.py``).

0.17 added one field to ``BlockStored``: ``extra_keys``, per stored block the
extra keys its hash covered (LoRA name, multimodal identifiers, cache salt,
prompt-embeds digest) or None, so that consumers can recompute the hashes.
It is appended after ``lora_name`` with a default; the events are still
tagged msgpack **arrays** (``array_like``, which encodes every field, so the
default is on the wire too). ``BlockRemoved`` and ``AllBlocksCleared`` are
the 0.15 line's classes, unchanged.
"""

from __future__ import annotations

from typing import Any

from ..events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    EventBatch,
    KVCacheEvent,
)
from ..hashing import ExternalBlockHash

__all__ = [
    "MEDIUM_GPU",
    "EventBatch",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
]


class BlockStored(KVCacheEvent):
    """Blocks entered the prefix cache (one event per ``cache_full_blocks``)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # deprecated upstream in favour of lora_name; kept for the wire
    medium: str | None
    lora_name: str | None
    # Per stored block: the extra keys its hash covered, or None.
    extra_keys: list[tuple[Any, ...] | None] | None = None

    def __hash__(self) -> int:
        return hash(self._hash_fields())

    def _hash_fields(self) -> tuple[Any, ...]:
        # vLLM's fields (lora_name excluded), for KVEventAggregator's counts;
        # a later line's event appends its new fields.
        return (
            tuple(self.block_hashes),
            self.parent_block_hash,
            tuple(self.token_ids),
            self.block_size,
            self.lora_id,
            self.medium,
            tuple(self.extra_keys) if self.extra_keys else None,
        )


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
