"""``BlockPool`` of vLLM 0.30 (mirrors ``vllm/v1/core/block_pool.py``): the
0.31 line (``kvpool.v0_31.block_pool``) with 0.30's partial-block event.

What vLLM 0.30.0's pool does differently from 0.31.0's: the ``BlockStored``
of ``cache_partial_block`` looks for the block's multimodal items from the
request's *last* item when the block does not start the request (0.31 finds
the first item overlapping the block), so a partial block past the first
one names at most the last item. Its other events are 0.31's: 0.30's untagged
extra keys are what 0.31 publishes (``kvpool.v0_30.kv_cache_utils``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..block_pool import bind_facade
from ..v0_31 import block_pool as _v0_31

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_v0_31.BlockPoolMixin):
    """Drop-in for vLLM 0.30.0's ``vllm.v1.core.block_pool.BlockPool``: the
    0.31 pool (``kvpool.v0_31.BlockPool``) with 0.30's partial-block
    event."""

    def _partial_block_mm_idx(self, request: Any, start: int, end: int) -> int:
        # -1: from the last item.
        return -1 if start > 0 else 0


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.30 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_30")
