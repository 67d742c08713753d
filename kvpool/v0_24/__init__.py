"""kvpool for vLLM 0.24 and 0.25: the pool API of ``vllm.v1.core`` as of vLLM
0.24.0, 0.25.0 and 0.25.1 (their pool files are byte-identical).

The 0.26 line (``kvpool.v0_26``) without what 0.26 added (API generation
G8): ``BlockPool`` (``block_pool``) has no ``emit_cached_block_events`` or
``move_block_hashes``; ``kv_cache_utils`` has no ``resolve_block_hashes``;
the events (``kv_events``) have no ``locality``, and ``GPU`` is the only
medium. See ``docs/lines-0.24-0.28.md``.
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_26 import *  # noqa: F403 - the 0.26 line's names; 0.24's are set below
from ..v0_26 import __all__ as _v0_26_all
from .block_pool import make_block_pool_class
from .kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent, KVEventBatch

# What 0.26 added: resolve_block_hashes and the media besides GPU.
_ADDED_IN_0_26 = ("resolve_block_hashes", "MEDIUM_CPU", "MEDIUM_FS", "MEDIUM_OBJ")
for _name in _ADDED_IN_0_26:
    del globals()[_name]
del _name

__all__ = [name for name in _v0_26_all if name not in _ADDED_IN_0_26]

BlockPool = make_block_pool_class(_CORE)
