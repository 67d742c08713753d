"""kvpool for vLLM 0.32: the pool API of ``vllm.v1.core`` as of vLLM 0.32.0.

``from kvpool.v0_32 import BlockPool`` gives a drop-in for vLLM 0.32.0's
``vllm.v1.core.block_pool.BlockPool``, over the core in use (as
``kvpool.v0_33``). The line is the 0.33 line minus what 0.33 added, written
down once in this package's modules, each named after the vLLM module it
mirrors:

- ``block_pool``: no lookahead hashing (``medium`` is the 6th positional
  argument); the null block's ``ref_cnt`` is counted;
- ``kv_events``: ``BlockStored`` without ``lookahead_token_ids``.

Blocks, the free queue, the hash map and the hash helpers are 0.33's (the
same in vLLM 0.32.0, but for ``generate_lookahead_block_hash_extra_keys``,
which 0.32 does not have).
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..metrics import BlockMetricsState, KVCacheEvictionEvent, KVCacheMetricsCollector
from ..v0_33 import block_class
from ..v0_33.kv_cache_utils import (
    BlockHash,
    BlockHashList,
    BlockHashListWithBlockSize,
    BlockHashWithGroupId,
    ExternalBlockHash,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    resolve_block_hashes,
    to_event_extra_keys,
)
from .block_pool import make_block_pool_class
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
    "to_event_extra_keys",
    "make_block_pool_class",
    "block_class",
]
