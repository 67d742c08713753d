"""``BlockPool`` of the vLLM 0.33 line (mirrors ``vllm/v1/core/block_pool.py``).

The bookkeeping is the core's, shared with the 0.15 line: this facade sets
``_kvpool_line = 33``, which makes the core keep 0.33's extra per-block state
(hash token counts, the pool of each block) and apply 0.33's rules in its hot
paths -- ``free_blocks`` (uncached blocks to the head, other pools' blocks
handed to their pool), eviction of *every* key of a block, ``touch``,
``get_new_blocks`` with no events, metrics or reuse watchers, and the
no-event part of ``cache_full_blocks``. What 0.33 does around them in Python
lives here: events (tagged maps with 0.33's fields), sampled metrics, reuse
watchers, partial-block entries and their promotion, ``move_block_hashes``.

The facade is ``BlockPoolMixin``, written once at module level;
``make_block_pool_class(core)`` binds it to a core's ``PoolCore``. Older
lines subclass the mixin and override only what their release does
differently (``kvpool.v0_32`` ...).

The event classes are class attributes (``_BlockStored`` ...), so that inside
vLLM a subclass can queue vLLM's own event objects (``kvpool.vllm`` does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..block_pool import _check_positive_int, bind_facade, take_events
from ..hashing import _use_int_block_hashes
from ..metrics import KVCacheMetricsCollector
from .kv_cache_utils import (
    convert_block_hashes,
    generate_block_hash_extra_keys,
    generate_lookahead_block_hash_extra_keys,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    mm_features_window,
    resolve_block_hashes,
    to_event_extra_keys,
)
from .kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

__all__ = ["BlockPoolMixin", "PoolArgumentError", "make_block_pool_class"]

logger = logging.getLogger("kvpool.v0_33.block_pool")


def _check_count(name: str, value: Any, *, bool_ok: bool = False) -> int:
    if (isinstance(value, bool) and not bool_ok) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


class PoolArgumentError(ValueError, AssertionError):
    """A bad argument where vLLM 0.33 has an ``assert``: a ``ValueError``, as
    kvpool's policy says (raised explicitly, so also under ``python -O``),
    that code written against vLLM -- which expects ``AssertionError`` --
    catches as well."""


if TYPE_CHECKING:
    # For readers and type checkers: the mixin's methods run on a PoolCore.
    from .._core_py import PoolCore as _PoolCoreBase
else:
    _PoolCoreBase = object


class BlockPoolMixin(_PoolCoreBase):
    """Manages a pool of KV-cache blocks: allocation, freeing, the prefix
    cache (full and partial-block entries) and its LRU eviction.
    Drop-in compatible with vLLM 0.33.0's ``vllm.v1.core.block_pool.BlockPool``.

    Args:
        num_gpu_blocks: number of blocks (ids ``0..n-1``); block 0 becomes
            the ``null_block`` placeholder.
        enable_caching: prefix caching on (freed blocks keep their hashes
            and are evicted in LRU order).
        hash_block_size: the block size the request's block hashes were
            computed at; a group's block size may be a multiple of it.
        enable_kv_cache_events: queue KV-cache events for ``take_events()``.
        metrics_collector: optional sampled residency metrics.
        num_hash_lookahead_tokens: tokens after each block that its hash
            also covers (EAGLE block-drop speculative decoding).
        medium: the storage medium named in the events.

    Misuse (a double free, a foreign block, too many blocks requested, a
    hash set twice) raises ``ValueError``/``RuntimeError``/``TypeError``
    and leaves the pool as it was, also under ``python -O``, where vLLM
    asserts.
    """

    _kvpool_line = 33
    _BlockStored: type = BlockStored
    _BlockRemoved: type = BlockRemoved
    _AllBlocksCleared: type = AllBlocksCleared

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: KVCacheMetricsCollector | None = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str = MEDIUM_GPU,
    ) -> None:
        self._init_pool(
            num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
            metrics_collector,
        )
        # vLLM's own callers pass a bool (use_eagle) as well as an int.
        _check_count("num_hash_lookahead_tokens", num_hash_lookahead_tokens, bool_ok=True)
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.medium = medium

    def _init_pool(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool,
        metrics_collector: KVCacheMetricsCollector | None,
    ) -> None:
        """What every line's ``__init__`` does (older lines take fewer
        arguments and call this)."""
        # The core validated num_gpu_blocks and built the blocks.
        super().__init__(num_gpu_blocks)
        _check_positive_int("hash_block_size", hash_block_size)
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        self.metrics_collector = metrics_collector

    # -- caching full blocks ---------------------------------------------

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: list[bool] | None = None,
    ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` under the
        request's hashes at ``block_size`` (null blocks and blocks whose
        ``block_mask`` entry is false are skipped). A partial block that
        became full is promoted: its partial keys are removed first. With
        events on, queues the ``BlockRemoved`` of promoted keys and one
        ``BlockStored``."""
        if num_cached_blocks >= num_full_blocks:
            return
        raw = request.block_hashes
        hash_block_size = self.hash_block_size
        scale = 1
        if block_size == hash_block_size:
            hashes = raw
        elif type(raw) is list:
            # The core indexes the raw list at the view's positions.
            _check_positive_int("block_size", block_size)
            scale, rest = divmod(block_size, hash_block_size)
            if rest:
                raise ValueError(
                    f"block_size ({block_size}) must be a multiple of "
                    f"hash_block_size ({hash_block_size})"
                )
            hashes = raw
        else:
            hashes = resolve_block_hashes(raw, hash_block_size, block_size)
        events = self.enable_kv_cache_events
        removed: list[bytes] | None = [] if events else None
        stored: list[bytes] | None = [] if events else None
        self._cache_blocks33(
            blocks, num_cached_blocks, num_full_blocks, hashes, scale,
            kv_cache_group_id, block_size, block_mask, removed, stored,
        )
        if not events:
            return
        self._emit_block_removed_events(removed)
        if num_cached_blocks == 0:
            parent = None
        elif scale > 1:
            parent = maybe_convert_block_hash(raw[num_cached_blocks * scale - 1])
        else:
            parent = maybe_convert_block_hash(hashes[num_cached_blocks - 1])
        stored_indices = [
            i
            for i in range(num_cached_blocks, num_full_blocks)
            if not blocks[i].is_null
            and (block_mask is None or block_mask[i - num_cached_blocks])
        ]
        self.kv_event_queue.append(
            self._build_block_stored_event(
                request,
                block_hashes=convert_block_hashes(stored),
                parent_block_hash=parent,
                start_token_idx=num_cached_blocks * block_size,
                end_token_idx=num_full_blocks * block_size,
                block_size=block_size,
                kv_cache_group_id=kv_cache_group_id,
                extra_keys_list=self._event_extra_keys(request, stored_indices, block_size),
                # A generator: no per-block work unless lookahead is on.
                lookahead_token_ids=self._event_lookahead(
                    request, ((i + 1) * block_size for i in stored_indices)
                ),
            )
        )

    def _event_extra_keys(
        self, request: Any, block_indices: Sequence[int], block_size: int
    ) -> list[Any]:
        """Per block (by index, ascending): its extra keys, as the event's
        ``extra_keys`` argument takes them."""
        if (
            not request.lora_request
            and not request.mm_features
            and not request.cache_salt
            and request.prompt_embeds is None
        ):
            # A plain request: no block has extra keys (the common case,
            # without a generator call per block). kvpool/_manager.pyx's
            # _plain tests the same four fields: change both together.
            return [None] * len(block_indices)
        keys_list = []
        mm_idx = 0
        for i in block_indices:
            start = i * block_size
            keys, mm_idx = self._generate_event_extra_keys(
                request, start, start + block_size, mm_idx
            )
            keys_list.append(keys)
        return keys_list

    def _event_lookahead(self, request: Any, block_ends: Iterable[int]) -> list[list[int]] | None:
        """Per block (by its end token), the tokens after it that its hash
        covers; None when lookahead hashing is off."""
        n = self.num_hash_lookahead_tokens
        if not n:
            return None
        tokens = request.all_token_ids
        return [tokens[end : end + n] for end in block_ends]

    def _generate_event_extra_keys(
        self, request: Any, start: int, end: int, start_mm_idx: int
    ) -> tuple[tuple[Any, ...] | None, int]:
        # The event's extra keys cover the same tokens as the block hash.
        if self.num_hash_lookahead_tokens:
            return generate_lookahead_block_hash_extra_keys(
                request, start, end, end + self.num_hash_lookahead_tokens, start_mm_idx
            )
        return generate_block_hash_extra_keys(request, start, end, start_mm_idx)

    # The keywords _build_block_stored_event (of the class that defines
    # both) passes, in its order. For a plain request -- no LoRA, multimodal
    # items, cache salt or prompt embeddings, lookahead hashing off -- every
    # one not taken from the blocks is None but the medium and the session
    # id, and kvpool's manager builds the event in C from this list
    # (``kvpool._manager``; a subclass that overrides the builder, its extra
    # keys or its lookahead keeps this Python path).
    _PLAIN_STORED_KEYWORDS: tuple[str, ...] = (
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
        "medium", "lora_name", "extra_keys", "group_idx", "session_id",
        "lookahead_token_ids",
    )

    def _build_block_stored_event(
        self,
        request: Any,
        block_hashes: list[Any] | None,
        parent_block_hash: Any,
        start_token_idx: int,
        end_token_idx: int,
        block_size: int,
        kv_cache_group_id: int,
        extra_keys_list: list[Any],
        lookahead_token_ids: list[list[int]] | None,
    ) -> Any:
        """The ``BlockStored`` event, with this release's fields (each line
        whose release changed them has its own)."""
        lora = request.lora_request
        return self._BlockStored(
            block_hashes=block_hashes,
            parent_block_hash=parent_block_hash,
            token_ids=request.all_token_ids[start_token_idx:end_token_idx],
            block_size=block_size,
            lora_id=lora.adapter_id if lora else None,
            medium=self._event_medium,
            lora_name=lora.name if lora else None,
            extra_keys=to_event_extra_keys(extra_keys_list),
            group_idx=kv_cache_group_id,
            session_id=request.session_id,
            lookahead_token_ids=lookahead_token_ids,
        )

    def emit_cached_block_events(
        self, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None:
        """Queue a ``BlockStored`` for the ``num_cached_blocks`` blocks of a
        prefix-cache hit (no block changes), so that event consumers learn
        the blocks were reused."""
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        cached = [hashes[i] for i in range(num_cached_blocks)]
        # A hit is a prefix from block 0: no parent.
        self.kv_event_queue.append(
            self._build_block_stored_event(
                request,
                block_hashes=convert_block_hashes(cached),
                parent_block_hash=None,
                start_token_idx=0,
                end_token_idx=num_cached_blocks * block_size,
                block_size=block_size,
                kv_cache_group_id=kv_cache_group_id,
                extra_keys_list=self._event_extra_keys(
                    request, range(num_cached_blocks), block_size
                ),
                lookahead_token_ids=self._event_lookahead(
                    request, range(block_size, (num_cached_blocks + 1) * block_size, block_size)
                ),
            )
        )

    # -- partial-block entries -------------------------------------------

    def cache_partial_block(
        self,
        request: Any,
        block: Any,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> bytes | None:
        """Make ``block`` reachable from the prefix boundary at
        ``num_tokens`` (a multiple of ``hash_block_size``) inside it:
        register the request's hash at that boundary as a key of the
        block -- its ``block_hash`` if it has none, else a further key
        (``cached_block_hashes_by_block``). A key covering fewer tokens is
        replaced; ``replace_existing_hashes`` drops every key first (the
        block's contents changed). Returns the key, or None for the null
        block."""
        if block.is_null:
            return None
        self._check_own(block)
        self._check_partial_block_args(num_tokens, block_size, replace_existing_hashes)
        hash_block_size = self.hash_block_size
        block_hash = self._get_partial_block_hash(request, num_tokens)
        num_hash_tokens = (num_tokens // hash_block_size) * hash_block_size
        key = make_block_hash_with_group_id(block_hash, kv_cache_group_id)
        cache = self.cached_block_hash_to_block
        already_cached = block.block_hash == key or cache.contain(key, block.block_id)
        if replace_existing_hashes:
            self._emit_block_removed_events(self._remove_cached_block_hashes(block))
            already_cached = False
        elif (
            not already_cached
            and block.block_hash is not None
            and block.block_hash_num_tokens is not None
            and block.block_hash_num_tokens < num_hash_tokens
        ):
            self._emit_block_removed_events(self._remove_cached_block_hashes(block))
        self._insert_block_hash(key, block, num_tokens=num_hash_tokens)
        if self.enable_kv_cache_events and not already_cached:
            self.kv_event_queue.append(
                self._partial_block_stored_event(
                    request, block_hash, num_tokens, kv_cache_group_id
                )
            )
        return key

    def _check_partial_block_args(
        self, num_tokens: int, block_size: int, replace_existing_hashes: bool
    ) -> None:
        """``cache_partial_block``'s argument checks (vLLM asserts them;
        ``num_tokens`` is checked with the request's hashes)."""
        _check_positive_int("block_size", block_size)
        if block_size % self.hash_block_size:
            raise PoolArgumentError(
                f"block_size ({block_size}) must be a multiple of "
                f"hash_block_size ({self.hash_block_size})"
            )

    def _partial_block_stored_event(
        self, request: Any, block_hash: bytes, num_tokens: int, kv_cache_group_id: int
    ) -> Any:
        parent, start = self._get_partial_block_parent_hash_and_start(request, num_tokens)
        keys, _ = self._generate_event_extra_keys(
            request, start, num_tokens, self._partial_block_mm_idx(request, start, num_tokens)
        )
        return self._build_block_stored_event(
            request,
            block_hashes=[maybe_convert_block_hash(block_hash)],
            parent_block_hash=None if parent is None else maybe_convert_block_hash(parent),
            start_token_idx=start,
            end_token_idx=num_tokens,
            block_size=num_tokens - start,
            kv_cache_group_id=kv_cache_group_id,
            extra_keys_list=[keys],
            lookahead_token_ids=self._event_lookahead(request, [num_tokens]),
        )

    def _partial_block_mm_idx(self, request: Any, start: int, end: int) -> int:
        """The multimodal item to look for a partial block's extra keys
        from: the first that overlaps ``[start, end)``."""
        features = request.mm_features
        if start > 0 and features:
            last = features[-1].mm_position
            if last.offset + last.length > start:
                return mm_features_window(features, start, end)[0]
        return 0

    def _get_partial_block_hash(self, request: Any, num_tokens: int) -> bytes:
        _check_count("num_tokens", num_tokens)
        num_hash_blocks, rest = divmod(num_tokens, self.hash_block_size)
        if rest or not 0 < num_hash_blocks <= len(request.block_hashes):
            raise PoolArgumentError(
                f"num_tokens ({num_tokens}) must be a positive multiple of "
                f"hash_block_size ({self.hash_block_size}) covered by the "
                f"request's {len(request.block_hashes)} block hashes"
            )
        # Each hash chains over its whole prefix: the boundary's hash is the key.
        return request.block_hashes[num_hash_blocks - 1]

    def _get_partial_block_parent_hash_and_start(
        self, request: Any, num_tokens: int
    ) -> tuple[bytes | None, int]:
        num_hash_blocks = num_tokens // self.hash_block_size
        parent = request.block_hashes[num_hash_blocks - 2] if num_hash_blocks > 1 else None
        return parent, (num_hash_blocks - 1) * self.hash_block_size

    def _check_own(self, block: Any) -> None:
        if getattr(block, "pool", None) is not self:
            if not isinstance(block, self._core.KVCacheBlock):
                raise TypeError(f"expected a KVCacheBlock, got {type(block).__name__}")
            raise ValueError(f"block {block.block_id} does not belong to this pool")

    def _remove_cached_block_hashes(self, block: Any) -> list[bytes]:
        """Drop every key of ``block`` from the cache (no metrics, no
        events); the keys removed, in order."""
        removed: list[bytes] = []
        self._evict_block(block, removed)
        return removed

    @property
    def _event_medium(self) -> str:
        """The medium the events name (0.29's say GPU: it has no ``medium``)."""
        return self.medium

    def _emit_block_removed_events(self, keys: list[bytes] | None) -> None:
        if not keys or not self.enable_kv_cache_events:
            return
        self.kv_event_queue.extend(self._removed_events(
            self._BlockRemoved, keys, self._event_medium, True, _use_int_block_hashes()
        ))

    def _insert_block_hash(self, block_hash_with_group_id: bytes, block: Any,
                           num_tokens: int | None) -> None:
        """Cache ``block`` under the key: as its ``block_hash`` (covering
        ``num_tokens``) if it has none, else as a further key. Nothing
        happens if it is already cached under it."""
        key = block_hash_with_group_id
        if not isinstance(key, bytes):
            raise TypeError(f"a hash key must be bytes, got {type(key).__name__}")
        self._check_own(block)
        if block.block_hash == key:
            return
        cache = self.cached_block_hash_to_block
        if cache.contain(key, block.block_id):
            return
        if block.block_hash is None:
            block.set_block_hash(key, num_tokens=num_tokens)
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, set()).add(key)
        cache.insert(key, block)

    def move_block_hashes(self, src_block: Any, dst_block: Any) -> None:
        """Re-point ``src_block``'s keys to ``dst_block`` (a private copy
        the prefix cache keeps while the owner of ``src_block`` writes on).
        No events: the entries stay live."""
        self._check_own(src_block)
        self._check_own(dst_block)
        if dst_block.block_hash is not None:
            raise RuntimeError(f"block {dst_block.block_id} already has a hash")
        if dst_block.block_id in self.cached_block_hashes_by_block:
            raise RuntimeError(f"block {dst_block.block_id} already has hash keys")
        num_tokens = src_block.block_hash_num_tokens
        for key in self._remove_cached_block_hashes(src_block):
            # num_tokens applies to the first (primary) key only.
            self._insert_block_hash(key, dst_block, num_tokens=num_tokens)

    # -- allocation, reuse and freeing -----------------------------------

    # get_new_blocks, touch and free_blocks come from the core; it takes
    # the fast path when there are no events, no collector and no reuse
    # watchers, and otherwise calls the hook below.

    def _get_new_blocks_with_hooks(self, num_blocks: int) -> list[Any]:
        """``get_new_blocks`` with events, metrics or reuse watchers."""
        _check_count("num_blocks", num_blocks)
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(
                f"Cannot get {num_blocks} free blocks from the pool "
                f"({self.get_num_free_blocks()} free)"
            )
        ret = self.free_block_queue.popleft_n(num_blocks)
        caching = self.enable_caching
        removed: list[bytes] | None = [] if self.enable_kv_cache_events else None
        try:
            if self._reuse_watchers:
                # Before eviction: a watcher still sees the old contents.
                self._notify_reuse(ret)
        finally:
            # The blocks are out of the queue: they must be claimed even
            # if a watcher raised.
            self._claim(ret, caching, removed)
        collector = self.metrics_collector
        if collector:
            for block in ret:
                if caching:
                    collector.on_block_evicted(block)
                collector.on_block_allocated(block)
        self._emit_block_removed_events(removed)
        return ret

    def _notify_reuse(self, blocks: Iterable[Any]) -> None:
        watchers = self._reuse_watchers
        for block in blocks:
            watcher = watchers.pop(block.block_id, None)
            if watcher is not None:
                watcher(block)

    def unpin_blocks(self, blocks: Iterable[Any], on_reuse: Callable[[Any], None]) -> None:
        """Drop one reference from each block, which stays readable until
        the pool reuses it: blocks reaching 0 go to the tail of the free
        queue (whatever their hash), and ``on_reuse(block)`` is called
        when ``get_new_blocks`` hands the block out again (or the prefix
        cache is reset)."""
        unpinned = self._unpin(blocks)  # checked and released
        watchers = self._reuse_watchers
        for block in unpinned:
            watchers[block.block_id] = on_reuse

    def _maybe_evict_cached_block(self, block: Any) -> bool:
        """Drop every key of ``block`` from the prefix cache (not the
        block itself); True if any key was cached."""
        removed: list[bytes] = []
        evicted = self._evict_block(block, removed)  # validates `block` first
        if self.metrics_collector:
            self.metrics_collector.on_block_evicted(block)
        self._emit_block_removed_events(removed)
        return evicted

    def _report_touch(self, blocks: Sequence[Any]) -> None:
        collector = self.metrics_collector
        for block in blocks:
            if not block.is_null:
                collector.on_block_accessed(block)

    def is_block_writable(self, block: Any) -> bool:
        """Whether ``block``'s sole owner may write into it: in use by
        exactly one request and in no cache entry."""
        return not block.is_null and block.ref_cnt == 1 and block.block_hash is None

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the cache keys of the given block ids (allocations are
        kept). Every id is checked before anything is evicted."""
        ids = list(block_ids)
        removed: list[bytes] = []
        self._evict_block_ids(ids, removed)
        collector = self.metrics_collector
        if collector:
            blocks = self.blocks
            for block_id in ids:
                collector.on_block_evicted(blocks[block_id])
        self._emit_block_removed_events(removed)

    def reset_prefix_cache(self) -> bool:
        """Forget every cache key and fire the pending reuse watchers.
        Only possible when no block but the null block is in use."""
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used_blocks != 1:
            logger.warning(
                "Failed to reset prefix cache because some "
                "blocks (%d) are not freed yet",
                num_used_blocks - 1,
            )
            return False
        # As vLLM: the map is emptied first, the watchers see the blocks
        # with their hashes, then the hashes go.
        self._clear_map()
        self.cached_block_hashes_by_block.clear()
        if self._reuse_watchers:
            blocks = self.blocks
            self._notify_reuse([blocks[i] for i in list(self._reuse_watchers)])
        self._reset_hashes()
        if self.metrics_collector:
            self.metrics_collector.reset()
        logger.info("Successfully reset prefix cache")
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(self._AllBlocksCleared())
        return True

    take_events = take_events


def make_block_pool_class(core: ModuleType) -> type:
    """The 0.33 ``BlockPool``: ``BlockPoolMixin`` over ``core``'s ``PoolCore``
    (``kvpool._core`` or ``kvpool._core_py``)."""
    return bind_facade(BlockPoolMixin, core, "kvpool.v0_33")

