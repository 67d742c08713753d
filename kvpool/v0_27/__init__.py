"""kvpool for vLLM 0.27: the pool API of ``vllm.v1.core`` as of vLLM 0.27.0
and 0.27.1 (their pool files are byte-identical).

The 0.28 line (``kvpool.v0_28``) but for ``BlockPool`` (``block_pool``:
with caching off, ``free_blocks`` puts released blocks at the back of the
free queue). Events, blocks, free queue, hash map and hash helpers are
0.28's. See ``docs/lines-0.24-0.28.md``.
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_28 import *  # noqa: F403 - the 0.28 line's names; 0.27's are set below
from ..v0_28 import __all__  # noqa: F401
from .block_pool import make_block_pool_class

BlockPool = make_block_pool_class(_CORE)
