"""KV-cache events of the vLLM 0.33 line (mirrors ``vllm/distributed/kv_events.py``).

Since 0.24 the events are tagged msgpack **maps** (``{"type": "BlockStored",
...}``) rather than arrays, and fields equal to their default are left out
(``omit_defaults``), so consumers tolerate new optional fields; the batch is
still an array. The byte-for-byte contract with vLLM 0.33.0 is the field
names, their order and their defaults: do not reorder, rename or add.
``gc=False``: an event holds only ints, bytes, strings and lists of them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..events import EventBatch
from ..hashing import ExternalBlockHash

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

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


class KVCacheEvent(
    msgspec.Struct,
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
    tag=True,
):
    """Base class of all KV-cache events (a map tagged with the class name)."""


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
    # Per block: the tokens after it that its hash covers (lookahead hashing).
    lookahead_token_ids: list[list[int]] | None = None

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
                tuple(map(tuple, self.lookahead_token_ids))
                if self.lookahead_token_ids is not None
                else None,
            )
        )


class BlockRemoved(KVCacheEvent):
    """A hash key left the prefix cache (one event per key)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None

    def __hash__(self) -> int:
        return hash(
            (tuple(self.block_hashes), self.medium, self.group_idx, self.locality, self.ownership)
        )


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""


class KVEventBatch(EventBatch):
    """What a publisher sends: a timestamp and the events (msgpack array)."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
