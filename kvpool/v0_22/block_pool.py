"""``BlockPool`` of the vLLM 0.22 line (0.22.0, 0.22.1; mirrors
``vllm/v1/core/block_pool.py``).

The 0.20 facade plus ``cache_full_blocks(..., block_mask=None)``: blocks
whose mask entry is false are skipped like null blocks (no hash, no map
entry, no place in the event's hashes and extra keys), so that a group that
only ever hits on some blocks (a sliding window's tail) keeps the others out
of the prefix cache. Without a mask the call is the core's, unchanged. 0.22's
coordinator builds the pool with keywords, which the 0.15 line's signature
already takes.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..block_pool import bind_facade
from ..v0_20.block_pool import BlockPoolMixin as _BlockPool020
from .kv_events import BlockStored

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_BlockPool020):
    """Manages a pool of KV-cache blocks: allocation, freeing, the prefix
    cache and its LRU eviction. Drop-in compatible with vLLM 0.22's
    ``vllm.v1.core.block_pool.BlockPool``; arguments as the 0.15 line's."""

    _BlockStored: type = BlockStored

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: list[bool] | None = None,
    ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` under the
        request's block hashes for ``kv_cache_group_id``, skipping null
        blocks and those whose ``block_mask`` entry (aligned with that
        slice) is false. With events on, queues one ``BlockStored``."""
        if block_mask is None:
            return super().cache_full_blocks(
                request, blocks, num_cached_blocks, num_full_blocks, block_size,
                kv_cache_group_id,
            )
        if num_cached_blocks >= num_full_blocks:
            return None
        new_blocks = blocks[num_cached_blocks:num_full_blocks]
        if len(block_mask) != len(new_blocks):
            raise ValueError(
                f"block_mask has {len(block_mask)} entries for {len(new_blocks)} blocks"
            )
        # A masked-out block is handed on as the null block, which caching
        # and the event's hashes and extra keys skip.
        null_block = self.null_block
        masked = [*blocks[:num_cached_blocks]]
        masked.extend([b if keep else null_block for b, keep in zip(new_blocks, block_mask)])
        return self._cache_full_blocks_py(
            request, masked, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id
        )


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.22 ``BlockPool`` facade over ``core`` (compiled or pure Python)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_22")
