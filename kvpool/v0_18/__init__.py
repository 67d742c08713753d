"""kvpool for vLLM 0.18 (0.18.0, 0.18.1): pool-wise the 0.17 line.

vLLM 0.18 made ``KVCacheBlock`` a ``@dataclass(slots=True)``; its
constructor keywords, its ``repr`` and its equality (field-wise; blocks are
unhashable in 0.17 and 0.18 alike) did not change, only the attribute set:
a block has no instance ``__dict__`` (no attributes beyond its fields) and
no weak references. kvpool's compiled block already has neither (it is a
handle onto the pool's C arrays), and kvpool's blocks compare by identity in
every line (``docs/core-contract.md``). ``block_pool.py``,
``kv_cache_utils.py``' hashing and extra keys, ``kv_events.py`` and the
coordinator's construction call are those of 0.17.1, so this namespace
exports the 0.17 line's objects.
"""

from __future__ import annotations

from ..v0_17 import *  # noqa: F403 -- the 0.17 line, unchanged
from ..v0_17 import __all__ as __all__  # noqa: F401
