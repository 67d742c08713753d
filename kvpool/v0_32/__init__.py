"""kvpool for vLLM 0.32: the pool API of ``vllm.v1.core`` as of vLLM 0.32.0.

``from kvpool.v0_32 import BlockPool`` gives a drop-in for vLLM 0.32.0's
``vllm.v1.core.block_pool.BlockPool``, over the core in use (as
``kvpool.v0_33``). The line is the 0.33 line minus what 0.33 added, written
down once in this package's modules, each named after the vLLM module it
mirrors:

- ``block_pool``: no lookahead hashing (``medium`` is the 6th positional
  argument); the null block's ``ref_cnt`` is counted;
- ``kv_events``: ``BlockStored`` without ``lookahead_token_ids``.

Blocks, the free queue, the hash map and the hash helpers are 0.33's (the
same in vLLM 0.32.0, but for ``generate_lookahead_block_hash_extra_keys``,
which 0.32 does not have).
"""

from __future__ import annotations

from .. import CORE as _CORE
from ..v0_33 import *  # noqa: F403 - the 0.33 line's names; 0.32's are set below
from ..v0_33 import __all__ as _all_0_33
from .block_pool import make_block_pool_class
from .kv_events import BlockStored, KVEventBatch

BlockPool = make_block_pool_class(_CORE)

del generate_lookahead_block_hash_extra_keys  # noqa: F821 - new in 0.33
__all__ = [name for name in _all_0_33 if name != "generate_lookahead_block_hash_extra_keys"]
