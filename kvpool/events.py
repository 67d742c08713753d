"""KV-cache events, wire-compatible with vLLM 0.15.1.

The structs are ``msgspec`` arrays with a type tag, so a ``KVEventBatch``
encoded with msgpack is byte-identical to the one vLLM publishes and KV-aware
routers decode it unchanged. Field order is therefore part of the contract:
do not reorder, rename or add fields. ``gc=False`` because an event holds only
ints, bytes, strings and lists of them: it can never be part of a cycle.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .hashing import ExternalBlockHash

__all__ = [
    "MEDIUM_GPU",
    "EventBatch",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
]

MEDIUM_GPU = "GPU"


class EventBatch(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
    tag=True,
):
    """Base class of all KV-cache events (tagged with the class name)."""


class BlockStored(KVCacheEvent):
    """Blocks entered the prefix cache (one event per ``cache_full_blocks``)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # deprecated upstream in favour of lora_name; kept for the wire
    medium: str | None
    lora_name: str | None

    def __hash__(self) -> int:
        # Same fields as vLLM (lora_name excluded), so events aggregated across
        # workers by hash collapse the same way.
        return hash(
            (
                tuple(self.block_hashes),
                self.parent_block_hash,
                tuple(self.token_ids),
                self.block_size,
                self.lora_id,
                self.medium,
            )
        )


class BlockRemoved(KVCacheEvent):
    """A block's hash left the prefix cache (eviction)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.medium))


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
