"""``BlockPool`` of vLLM 0.24 and 0.25 (mirrors ``vllm/v1/core/block_pool.py``
of vLLM 0.24.0, 0.25.0 and 0.25.1, which are byte-identical): the 0.26 line
(``kvpool.v0_26.block_pool``) without what 0.26 added (API generation G8).

vLLM 0.24's pool has no ``emit_cached_block_events`` (0.26 added it, so
that event consumers learn about prefix-cache reuse) and no
``move_block_hashes`` (0.26, for the manager's private copies); its events
have no ``locality`` (``kvpool.v0_24.kv_events``). Its ``cache_full_blocks``
builds the ``BlockHashListWithBlockSize`` view itself where 0.26 calls
``resolve_block_hashes``: the same keys and events. The free order is
0.26's (blocks go by their hash, caching on or off).
"""

from __future__ import annotations

from types import ModuleType

from ..block_pool import NotInRelease, bind_facade
from ..v0_26 import block_pool as _v0_26
from .kv_events import BlockRemoved, BlockStored

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_v0_26.BlockPoolMixin):
    """Manages a pool of KV-cache blocks (the 0.26 line's facade, with its
    arguments). Drop-in compatible with the ``vllm.v1.core.block_pool.BlockPool``
    of vLLM 0.24.0, 0.25.0 and 0.25.1."""

    _BlockStored: type = BlockStored
    _BlockRemoved: type = BlockRemoved
    emit_cached_block_events = NotInRelease()
    move_block_hashes = NotInRelease()


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.24 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_24")
