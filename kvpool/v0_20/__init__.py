"""kvpool for vLLM 0.20 and 0.21 (0.20.0, 0.20.1, 0.20.2, 0.21.0): the 0.19
line whose events carry ``group_idx`` (``kv_events``, ``block_pool``).
Between 0.20.0 and 0.21.0 ``kv_cache_utils.py`` and the coordinator changed
only in how the engine sizes and groups the cache (block counts, DeepseekV4
layouts, EAGLE groups), nothing the pool sees; ``block_pool.py`` and
``kv_events.py`` are identical across the four releases."""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_19 import *  # noqa: F403 -- what 0.20 did not change
from ..v0_19 import __all__ as __all__  # noqa: F401
from .block_pool import BlockPoolMixin, make_block_pool_class
from .kv_events import BlockRemoved, BlockStored, KVEventBatch  # noqa: F401

BlockPool = make_block_pool_class(_CORE)
