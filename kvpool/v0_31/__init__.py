"""kvpool for vLLM 0.31: the pool API of ``vllm.v1.core`` as of vLLM 0.31.0.

The 0.32 line (``kvpool.v0_32``) but for ``BlockPool`` (``block_pool``:
0.31's stricter ``cache_partial_block``). Every other name -- blocks, free
queue, hash map, hash helpers, events -- is the same in vLLM 0.31.0 and
0.32.0, and is the 0.32 line's.
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_32 import *  # noqa: F403 - the 0.32 line's names; the pool is replaced below
from ..v0_32 import __all__  # noqa: F401
from .block_pool import make_block_pool_class

BlockPool = make_block_pool_class(_CORE)
