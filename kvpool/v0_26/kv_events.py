"""KV-cache events of the vLLM 0.26 line (mirrors ``vllm/distributed/kv_events.py``
of vLLM 0.26.0).

Over the 0.24 line's events: ``locality`` (``LOCAL`` or ``REMOTE`` relative
to the publisher) at the end of ``BlockStored`` and ``BlockRemoved`` -- a
default the pool never sets, so the bytes a pool's events encode to do not
change -- and the media ``CPU``, ``FS`` and ``OBJ`` besides ``GPU`` (0.27
replaced ``FS``/``OBJ`` by ``STORAGE``).
"""

from __future__ import annotations

from typing import Any

from ..v0_24 import kv_events as _v024
from ..v0_24.kv_events import MEDIUM_GPU, AllBlocksCleared, EventBatch, KVCacheEvent

__all__ = [
    "MEDIUM_GPU",
    "MEDIUM_CPU",
    "MEDIUM_FS",
    "MEDIUM_OBJ",
    "EventBatch",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
]

MEDIUM_CPU = "CPU"
MEDIUM_FS = "FS"
MEDIUM_OBJ = "OBJ"


class BlockStored(_v024.BlockStored):
    """Blocks entered the prefix cache, or were reused from it."""

    locality: str | None = None  # LOCAL or REMOTE relative to the publisher

    def _hash_fields(self) -> tuple[Any, ...]:
        return (*super()._hash_fields(), self.locality)

    __hash__ = _v024.BlockStored.__hash__


class BlockRemoved(_v024.BlockRemoved):
    """A hash key left the prefix cache (one event per key)."""

    locality: str | None = None

    def _hash_fields(self) -> tuple[Any, ...]:
        return (*super()._hash_fields(), self.locality)

    __hash__ = _v024.BlockRemoved.__hash__


class KVEventBatch(EventBatch):
    """What a publisher sends: a timestamp and the events (msgpack array)."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
