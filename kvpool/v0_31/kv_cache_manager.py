"""kvpool's ``KVCacheManager`` for vLLM 0.31: the 0.32 line's, but
``allocate_slots`` has no ``skip_zeroing_group_ids``. Imports vLLM."""

from __future__ import annotations

from .. import _manager
from ..v0_32 import kv_cache_manager as _v0_32
from ..v0_32.kv_cache_manager import KVCacheBlocks

__all__ = ["KVCacheBlocks", "KVCacheManager"]


class KVCacheManager(_v0_32.KVCacheManager):
    __doc__ = _v0_32.KVCacheManager.__doc__
    allocate_slots = _manager.allocate_slots_0_30
