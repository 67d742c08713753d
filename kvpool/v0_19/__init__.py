"""kvpool for vLLM 0.19 (0.19.0, 0.19.1): the 0.18 line (= 0.17's) with
0.19's multimodal extra keys in ``BlockStored`` events (``kv_cache_utils``)
and blocks that take the SimpleCPUOffload connector's ``_block_hash`` write
(``block_pool``'s docstring says how). Events, blocks, the free queue and the
hash map are otherwise the 0.17 line's."""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_17 import *  # noqa: F403 -- what 0.19 did not change
from ..v0_17 import __all__ as __all__  # noqa: F401
from .block_pool import BlockPoolMixin, make_block_pool_class
from .kv_cache_utils import generate_block_hash_extra_keys  # noqa: F401

BlockPool = make_block_pool_class(_CORE)
