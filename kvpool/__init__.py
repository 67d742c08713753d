"""kvpool: a C-accelerated, drop-in replacement for vLLM 0.15.1's ``BlockPool``.

The block bookkeeping comes from the compiled core ``kvpool._core`` unless the
environment variable ``KVPOOL_NO_EXTENSIONS`` is set (to anything but an empty
string) or the extension is not built; then from its pure-Python twin
``kvpool._core_py``. The choice is made once, here, at import;
``kvpool.USING_EXTENSION`` tells which one was taken.
"""

from __future__ import annotations

import os as _os

from . import _core_py
from .block_pool import make_block_pool_class
from .events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
)
from .hashing import (
    BlockHash,
    BlockHashListWithBlockSize,
    BlockHashWithGroupId,
    ExternalBlockHash,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from .metrics import BlockMetricsState, KVCacheEvictionEvent, KVCacheMetricsCollector

__version__ = "0.1.0"

NO_EXTENSIONS: bool = bool(_os.environ.get("KVPOOL_NO_EXTENSIONS"))

if NO_EXTENSIONS:
    _core = _core_py
else:
    # `_core` must not be bound in this namespace before the import: a
    # package attribute of that name would shadow the submodule.
    try:
        from . import _core
    except ImportError:  # not built: fall back to the twin
        _core = _core_py

USING_EXTENSION: bool = _core is not _core_py
CORE = _core  # the core module in use

KVCacheBlock = _core.KVCacheBlock
FreeKVCacheBlockQueue = _core.FreeKVCacheBlockQueue
BlockHashToBlockMap = _core.BlockHashToBlockMap
BlockPool = make_block_pool_class(_core)

__all__ = [
    "KVCacheBlock",
    "FreeKVCacheBlockQueue",
    "BlockHashToBlockMap",
    "BlockPool",
    "KVCacheMetricsCollector",
    "BlockMetricsState",
    "KVCacheEvictionEvent",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
    "MEDIUM_GPU",
    "BlockHash",
    "BlockHashWithGroupId",
    "ExternalBlockHash",
    "make_block_hash_with_group_id",
    "get_block_hash",
    "get_group_id",
    "maybe_convert_block_hash",
    "BlockHashListWithBlockSize",
    "make_block_pool_class",
    "USING_EXTENSION",
    "CORE",
]
