"""``BlockPool`` of vLLM 0.27 (mirrors ``vllm/v1/core/block_pool.py`` of vLLM
0.27.0 and 0.27.1, which are byte-identical): the 0.28 line
(``kvpool.v0_28.block_pool``) but for one rule of ``free_blocks``.

With prefix caching **off**, vLLM 0.27 appends every released block to the
back of the free queue ("for better GPU cache locality from reusing recently
used blocks", its comment says); 0.26 put blocks without a hash in front
whatever the caching, 0.28 puts every block in front. Caching on, the three
agree: a block without a hash in front, a cached one at the back. The core
applies the rule (``_kvpool_free_caching_off``), in its free loop.
"""

from __future__ import annotations

from types import ModuleType

from ..block_pool import bind_facade
from ..v0_28 import block_pool as _v0_28

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_v0_28.BlockPoolMixin):
    """Manages a pool of KV-cache blocks (the 0.28 line's facade, with its
    arguments). Drop-in compatible with the ``vllm.v1.core.block_pool.BlockPool``
    of vLLM 0.27.0 and 0.27.1."""

    _kvpool_free_caching_off = "back"


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.27 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_27")
