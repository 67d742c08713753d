"""``BlockPool``: the facade an engine talks to.

All block bookkeeping (free queue, reference counts, hash keys, the prefix
cache map) lives in the core's ``PoolCore``; this module adds only what vLLM's
pool does around it in Python: KV-cache events, sampled metrics and logging.
``BlockPool`` *subclasses* the core class, so the calls an engine makes once
per block (``get_cached_block``) or that need no events (``free_blocks``,
``get_num_free_blocks``, ``get_usage``) go straight to the core with no Python
frame in between. ``get_new_blocks``, ``touch`` and ``cache_full_blocks`` are
the core's too: with no events and no metrics collector the compiled core
does all of their work; otherwise it calls the hook methods defined here.

The facade is ``BlockPoolMixin``, written at module level so that a reader
and a type checker see its methods, and so that a later vLLM line's facade is
a small subclass of it; ``make_block_pool_class(core)`` binds it over either
core's ``PoolCore``; the package exports the one over the core selected at
import.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

from .events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from .hashing import (
    BlockHashListWithBlockSize,
    _use_int_block_hashes,
    convert_block_hashes,
)
from .metrics import KVCacheMetricsCollector

__all__ = ["BlockPoolMixin", "NotInRelease", "bind_facade", "make_block_pool_class"]

logger = logging.getLogger("kvpool.block_pool")


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def take_events(self: Any) -> list[KVCacheEvent]:
    """Return the queued events and start a new queue (both lines' facades;
    ``kv_event_queue`` is read and written as an attribute, so a subclass may
    make it a property, as vLLM's HiSparse pool does)."""
    if not self.enable_kv_cache_events:
        return []
    events = self.kv_event_queue
    self.kv_event_queue = []
    return events


class BlockPoolMixin:
    """Manages a pool of KV-cache blocks: allocation, freeing, the prefix
    cache and its LRU eviction. Drop-in compatible with vLLM 0.15.1's
    ``vllm.v1.core.block_pool.BlockPool``.

    Args:
        num_gpu_blocks: number of blocks (ids ``0..n-1``); block 0 becomes
            the ``null_block`` placeholder.
        enable_caching: whether allocation evicts cached hashes (prefix
            caching on).
        hash_block_size: the block size the request's block hashes were
            computed at; a group's block size may be a multiple of it.
        enable_kv_cache_events: whether to queue KV-cache events for
            ``take_events()``.
        metrics_collector: optional sampled residency metrics.

    Misuse (a double free, a foreign block, too many blocks requested)
    raises ``ValueError``/``RuntimeError``/``TypeError`` and leaves the
    pool as it was, also under ``python -O``.
    """

    # The event classes queued; inside vLLM, vLLM's own (see
    # kvpool.vllm.events), which encode to the same bytes.
    _BlockStored: type = BlockStored
    _BlockRemoved: type = BlockRemoved
    _AllBlocksCleared: type = AllBlocksCleared
    # vLLM 0.15.0-0.32.0 count the null block's ref_cnt in touch and
    # free_blocks (it may go below 0); only 0.33 skips it (the core's rule).
    _kvpool_counts_null = True

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: KVCacheMetricsCollector | None = None,
    ) -> None:
        # The core validates num_gpu_blocks and builds the blocks (the
        # compiled core already did, in __cinit__; its __init__ is a no-op).
        super().__init__(num_gpu_blocks)
        _check_positive_int("hash_block_size", hash_block_size)
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        self.metrics_collector = metrics_collector

    def _cache_full_blocks_py(
        self,
        request: Any,
        blocks: list[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """``cache_full_blocks``, all cases. The core's
        ``cache_full_blocks`` calls it, except for the compiled core's
        fast path (events off, ``block_size == hash_block_size``)."""
        if num_cached_blocks >= num_full_blocks:
            return
        if block_size == self.hash_block_size:
            block_hashes = request.block_hashes
        else:
            _check_positive_int("block_size", block_size)
            if block_size % self.hash_block_size:
                raise ValueError(
                    f"block_size ({block_size}) must be a multiple of "
                    f"hash_block_size ({self.hash_block_size})"
                )
            block_hashes = BlockHashListWithBlockSize(
                request.block_hashes, self.hash_block_size, block_size
            )
        stored: list[bytes] | None = [] if self.enable_kv_cache_events else None
        self._cache_blocks(
            blocks,
            num_cached_blocks,
            num_full_blocks,
            block_hashes,
            kv_cache_group_id,
            stored,
        )
        if stored is None:
            return
        # One conversion (one read of the environment) for the parent
        # and the stored hashes together.
        if num_cached_blocks == 0:
            parent_block_hash = None
            stored_hashes = convert_block_hashes(stored)
        else:
            parent_block_hash, *stored_hashes = convert_block_hashes(
                [block_hashes[num_cached_blocks - 1], *stored]
            )
        self.kv_event_queue.append(
            self._BlockStored(
                block_hashes=stored_hashes,
                parent_block_hash=parent_block_hash,
                **self._block_stored_fields(
                    request, blocks, num_cached_blocks, num_full_blocks, block_size,
                    kv_cache_group_id,
                ),
            )
        )

    def _block_stored_fields(
        self,
        request: Any,
        blocks: list[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> dict[str, Any]:
        """The ``BlockStored`` fields after the hashes (a later line's
        facade adds its own fields to these)."""
        lora = request.lora_request
        return {
            "token_ids": request.all_token_ids[
                num_cached_blocks * block_size : num_full_blocks * block_size
            ],
            "block_size": block_size,
            "lora_id": lora.adapter_id if lora else None,
            "medium": MEDIUM_GPU,
            "lora_name": lora.name if lora else None,
        }

    def _block_removed_events(self, keys: list[bytes]) -> list[Any]:
        """One ``BlockRemoved`` per evicted key, in eviction order, as vLLM
        emits them."""
        return self._removed_events(
            self._BlockRemoved, keys, MEDIUM_GPU, False, _use_int_block_hashes()
        )

    # get_new_blocks and touch come from the core, which takes a fast
    # path when there are no events and no collector, and otherwise
    # calls the two methods below.

    def _get_new_blocks_with_hooks(self, num_blocks: int) -> list[Any]:
        """``get_new_blocks`` with events and/or metrics on."""
        removed: list[bytes] | None = [] if self.enable_kv_cache_events else None
        ret = self._allocate(num_blocks, self.enable_caching, removed)
        collector = self.metrics_collector
        if collector:
            evicting = self.enable_caching
            for block in ret:
                if evicting:
                    collector.on_block_evicted(block)
                collector.on_block_allocated(block)
        if removed:
            self.kv_event_queue.extend(self._block_removed_events(removed))
        return ret

    def _maybe_evict_cached_block(self, block: Any) -> bool:
        """Drop ``block``'s hash from the prefix cache (not the block
        itself); True if it was cached."""
        removed: list[bytes] | None = [] if self.enable_kv_cache_events else None
        evicted = self._evict_block(block, removed)  # validates `block` first
        if self.metrics_collector:
            self.metrics_collector.on_block_evicted(block)
        if removed:
            self.kv_event_queue.extend(self._block_removed_events(removed))
        return evicted

    def _report_touch(self, blocks: Sequence[Any]) -> None:
        """The metrics part of ``touch`` (called only with a collector)."""
        collector = self.metrics_collector
        for block in blocks:
            collector.on_block_accessed(block)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the cached hashes of the given block ids (allocations are
        kept). Every id is checked before anything is evicted."""
        ids = list(block_ids)
        removed: list[bytes] | None = [] if self.enable_kv_cache_events else None
        self._evict_block_ids(ids, removed)
        collector = self.metrics_collector
        if collector:
            blocks = self.blocks
            for block_id in ids:
                collector.on_block_evicted(blocks[block_id])
        if removed:
            self.kv_event_queue.extend(self._block_removed_events(removed))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Only possible when no block but the
        null block is in use; returns whether the reset happened."""
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if not self._reset_cache():
            logger.warning(
                "Failed to reset prefix cache because some "
                "blocks (%d) are not freed yet",
                num_used_blocks - 1,
            )
            return False
        if self.metrics_collector:
            self.metrics_collector.reset()
        logger.info("Successfully reset prefix cache")
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(self._AllBlocksCleared())
        return True

    take_events = take_events


class NotInRelease:
    """A name a line inherits from the newer line it is written over, but
    that its vLLM release does not have (``unpin_blocks = NotInRelease()``):
    reading it, on the class or a pool, raises ``AttributeError``, so
    ``hasattr`` is False there as on that release's own pool."""

    __slots__ = ("name",)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        owner = objtype if objtype is not None else type(obj)
        raise AttributeError(f"{owner.__name__!r} object has no attribute {self.name!r}")


def bind_facade(mixin: type, core: ModuleType, module: str) -> type:
    """The ``BlockPool`` class of a line whose facade is written as ``mixin``
    (a module-level class of facade methods), over ``core``'s ``PoolCore``:
    ``class BlockPool(mixin, core.PoolCore)``, named as the line exports it
    (``module.BlockPool``). ``_core`` is ``core``, for the facade's checks."""
    return type(
        "BlockPool",
        (mixin, core.PoolCore),
        {"__doc__": mixin.__doc__, "__module__": module, "__qualname__": "BlockPool",
         "_core": core},
    )


def make_block_pool_class(core: ModuleType) -> type:
    """Build the ``BlockPool`` facade over ``core`` (compiled or pure Python)."""
    return bind_facade(BlockPoolMixin, core, "kvpool")
