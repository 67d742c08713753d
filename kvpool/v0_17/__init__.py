"""kvpool for vLLM 0.17 (0.17.0, 0.17.1): the pool API of ``vllm.v1.core``
as of those releases, a small delta over the 0.15 line (``import kvpool``),
over the same core. What 0.17 changed, pool-wise, is written down once, in
this package's modules, each named after the vLLM module it mirrors:

- ``kv_events``: ``BlockStored.extra_keys``;
- ``kv_cache_utils``: the extra keys of a block (kvpool's generator);
- ``block_pool``: the events carry them.

Blocks, the free queue and the hash map are the 0.15 line's.
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..hashing import (
    BlockHash,
    BlockHashListWithBlockSize,
    BlockHashWithGroupId,
    ExternalBlockHash,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from ..metrics import BlockMetricsState, KVCacheEvictionEvent, KVCacheMetricsCollector
from .block_pool import BlockPoolMixin, make_block_pool_class
from .kv_cache_utils import generate_block_hash_extra_keys
from .kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
)

KVCacheBlock = _CORE.KVCacheBlock
FreeKVCacheBlockQueue = _CORE.FreeKVCacheBlockQueue
BlockHashToBlockMap = _CORE.BlockHashToBlockMap
BlockPool = make_block_pool_class(_CORE)

__all__ = [
    "KVCacheBlock",
    "FreeKVCacheBlockQueue",
    "BlockHashToBlockMap",
    "BlockPool",
    "BlockPoolMixin",
    "make_block_pool_class",
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
    "BlockHash",
    "BlockHashWithGroupId",
    "ExternalBlockHash",
    "make_block_hash_with_group_id",
    "get_block_hash",
    "get_group_id",
    "maybe_convert_block_hash",
    "BlockHashListWithBlockSize",
    "generate_block_hash_extra_keys",
]
