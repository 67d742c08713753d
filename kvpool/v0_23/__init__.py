"""kvpool for vLLM 0.23 (0.23.0): the 0.22 line with
``free_blocks(prepend=)`` (``block_pool``); ``FreeKVCacheBlockQueue.prepend_n``,
new in 0.23's ``kv_cache_utils.py``, is the core queue's. 0.23's other
``kv_cache_utils.py`` and coordinator changes (DeepseekV4 layouts, the
scheduler block size) are not seen by the pool; its ``kv_events.py`` differs
from 0.22.1's in docstrings only."""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_22 import *  # noqa: F403 -- what 0.23 did not change
from ..v0_22 import __all__ as __all__  # noqa: F401
from .block_pool import BlockPoolMixin, make_block_pool_class

BlockPool = make_block_pool_class(_CORE)
