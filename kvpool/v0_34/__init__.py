"""kvpool for vLLM 0.34: the pool API of ``vllm.v1.core`` as of vLLM 0.34.0.

``from kvpool.v0_34 import BlockPool`` gives a drop-in for vLLM 0.34.0's
``vllm.v1.core.block_pool.BlockPool``, over the core in use (as
``kvpool.v0_33``). The line is the 0.33 line plus what 0.34 changed, written
down once in this package's modules, each named after the vLLM module it
mirrors:

- ``block_pool``: ``free_blocks(evict_first=)``, the pool's ``_weak_self``,
  the public ``generate_event_extra_keys`` / ``get_lookahead_token_ids``,
  the map cleared in place by ``reset_prefix_cache``;
- ``kv_cache_utils``: ``KVCacheBlock`` with plain ``block_hash`` /
  ``block_hash_num_tokens`` fields and a weak ``pool``;
  ``BlockHashToBlockMap(blocks)`` showing block ids (``_cache``,
  ``_dup_ids``) and ``clear()`` (the core's ``KVCacheBlock34`` and
  ``BlockHashToBlockMap34``).

Events (``vllm/distributed/kv_events.py``), the hash helpers and the
metrics are 0.33's: byte-identical in vLLM 0.34.0.
"""

from __future__ import annotations

from types import ModuleType

from .. import CORE as _CORE
from ..v0_33 import *  # noqa: F403 - the 0.33 line's names; 0.34's are set below
from ..v0_33 import __all__ as _all_0_33
from .block_pool import make_block_pool_class


def block_class(core: ModuleType) -> type:
    """The 0.34 block class of ``core`` (``kvpool._core`` or ``kvpool._core_py``)."""
    return core.KVCacheBlock34


KVCacheBlock = _CORE.KVCacheBlock34
BlockHashToBlockMap = _CORE.BlockHashToBlockMap34
BlockPool = make_block_pool_class(_CORE)

__all__ = list(_all_0_33)
