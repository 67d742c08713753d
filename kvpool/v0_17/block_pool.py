"""``BlockPool`` of the vLLM 0.17 line (mirrors ``vllm/v1/core/block_pool.py``).

The 0.15 line's facade (``kvpool.block_pool.BlockPoolMixin``) with one
change: a ``BlockStored`` event carries ``extra_keys``, per stored block
(null blocks skipped, like the hashes) the extra keys vLLM mixed into its
hash, computed at the group's ``block_size``. A list of Nones for a plain
request, None only when no block was stored -- as vLLM.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..block_pool import BlockPoolMixin as _BlockPool015
from ..block_pool import bind_facade
from .kv_cache_utils import ExtraKeysGenerator, generate_block_hash_extra_keys, has_extra_keys
from .kv_events import BlockStored

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_BlockPool015):
    """Manages a pool of KV-cache blocks: allocation, freeing, the prefix
    cache and its LRU eviction. Drop-in compatible with vLLM 0.17's
    ``vllm.v1.core.block_pool.BlockPool`` (the 0.15 pool whose
    ``BlockStored`` events carry ``extra_keys``); arguments as the 0.15
    line's."""

    _BlockStored: type = BlockStored
    #: The extra-keys generator of this line (0.19 changed it).
    _generate_extra_keys: ExtraKeysGenerator = staticmethod(generate_block_hash_extra_keys)

    def _block_stored_fields(
        self,
        request: Any,
        blocks: list[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> dict[str, Any]:
        fields = super()._block_stored_fields(
            request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id
        )
        stored = [i for i in range(num_cached_blocks, num_full_blocks) if not blocks[i].is_null]
        if not has_extra_keys(request):
            keys_list: list[Any] = [None] * len(stored)
        else:
            # The multimodal walk resumes where the previous block left it.
            generate = self._generate_extra_keys
            keys_list = []
            mm_idx = 0
            for i in stored:
                keys, mm_idx = generate(request, i * block_size, (i + 1) * block_size, mm_idx)
                keys_list.append(keys)
        fields["extra_keys"] = keys_list or None
        return fields


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.17 ``BlockPool`` facade over ``core`` (compiled or pure Python)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_17")
