"""``BlockPool`` of vLLM 0.31 (mirrors ``vllm/v1/core/block_pool.py``): the
0.32 line (``kvpool.v0_32.block_pool``) with 0.31's stricter
``cache_partial_block``.

What vLLM 0.31.0's pool does differently from 0.32.0's: ``cache_partial_block``
also asserts that the entry is partial -- ``block_size > hash_block_size``
and ``num_tokens`` not a multiple of ``block_size`` -- unless
``replace_existing_hashes`` is set (0.32 dropped that assert). The free
queue's 0.32 rewrite (``popleft``/``popleft_n``/``remove``/``append``) changed
no result.
"""

from __future__ import annotations

from types import ModuleType

from ..block_pool import bind_facade
from ..v0_32 import block_pool as _v0_32
from ..v0_33.block_pool import PoolArgumentError, _check_count

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_v0_32.BlockPoolMixin):
    """Drop-in for vLLM 0.31.0's ``vllm.v1.core.block_pool.BlockPool``: the
    0.32 pool (``kvpool.v0_32.BlockPool``) with 0.31's stricter
    ``cache_partial_block``."""

    def _check_partial_block_args(
        self, num_tokens: int, block_size: int, replace_existing_hashes: bool
    ) -> None:
        super()._check_partial_block_args(num_tokens, block_size, replace_existing_hashes)
        if replace_existing_hashes:
            return
        _check_count("num_tokens", num_tokens)
        if not (block_size > self.hash_block_size and num_tokens % block_size):
            raise PoolArgumentError(
                f"a partial entry must end inside its block: block_size ({block_size}) "
                f"> hash_block_size ({self.hash_block_size}) and num_tokens "
                f"({num_tokens}) not a multiple of block_size (or replace_existing_hashes)"
            )


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.31 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_31")
