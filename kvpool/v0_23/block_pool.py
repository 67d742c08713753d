"""``BlockPool`` of the vLLM 0.23 line (0.23.0; mirrors ``vllm/v1/core/block_pool.py``).

The 0.22 facade plus ``free_blocks(ordered_blocks, prepend=False)``: with
``prepend`` the blocks that reach ``ref_cnt == 0`` go to the **front** of the
free queue, in the given order, so that they are the next ones allocated
(vLLM frees a request's uncached scratch blocks this way, keeping cached
blocks longer). The free queue's ``prepend_n`` is the core's, shared by all
lines. Without ``prepend`` the call is the core's, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any

from ..block_pool import bind_facade
from ..v0_22.block_pool import BlockPoolMixin as _BlockPool022

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_BlockPool022):
    """Manages a pool of KV-cache blocks: allocation, freeing, the prefix
    cache and its LRU eviction. Drop-in compatible with vLLM 0.23.0's
    ``vllm.v1.core.block_pool.BlockPool``; arguments as the 0.15 line's."""

    def free_blocks(self, ordered_blocks: Iterable[Any], prepend: bool = False) -> None:
        """Drop one reference from each block; blocks reaching 0 go to the
        free queue's tail in the given order -- to its head with
        ``prepend``. Null blocks are skipped; a double free, a foreign or
        repeated block raises and changes nothing."""
        if not prepend:
            return super().free_blocks(ordered_blocks)
        blocks = list(ordered_blocks)
        # The core checks every block and appends the freed ones to the tail
        # (each block at most once, none of them in the queue before); they
        # then move to the head, in the same order.
        super().free_blocks(blocks)
        freed = [block for block in blocks if block.ref_cnt == 0 and not block.is_null]
        if freed:
            queue = self.free_block_queue
            for block in freed:
                queue.remove(block)
            queue.prepend_n(freed)
        return None


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.23 ``BlockPool`` facade over ``core`` (compiled or pure Python)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_23")
