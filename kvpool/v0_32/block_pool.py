"""``BlockPool`` of vLLM 0.32 (mirrors ``vllm/v1/core/block_pool.py``): the
0.33 line (``kvpool.v0_33.block_pool``) without lookahead hashing, and with
the null block counted.

What vLLM 0.32.0's pool does differently from 0.33.0's, and nothing else:

- no ``num_hash_lookahead_tokens`` (argument or attribute): ``medium`` is the
  6th positional argument, and the events' extra keys cover the block only
  (``BlockStored`` has no ``lookahead_token_ids``);
- ``touch`` and ``free_blocks`` count the null block's ``ref_cnt`` (1 after a
  touch, -1 after a touch and two frees), and another pool's null block is
  handed to that pool, since the pool is tested before ``is_null``: the
  core's rule ``_kvpool_counts_null``.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any

from ..block_pool import NotInRelease, bind_facade
from ..metrics import KVCacheMetricsCollector
from ..v0_33 import block_pool as _v0_33
from ..v0_33.kv_cache_utils import generate_block_hash_extra_keys, to_event_extra_keys
from .kv_events import MEDIUM_GPU, BlockStored

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_v0_33.BlockPoolMixin):
    """Drop-in for vLLM 0.32.0's ``vllm.v1.core.block_pool.BlockPool``: the
    0.33 pool (``kvpool.v0_33.BlockPool``, whose docstring says what each
    argument is and how misuse is refused) without
    ``num_hash_lookahead_tokens``, and with the null block counted."""

    _kvpool_counts_null = True
    _BlockStored: type = BlockStored
    num_hash_lookahead_tokens = NotInRelease()

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: KVCacheMetricsCollector | None = None,
        medium: str = MEDIUM_GPU,
    ) -> None:
        self._init_pool(
            num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
            metrics_collector,
        )
        self.medium = medium

    def _generate_event_extra_keys(
        self, request: Any, start: int, end: int, start_mm_idx: int
    ) -> tuple[tuple[Any, ...] | None, int]:
        return generate_block_hash_extra_keys(request, start, end, start_mm_idx)

    def _event_lookahead(self, request: Any, block_ends: Iterable[int]) -> None:
        return None

    _PLAIN_STORED_KEYWORDS = tuple(
        k for k in _v0_33.BlockPoolMixin._PLAIN_STORED_KEYWORDS if k != "lookahead_token_ids"
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
            medium=self._event_medium,
            lora_name=lora.name if lora else None,
            extra_keys=to_event_extra_keys(extra_keys_list),
            group_idx=kv_cache_group_id,
            session_id=request.session_id,
        )


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.32 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_32")
