"""kvpool's ``KVCacheManager`` for vLLM 0.31: the 0.32 line's, but
``allocate_slots`` has no ``skip_zeroing_group_ids``, the hybrid lookup's
EAGLE margin reaches at most the lookup's bound (0.32: the hashed tokens),
a full-attention group's prompt tail ends below ``num_prompt_tokens`` (0.32:
below ``num_prompt_tokens - 1`` without EAGLE), and
``get_num_common_prefix_blocks`` counts the blocks every request holds
(0.32 answers zeros): the scheduler calls it once a step; an align-mode
Mamba group's prefill checkpoint sits on a hash block below the chunk's
end and its step relocates no speculative block. Imports vLLM."""

from __future__ import annotations

from vllm.v1.core import kv_cache_coordinator as _coordinator

from .. import _manager
from ..v0_32 import kv_cache_manager as _v0_32
from ..v0_32.kv_cache_manager import KVCacheBlocks

__all__ = ["KVCacheBlocks", "KVCacheManager"]


class KVCacheManager(_v0_32.KVCacheManager):
    __doc__ = _v0_32.KVCacheManager.__doc__
    allocate_slots = _manager.allocate_slots_0_30
    get_num_common_prefix_blocks = _manager.get_num_common_prefix_blocks_0_30
    #: The coordinator method that get_num_common_prefix_blocks does in C.
    _kvpool_common_prefix_blocks = _coordinator.KVCacheCoordinator.get_num_common_prefix_blocks
    _kvpool_eagle_margin_to_hashes = False
    _kvpool_tail_index_cdiv = False
    _kvpool_tail_eagle_limit = False
    _kvpool_align_rules = 31
