"""kvpool for vLLM 0.22 (0.22.0, 0.22.1): the 0.20 line with
``cache_full_blocks(block_mask=)`` (``block_pool``) and ``BlockStored``'s
``kv_cache_spec_*`` fields (``kv_events``). 0.22.0's ``kv_cache_utils.py``
changes (memory checks, grouping) are not seen by the pool; 0.22.1's pool
files are 0.22.0's."""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_20 import *  # noqa: F403 -- what 0.22 did not change
from ..v0_20 import __all__ as __all__  # noqa: F401
from .block_pool import BlockPoolMixin, make_block_pool_class
from .kv_events import BlockStored, KVEventBatch  # noqa: F401

BlockPool = make_block_pool_class(_CORE)
