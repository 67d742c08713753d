"""kvpool for vLLM 0.33: the pool API of ``vllm.v1.core`` as of vLLM 0.33.0.

``from kvpool.v0_33 import BlockPool`` gives a drop-in for vLLM 0.33.0's
``vllm.v1.core.block_pool.BlockPool``, over the same core as the 0.15 line
(``import kvpool``): the compiled one unless ``KVPOOL_NO_EXTENSIONS`` is set
or it is not built (``kvpool.USING_EXTENSION`` tells). What differs from the
0.15 line is written down once, in this package's modules, each named after
the vLLM module it mirrors:

- ``block_pool``: partial-block entries and several keys per block, 0.33's
  free order (uncached blocks to the front), cross-pool frees, reuse
  watchers, ``block_mask``, lookahead hashing, the ``medium`` argument;
- ``kv_events``: events as tagged msgpack maps with 0.33's fields;
- ``kv_cache_utils``: the last-sub-hash ``BlockHashListWithBlockSize``,
  ``resolve_block_hashes`` and the events' extra keys.
"""

from __future__ import annotations

from types import ModuleType

from .. import CORE as _CORE
from ..metrics import BlockMetricsState, KVCacheEvictionEvent, KVCacheMetricsCollector
from .block_pool import make_block_pool_class
from .kv_cache_utils import (
    BlockHash,
    BlockHashList,
    BlockHashListWithBlockSize,
    BlockHashWithGroupId,
    ExternalBlockHash,
    generate_block_hash_extra_keys,
    generate_lookahead_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    resolve_block_hashes,
    to_event_extra_keys,
)
from .kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
)


def block_class(core: ModuleType) -> type:
    """The 0.33 block class of ``core`` (``kvpool._core`` or ``kvpool._core_py``)."""
    return core.KVCacheBlock33


KVCacheBlock = _CORE.KVCacheBlock33
FreeKVCacheBlockQueue = _CORE.FreeKVCacheBlockQueue
BlockHashToBlockMap = _CORE.BlockHashToBlockMap
BlockPool = make_block_pool_class(_CORE)

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
    "EventBatch",
    "KVEventBatch",
    "MEDIUM_GPU",
    "MEDIUM_CPU",
    "MEDIUM_STORAGE",
    "BlockHash",
    "BlockHashWithGroupId",
    "ExternalBlockHash",
    "BlockHashList",
    "make_block_hash_with_group_id",
    "get_block_hash",
    "get_group_id",
    "maybe_convert_block_hash",
    "BlockHashListWithBlockSize",
    "resolve_block_hashes",
    "generate_block_hash_extra_keys",
    "generate_lookahead_block_hash_extra_keys",
    "to_event_extra_keys",
    "make_block_pool_class",
    "block_class",
]
