"""``BlockPool`` of the vLLM 0.20 line (0.20.0 … 0.21.0; mirrors
``vllm/v1/core/block_pool.py``).

The 0.19 facade whose events name their KV-cache group: ``BlockStored``
carries the ``kv_cache_group_id`` it was cached for, each ``BlockRemoved``
the group of the evicted key (its last four bytes), as ``group_idx``. 0.20
also lets the engine choose ``hash_block_size`` as the GCD of the groups'
block sizes (``resolve_kv_cache_block_sizes``); the pool already caches any
multiple of it, and its coarse-block view (``BlockHashListWithBlockSize``,
rewritten with ``bytes.join`` in 0.20) yields the same concatenated hashes.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..block_pool import bind_facade
from ..hashing import _use_int_block_hashes
from ..v0_19.block_pool import BlockPoolMixin as _BlockPool019
from .kv_events import MEDIUM_GPU, BlockRemoved, BlockStored

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_BlockPool019):
    """Manages a pool of KV-cache blocks: allocation, freeing, the prefix
    cache and its LRU eviction. Drop-in compatible with vLLM 0.20's and
    0.21's ``vllm.v1.core.block_pool.BlockPool``; arguments as the 0.15
    line's."""

    _BlockStored: type = BlockStored
    _BlockRemoved: type = BlockRemoved

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
        fields["group_idx"] = kv_cache_group_id
        return fields

    def _block_removed_events(self, keys: list[bytes]) -> list[Any]:
        return self._removed_events(
            self._BlockRemoved, keys, MEDIUM_GPU, True, _use_int_block_hashes()
        )


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.20 ``BlockPool`` facade over ``core`` (compiled or pure Python)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_20")
