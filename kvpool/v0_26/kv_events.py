"""KV-cache events of vLLM 0.26 (mirrors ``vllm/distributed/kv_events.py`` of
vLLM 0.26.0).

The 0.27/0.28 events (``kvpool.v0_28.kv_events``; the structs are the same)
but for the media: 0.26 names ``FS`` and ``OBJ`` where 0.27 has
``STORAGE``.
"""

from __future__ import annotations

from ..v0_28.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
)

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

MEDIUM_FS = "FS"
MEDIUM_OBJ = "OBJ"
