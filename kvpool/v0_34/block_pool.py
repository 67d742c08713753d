"""``BlockPool`` of vLLM 0.34 (mirrors ``vllm/v1/core/block_pool.py``): the
0.33 line (``kvpool.v0_33.block_pool``) plus what 0.34 changed.

What vLLM 0.34.0's pool does differently from 0.33.0's, and nothing else:

- blocks are ``KVCacheBlock34`` (``block_hash`` / ``block_hash_num_tokens``
  are plain fields; ``pool`` is a weak reference, the pool's
  ``_weak_self``) and the map is ``BlockHashToBlockMap34`` (over the
  pool's blocks, showing block ids): the core's rule
  ``_kvpool_block_pool = "weak"``;
- ``free_blocks(ordered_blocks, evict_first=False)``: with ``evict_first``
  released cached blocks go to the front of the free queue too, and other
  pools' blocks are handed on with it; a block whose pool is gone is
  skipped;
- ``reset_prefix_cache`` clears the map in place (the core's
  ``_clear_map``);
- ``generate_event_extra_keys`` and ``get_lookahead_token_ids`` are public
  (0.33's ``_generate_event_extra_keys`` / ``_lookahead_token_ids``).

0.34's other edits to the file (ids in the map's dict, the group suffix
appended once per call, ``get_new_blocks`` skipping the eviction call for
blocks without a hash, the reordered ``_insert_block_hash``) change no
result: the differential traces run both releases' code on the same calls.
"""

from __future__ import annotations

import functools
import weakref
from types import ModuleType
from typing import Any

from ..block_pool import bind_facade
from ..v0_33 import block_pool as _v0_33

__all__ = ["BlockPoolMixin", "make_block_pool_class"]


class BlockPoolMixin(_v0_33.BlockPoolMixin):
    """Drop-in for vLLM 0.34.0's ``vllm.v1.core.block_pool.BlockPool``: the
    0.33 pool (``kvpool.v0_33.BlockPool``, whose docstring says what each
    argument is and how misuse is refused) with 0.34's blocks and map,
    ``free_blocks(evict_first=)`` and the public event helpers."""

    _kvpool_block_pool = "weak"

    # 0.33's signature and arguments; the pool's weak reference added.
    @functools.wraps(_v0_33.BlockPoolMixin.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # What every block's ``pool`` is (weakref.ref hands out this one
        # reference for the pool), and what vLLM compares it with.
        self._weak_self = weakref.ref(self)

    def generate_event_extra_keys(
        self, request: Any, start: int, end: int, start_mm_idx: int
    ) -> tuple[tuple[Any, ...] | None, int]:
        """A block's extra keys as its ``BlockStored`` event carries them
        (they cover the same tokens as the block's hash), and the next
        multimodal item to look at."""
        return _v0_33.BlockPoolMixin._generate_event_extra_keys(
            self, request, start, end, start_mm_idx
        )

    def _generate_event_extra_keys(
        self, request: Any, start: int, end: int, start_mm_idx: int
    ) -> tuple[tuple[Any, ...] | None, int]:
        # The 0.33 facade's hook, through the public name a subclass overrides.
        return self.generate_event_extra_keys(request, start, end, start_mm_idx)

    def get_lookahead_token_ids(self, request: Any, block_end: int) -> list[int]:
        """The tokens after ``block_end`` that the block's hash also covers."""
        return request.all_token_ids[block_end : block_end + self.num_hash_lookahead_tokens]

    def _check_own(self, block: Any) -> None:
        owner = getattr(block, "pool", None)
        if owner is not self._weak_self:
            if not isinstance(block, self._core.KVCacheBlock):
                raise TypeError(f"expected a KVCacheBlock, got {type(block).__name__}")
            raise ValueError(f"block {block.block_id} does not belong to this pool")


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.34 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    cls = bind_facade(BlockPoolMixin, core, "kvpool.v0_34")
    # The core's own method, not a Python wrapper: the manager frees every
    # finished request through it.
    cls.free_blocks = core.PoolCore._free_blocks34
    return cls
