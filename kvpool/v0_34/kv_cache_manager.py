"""kvpool's ``KVCacheManager`` for vLLM 0.34: the 0.33 line's, but a
prefix-cache lookup follows the request's own bound
(``prefix_cache_hit_limit``, ``get_max_cache_hit_length``), and
``estimate_cached_tokens`` reads each group's last counted block. vLLM
0.34's other manager changes (``get_num_cached_tokens``, the removed
``get_num_common_prefix_blocks``, untracked request tables) are vLLM's own
class's, which kvpool's extends. Imports vLLM."""

from __future__ import annotations

from .. import _manager
from ..v0_33 import kv_cache_manager as _v0_33
from ..v0_33.kv_cache_manager import KVCacheBlocks

__all__ = ["KVCacheBlocks", "KVCacheManager"]


class KVCacheManager(_v0_33.KVCacheManager):
    __doc__ = _v0_33.KVCacheManager.__doc__
    get_computed_blocks = _manager.get_computed_blocks_0_34
    estimate_cached_tokens = _manager.estimate_cached_tokens_0_34
