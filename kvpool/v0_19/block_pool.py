"""``BlockPool`` of the vLLM 0.19 line (mirrors ``vllm/v1/core/block_pool.py``).

``block_pool.py`` is 0.18's (= 0.17's); what the pool emits changed through
``kv_cache_utils``: the multimodal extra keys in ``BlockStored`` events
(``kvpool.v0_19.kv_cache_utils``). 0.19 also added the SimpleCPUOffload
connector, which stamps a hash on a CPU block straight after
``get_new_blocks`` (``block._block_hash = key``) and caches it later
(``cached_block_hash_to_block.insert``); kvpool's blocks accept that write
on a block without a hash, as ``block_hash`` does, and refuse it on a block
that has one (it could be cached under that key: relabelling it would leave
the map serving it under a key it no longer carries).
"""

from __future__ import annotations

from types import ModuleType

from ..block_pool import bind_facade
from ..v0_17.block_pool import BlockPoolMixin as _BlockPool017
from ..v0_17.kv_cache_utils import ExtraKeysGenerator
from .kv_cache_utils import generate_block_hash_extra_keys

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_BlockPool017):
    """Manages a pool of KV-cache blocks: allocation, freeing, the prefix
    cache and its LRU eviction. Drop-in compatible with vLLM 0.19's
    ``vllm.v1.core.block_pool.BlockPool``; arguments as the 0.15 line's."""

    _generate_extra_keys: ExtraKeysGenerator = staticmethod(generate_block_hash_extra_keys)


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.19 ``BlockPool`` facade over ``core`` (compiled or pure Python)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_19")
