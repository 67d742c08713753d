"""kvpool for vLLM 0.30: the pool API of ``vllm.v1.core`` as of vLLM 0.30.0.

The 0.31 line (``kvpool.v0_31``) but for ``BlockPool`` (``block_pool``:
0.30's partial-block event) and the extra-key helpers (``kv_cache_utils``:
untagged keys, no ``to_event_extra_keys``). Blocks, free queue, hash map and
events are the same in vLLM 0.30.0 and 0.31.0.
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_31 import *  # noqa: F403 - the 0.31 line's names; 0.30's are set below
from ..v0_31 import __all__ as _all_0_31
from .block_pool import make_block_pool_class
from .kv_cache_utils import generate_block_hash_extra_keys

BlockPool = make_block_pool_class(_CORE)

del to_event_extra_keys  # noqa: F821 - new in 0.31
__all__ = [name for name in _all_0_31 if name != "to_event_extra_keys"]
