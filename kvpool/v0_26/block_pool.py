"""``BlockPool`` of vLLM 0.26 (mirrors ``vllm/v1/core/block_pool.py`` of vLLM
0.26.0): the 0.27 line (``kvpool.v0_27.block_pool``) but for one rule of
``free_blocks``.

vLLM 0.26 does not look at ``enable_caching`` when it frees: a released
block without a hash goes to the front of the free queue, one with a hash
to the back, caching on or off. (With caching off a block has a hash only
if ``cache_full_blocks`` was called for it, which does not look at
``enable_caching`` either; ``get_new_blocks`` then does not evict it.)
0.27 puts every block at the back with caching off, 0.28 every block in
front. The core applies the rule (``_kvpool_free_caching_off``).
"""

from __future__ import annotations

from types import ModuleType

from ..block_pool import bind_facade
from ..v0_27 import block_pool as _v0_27

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_v0_27.BlockPoolMixin):
    """Manages a pool of KV-cache blocks (the 0.27 line's facade, with its
    arguments). Drop-in compatible with the ``vllm.v1.core.block_pool.BlockPool``
    of vLLM 0.26.0."""

    _kvpool_free_caching_off = "by_hash"


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.26 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_26")
