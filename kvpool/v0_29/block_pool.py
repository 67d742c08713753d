"""``BlockPool`` of vLLM 0.29 (mirrors ``vllm/v1/core/block_pool.py``): the
0.30 line (``kvpool.v0_30.block_pool``) without what 0.30 added.

What vLLM 0.29.0's pool does not have of 0.30.0's:

- ``medium`` (argument and attribute): the events always say ``GPU``;
- ``session_id`` in ``BlockStored`` (``kvpool.v0_29.kv_events``);
- ``unpin_blocks`` and its reuse watchers (``get_new_blocks`` and
  ``reset_prefix_cache`` then have none to fire);
- ``cache_partial_block(replace_existing_hashes=)``: the entry must be
  partial (0.30's check with ``replace_existing_hashes`` false).

0.29's blocks have no ``pool`` either, so its ``free_blocks`` takes every
block as its own; kvpool's blocks know their pool, and a block of another
kvpool pool is handed back to it (vLLM 0.29 would link it into the wrong
free queue).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..block_pool import NotInRelease, bind_facade
from ..metrics import KVCacheMetricsCollector
from ..v0_30 import block_pool as _v0_30
from ..v0_33.kv_cache_utils import to_event_extra_keys
from .kv_events import MEDIUM_GPU, BlockStored

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_v0_30.BlockPoolMixin):
    """Drop-in for vLLM 0.29.0's ``vllm.v1.core.block_pool.BlockPool``: the
    0.30 pool (``kvpool.v0_30.BlockPool``) without ``medium``,
    ``unpin_blocks``, ``cache_partial_block(replace_existing_hashes=)`` and
    the events' ``session_id``."""

    _BlockStored: type = BlockStored
    _event_medium = MEDIUM_GPU
    medium = NotInRelease()
    unpin_blocks = NotInRelease()

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: KVCacheMetricsCollector | None = None,
    ) -> None:
        self._init_pool(
            num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
            metrics_collector,
        )

    def cache_partial_block(
        self,
        request: Any,
        block: Any,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
    ) -> bytes | None:
        """Make ``block`` reachable from the prefix boundary at
        ``num_tokens`` (a multiple of ``hash_block_size``, inside the block,
        whose ``block_size`` is a larger multiple of it): register the
        request's hash at that boundary as a key of the block -- its
        ``block_hash`` if it has none, else a further key
        (``cached_block_hashes_by_block``); a key covering fewer tokens is
        replaced. Returns the key, or None for the null block."""
        return super().cache_partial_block(
            request, block, num_tokens, kv_cache_group_id, block_size
        )

    def _build_block_stored_event(
        self,
        request: Any,
        block_hashes: list[Any] | None,
        parent_block_hash: Any,
        start_token_idx: int,
        end_token_idx: int,
        block_size: int,
        kv_cache_group_id: int,
        extra_keys_list: list[Any],
        lookahead_token_ids: None,
    ) -> Any:
        lora = request.lora_request
        return self._BlockStored(
            block_hashes=block_hashes,
            parent_block_hash=parent_block_hash,
            token_ids=request.all_token_ids[start_token_idx:end_token_idx],
            block_size=block_size,
            lora_id=lora.adapter_id if lora else None,
            medium=MEDIUM_GPU,
            lora_name=lora.name if lora else None,
            extra_keys=to_event_extra_keys(extra_keys_list),
            group_idx=kv_cache_group_id,
        )


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.29 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_29")
