"""kvpool's ``KVCacheManager`` for vLLM 0.30: the 0.31 line's, but a
sliding-window manager keeps its admission cap as
``_max_admission_blocks_per_request``, the coordinator's
``get_num_blocks_to_allocate`` has no ``prefill_end``, ``allocate_slots``
refuses a chunk of no new tokens even when it adopts computed ones, and an
align-mode Mamba group's checkpoint step assigns its count the cap.
Imports vLLM."""

from __future__ import annotations

from ..v0_31 import kv_cache_manager as _v0_31
from ..v0_31.kv_cache_manager import KVCacheBlocks

__all__ = ["KVCacheBlocks", "KVCacheManager"]


class KVCacheManager(_v0_31.KVCacheManager):
    __doc__ = _v0_31.KVCacheManager.__doc__
    _kvpool_cap_attr = "_max_admission_blocks_per_request"
    _kvpool_has_prefill_end = False
    _kvpool_zero_chunk_adopts = False
    _kvpool_align_rules = 30
