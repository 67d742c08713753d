"""KV-cache events of the vLLM 0.27 and 0.28 lines (mirrors
``vllm/distributed/kv_events.py`` of vLLM 0.27.0, 0.27.1 and 0.28.0, which
are byte-identical).

The 0.26 line's structs; the media ``FS`` and ``OBJ`` became ``STORAGE``.
"""

from __future__ import annotations

from ..v0_26.kv_events import (
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
    "MEDIUM_STORAGE",
    "EventBatch",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
]

MEDIUM_STORAGE = "STORAGE"
