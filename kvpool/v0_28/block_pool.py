"""``BlockPool`` of vLLM 0.28 (mirrors ``vllm/v1/core/block_pool.py``): the
0.29 line (``kvpool.v0_29.block_pool``) without what 0.29 added.

vLLM 0.28.0's pool has no ``is_block_writable`` (0.29 added it, for the
manager's copy-on-write check), and its events have no ``ownership``
(``kvpool.v0_28.kv_events``). Everything else -- partial-block entries,
``move_block_hashes``, ``emit_cached_block_events``, the free order (with
caching off every released block in front), the counted null block -- is
0.29's.
"""

from __future__ import annotations

from types import ModuleType

from ..block_pool import NotInRelease, bind_facade
from ..v0_29 import block_pool as _v0_29
from .kv_events import BlockRemoved, BlockStored

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_v0_29.BlockPoolMixin):
    """Manages a pool of KV-cache blocks (the 0.29 line's facade, with its
    arguments). Drop-in compatible with the ``vllm.v1.core.block_pool.BlockPool``
    of vLLM 0.28.0."""

    _BlockStored: type = BlockStored
    _BlockRemoved: type = BlockRemoved
    is_block_writable = NotInRelease()


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.28 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_28")
