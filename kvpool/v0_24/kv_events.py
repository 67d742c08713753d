"""KV-cache events of the vLLM 0.24 line (mirrors ``vllm/distributed/kv_events.py``
of vLLM 0.24.0, 0.25.0 and 0.25.1, which are byte-identical).

0.24 turned the events from msgpack arrays into tagged **maps**
(``{"type": "BlockStored", ...}``; ``array_like`` dropped from the base), so
fields equal to their default are left out (``omit_defaults``) and a
consumer tolerates fields it does not know; the batch stays an array. The
fields are 0.23's: the 0.33 line's ``locality``, ``ownership``,
``session_id`` and ``lookahead_token_ids`` do not exist yet. Field names,
order and defaults are the wire contract: do not reorder, rename or add.
"""

from __future__ import annotations

from typing import Any

from ..events import EventBatch
from ..hashing import ExternalBlockHash

# The tagged-map base and the field-less event are 0.33's already.
from ..v0_33.kv_events import AllBlocksCleared, KVCacheEvent

__all__ = [
    "MEDIUM_GPU",
    "EventBatch",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
]

MEDIUM_GPU = "GPU"  # the only medium before 0.26


class BlockStored(KVCacheEvent):
    """Blocks entered the prefix cache (one event per ``cache_full_blocks``)."""

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

    def _hash_fields(self) -> tuple[Any, ...]:
        # vLLM's fields (lora_name excluded), so that events counted across
        # workers by hash (vLLM's KVEventAggregator) collapse the same way.
        return (
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
        )

    def __hash__(self) -> int:
        return hash(self._hash_fields())


class BlockRemoved(KVCacheEvent):
    """A hash key left the prefix cache (one event per key)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None

    def _hash_fields(self) -> tuple[Any, ...]:
        return (tuple(self.block_hashes), self.medium, self.group_idx)

    def __hash__(self) -> int:
        return hash(self._hash_fields())


class KVEventBatch(EventBatch):
    """What a publisher sends: a timestamp and the events (msgpack array)."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
