"""kvpool for vLLM 0.29: the pool API of ``vllm.v1.core`` as of vLLM 0.29.0.

The 0.30 line (``kvpool.v0_30``) but for ``BlockPool`` (``block_pool``: no
``medium``, ``unpin_blocks`` or ``replace_existing_hashes``) and the events
(``kv_events``: ``BlockStored`` without ``session_id``). Free queue, hash map
and hash helpers are the same in vLLM 0.29.0 and 0.30.0; 0.29's
``KVCacheBlock`` has no ``pool`` field (see ``block_pool``).
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_30 import *  # noqa: F403 - the 0.30 line's names; 0.29's are set below
from ..v0_30 import __all__  # noqa: F401
from .block_pool import make_block_pool_class
from .kv_events import BlockStored, KVEventBatch

BlockPool = make_block_pool_class(_CORE)
