"""kvpool for vLLM 0.26: the pool API of ``vllm.v1.core`` as of vLLM 0.26.0.

The 0.27 line (``kvpool.v0_27``) but for ``BlockPool`` (``block_pool``:
``free_blocks`` puts a released block in front iff it has no hash, caching
on or off) and the media (``kv_events``: ``MEDIUM_FS`` and ``MEDIUM_OBJ``
where 0.27 has ``MEDIUM_STORAGE``). See ``docs/lines-0.24-0.28.md``.
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_27 import *  # noqa: F403 - the 0.27 line's names; 0.26's are set below
from ..v0_27 import __all__ as _v0_27_all
from .block_pool import make_block_pool_class
from .kv_events import MEDIUM_FS, MEDIUM_OBJ

del MEDIUM_STORAGE  # noqa: F821 - 0.27's name for what 0.26 calls FS and OBJ

__all__ = [name for name in _v0_27_all if name != "MEDIUM_STORAGE"] + ["MEDIUM_FS", "MEDIUM_OBJ"]

BlockPool = make_block_pool_class(_CORE)
