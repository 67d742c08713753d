"""kvpool for vLLM 0.28: the pool API of ``vllm.v1.core`` as of vLLM 0.28.0.

The 0.29 line (``kvpool.v0_29``) but for ``BlockPool`` (``block_pool``: no
``is_block_writable``) and the events (``kv_events``: no ``ownership``).
Blocks, free queue, hash map and hash helpers are the same in vLLM 0.28.0
and 0.29.0 (0.29's new NONE_HASH seed is the request hasher's, not the
pool's). See ``docs/lines-0.24-0.28.md``.
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_29 import *  # noqa: F403 - the 0.29 line's names; 0.28's are set below
from ..v0_29 import __all__  # noqa: F401
from .block_pool import make_block_pool_class
from .kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent, KVEventBatch

BlockPool = make_block_pool_class(_CORE)
