"""kvpool's ``KVCacheManager`` for vLLM 0.32: the 0.33 line's, but
``get_computed_blocks`` takes no ``max_cache_hit_length``, a
group's ``cache_blocks`` counts every full block of the tokens it is given
(0.33 stops at the request's hashed tokens), ``free`` gives a table
back whole (0.33 drops its leading null blocks), and an EAGLE / MTP lookup
drops its last block for every group flagged ``eagle_group_ids`` (0.33:
``drop_eagle_group_ids``, empty under lookahead hashes). Imports vLLM."""

from __future__ import annotations

from .. import _manager
from ..v0_33 import kv_cache_manager as _v0_33
from ..v0_33.kv_cache_manager import KVCacheBlocks

__all__ = ["KVCacheBlocks", "KVCacheManager"]


class KVCacheManager(_v0_33.KVCacheManager):
    __doc__ = _v0_33.KVCacheManager.__doc__
    _kvpool_cap_at_hashed = False
    _kvpool_trims_null_head = False
    get_computed_blocks = _manager.get_computed_blocks_0_30
    _kvpool_eagle_drop_attr = "eagle_group_ids"
