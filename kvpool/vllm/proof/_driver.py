"""A lock-step driver for the block pools of every vLLM release 0.15.0 ...
0.34.0, shared by the pool traces of ``python -m kvpool.vllm --prove``
(``kvpool.vllm.proof.pool``, which ``tests/vllm_release/test_pool_diff.py``
runs per release), ``tests/vllm33/test_pool_diff.py`` and the hypothesis
state machine (``tests/test_v033_stateful.py``).

It imports neither vLLM nor kvpool: the pools, the event classes, the request
hasher and the LoRA class are handed in. What the release under test has is
read off its own classes (``Features.detect``: signatures, attributes,
``KVCacheBlock`` fields, event struct fields), and each operation is used only
where the release has it; without a ``Features`` the driver drives the newest
API (vLLM 0.33.0). The first ``Side`` is the reference; every operation is
chosen from the reference's state so that it is *valid* (the release would
not assert on it, kvpool would not refuse it: see SPEC section 6), then
applied to every side with the same block ids, and the results and the
complete observable state of every side are compared after every step. The
first difference raises ``Mismatch`` naming the step, the operation and both
states.

The operations are driven the way vLLM's managers drive the pool:
requests with chained block hashes, shared prefixes, LoRA / cache_salt /
multimodal features / session ids, prefix hits (``get_cached_block`` per
hash, ``touch``, ``emit_cached_block_events``), ``get_new_blocks``,
``cache_full_blocks`` (with and without ``block_mask``), partial entries and
partial->full promotions, ``move_block_hashes`` (copy-on-write),
``block.ref_cnt += 1`` from outside, ``free_blocks`` of a request's blocks in
reverse (per group or deferred in one call, null blocks included, to the
front with ``prepend=``), ``unpin_blocks`` with reuse watchers, sliding
windows, ``evict_blocks``, ``_maybe_evict_cached_block``,
``reset_prefix_cache``, the offload connector's ``iter_blocks_after`` /
``_insert_block_hash`` / ``kv_event_queue.append``, direct free-queue
operations, and frees that mix in blocks of another pool (in both
directions).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import itertools
import random
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import msgspec

MEDIUMS = ("GPU", "CPU", "STORAGE")
MAX_REQUESTS = 6
MAX_HOLDERS = 6


class Mismatch(AssertionError):
    """The sides disagree (a difference in the pool under test)."""


class HarnessError(AssertionError):
    """The reference refused an operation: the generator made an invalid one."""


# ---------------------------------------------------------------------------
# What the release under test has


# The event fields of vLLM 0.33.0 (the newest API).
_STORED_033 = (
    "block_hashes parent_block_hash token_ids block_size lora_id medium lora_name extra_keys "
    "group_idx kv_cache_spec_kind kv_cache_spec_sliding_window locality ownership session_id "
    "lookahead_token_ids"
).split()


@dataclass(frozen=True)
class Features:
    """The pool API of one vLLM release, as the driver uses it. ``detect``
    reads it off the release's own classes; the defaults are vLLM 0.33.0's."""

    # BlockPool.__init__'s parameters after self, in order (positional
    # construction passes them all).
    init_params: tuple[str, ...] = (
        "num_gpu_blocks",
        "enable_caching",
        "hash_block_size",
        "enable_kv_cache_events",
        "metrics_collector",
        "num_hash_lookahead_tokens",
        "medium",
    )
    block_mask: bool = True  # cache_full_blocks(block_mask=)  (0.22+)
    free_prepend: bool = False  # free_blocks(prepend=)  (0.23 only)
    prepend_n: bool = True  # FreeKVCacheBlockQueue.prepend_n  (0.23+)
    # cache_partial_block, set_block_hash, block_hash_num_tokens, several
    # keys per block (cached_block_hashes_by_block), _insert_block_hash,
    # BlockHashToBlockMap.contain, promotions  (0.24+)
    partial: bool = True
    replace_hashes: bool = True  # cache_partial_block(replace_existing_hashes=)  (0.30+)
    emit_cached: bool = True  # emit_cached_block_events  (0.26+)
    move_hashes: bool = True  # move_block_hashes  (0.26+)
    iter_after: bool = True  # FreeKVCacheBlockQueue.iter_blocks_after  (0.26+)
    writable: bool = True  # is_block_writable  (0.29+)
    block_pool_attr: bool = True  # KVCacheBlock.pool: cross-pool frees  (0.30+)
    unpin: bool = True  # unpin_blocks + reuse watchers  (0.30+)
    stored_fields: tuple[str, ...] = tuple(_STORED_033)  # BlockStored's struct fields
    # KVCacheBlock._block_hash (and _block_hash_num_tokens): the hash fields'
    # private names  (before 0.34: plain fields from then on)
    private_hash_fields: bool = True
    weak_pool: bool = False  # KVCacheBlock.pool is a weak reference  (0.34+)
    evict_first: bool = False  # free_blocks(evict_first=)  (0.34+)
    map_ids: bool = False  # the map's _cache shows block ids, _dup_ids the shared keys  (0.34+)

    @property
    def medium(self) -> bool:  # the medium argument  (0.30+)
        return "medium" in self.init_params

    @property
    def lookahead(self) -> bool:  # num_hash_lookahead_tokens  (0.33)
        return "num_hash_lookahead_tokens" in self.init_params

    @classmethod
    def detect(cls, pool_cls: type, stored_cls: type) -> Features:
        """The features of ``pool_cls`` (a release's own ``BlockPool``) and
        ``stored_cls`` (its ``BlockStored``), from their signatures,
        attributes and fields (a throw-away two-block pool shows the
        instance attributes, its block the block's fields)."""

        def params(fn: Any) -> list[str]:
            return list(inspect.signature(fn).parameters)[1:]

        pool = pool_cls(2, True, 1)
        block, queue = pool.blocks[1], pool.free_block_queue
        return cls(
            init_params=tuple(params(pool_cls.__init__)),
            block_mask="block_mask" in params(pool_cls.cache_full_blocks),
            free_prepend="prepend" in params(pool_cls.free_blocks),
            prepend_n=hasattr(queue, "prepend_n"),
            partial=hasattr(pool, "cache_partial_block")
            and hasattr(pool, "cached_block_hashes_by_block")
            and hasattr(block, "set_block_hash")
            and hasattr(block, "block_hash_num_tokens"),
            replace_hashes=hasattr(pool, "cache_partial_block")
            and "replace_existing_hashes" in params(pool_cls.cache_partial_block),
            emit_cached=hasattr(pool, "emit_cached_block_events"),
            move_hashes=hasattr(pool, "move_block_hashes"),
            iter_after=hasattr(queue, "iter_blocks_after"),
            writable=hasattr(pool, "is_block_writable"),
            block_pool_attr=hasattr(block, "pool"),
            unpin=hasattr(pool, "unpin_blocks"),
            stored_fields=tuple(stored_cls.__struct_fields__),
            private_hash_fields=hasattr(block, "_block_hash"),
            weak_pool=isinstance(getattr(block, "pool", None), weakref.ref),
            evict_first="evict_first" in params(pool_cls.free_blocks),
            map_ids=hasattr(pool.cached_block_hash_to_block, "_dup_ids"),
        )

    def describe(self) -> str:
        """One line: the optional features present."""
        flags = [f.name for f in dataclasses.fields(self) if f.type == "bool" and getattr(self, f.name)]
        flags += [p for p in ("medium", "lookahead") if getattr(self, p)]
        extra = [f for f in self.stored_fields if f not in _STORED_033[:7]]
        return f"{', '.join(flags) or 'base API'}; BlockStored +{extra}"


LATEST = Features()


# ---------------------------------------------------------------------------
# Configuration and requests


@dataclass(frozen=True)
class Config:
    num_blocks: int
    enable_caching: bool
    hash_block_size: int
    group_block_sizes: tuple[int, ...]  # block size of each KV-cache group
    sliding: tuple[bool, ...]  # per group: sliding window (null blocks in tables)
    events: bool
    metrics: bool
    sample_rate: float  # of the metrics collector (it samples with the global RNG)
    lookahead: int  # num_hash_lookahead_tokens
    medium: str
    int_hashes: bool  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
    foreign_blocks: int  # size of the other pool of cross-pool frees
    positional: bool = False  # constructor arguments by position, not keyword

    @classmethod
    def random(cls, r: Any, features: Features = LATEST) -> Config:
        """A random configuration (the same draws for every release; what
        the release lacks is then left at its default)."""
        hbs = r.choice((1, 2, 2, 4))
        layouts = [
            (hbs,),
            (hbs, hbs),
            (hbs, 2 * hbs),
            (2 * hbs, hbs, 4 * hbs),
            (3 * hbs, 3 * hbs),
        ]
        sizes = r.choice(layouts)
        cfg = cls(
            num_blocks=r.randint(4, 16) * len(sizes) + 2 if r.random() < 0.95 else r.randint(1, 3),
            enable_caching=r.random() < 0.85,
            hash_block_size=hbs,
            group_block_sizes=sizes,
            sliding=tuple(r.random() < 0.3 for _ in sizes),
            events=r.random() < 0.8,
            metrics=r.random() < 0.6,
            sample_rate=r.choice((1.0, 1.0, 0.5)),
            lookahead=r.choice((0, 0, 0, 1, 3)),
            medium=r.choice(MEDIUMS) if r.random() < 0.5 else "GPU",
            int_hashes=r.random() < 0.75,
            foreign_blocks=r.randint(2, 8),
            positional=r.random() < 0.2,
        )
        return dataclasses.replace(
            cfg,
            lookahead=cfg.lookahead if features.lookahead else 0,
            medium=cfg.medium if features.medium else "GPU",
        )

    def pool_args(self, collector: Any, features: Features = LATEST) -> tuple[tuple, dict]:
        """Positional and keyword constructor arguments: as vLLM's
        ``KVCacheCoordinator`` passes them (keywords, the medium only when it
        is not the default), or every parameter the release has, by
        position."""
        values: dict[str, Any] = dict(
            num_gpu_blocks=self.num_blocks,
            enable_caching=self.enable_caching,
            hash_block_size=self.hash_block_size,
            enable_kv_cache_events=self.events,
            metrics_collector=collector,
            num_hash_lookahead_tokens=self.lookahead,
            medium=self.medium,
        )
        unknown = set(features.init_params) - set(values)
        if unknown:
            raise HarnessError(f"BlockPool.__init__ has parameters the driver does not know: {unknown}")
        if self.positional:
            return tuple(values[n] for n in features.init_params), {}
        kwargs = {n: values[n] for n in features.init_params if n != "medium"}
        if self.medium != "GPU":
            kwargs["medium"] = self.medium
        return (), kwargs

    @property
    def classes(self) -> dict[int, list[int]]:
        """Group ids by block size (groups of one size are looked up together)."""
        out: dict[int, list[int]] = {}
        for g, bs in enumerate(self.group_block_sizes):
            out.setdefault(bs, []).append(g)
        return out


class FakeRequest:
    """What vLLM 0.33.0's pool and block hasher read of a ``Request``."""

    def __init__(
        self,
        request_id: str,
        tokens: list[int],
        num_prompt_tokens: int,
        lora_request: Any,
        cache_salt: str | None,
        mm_features: list[Any],
        session_id: str | None,
    ) -> None:
        self.request_id = request_id
        self.all_token_ids = tokens
        self.num_prompt_tokens = num_prompt_tokens
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features = mm_features
        self.session_id = session_id
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes: dict = {}
        self.block_hashes: list[bytes] = []

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def _all_token_ids(self) -> list[int]:
        # What vLLM 0.34's block hasher slices (a token buffer there).
        return self.all_token_ids

    def __repr__(self) -> str:
        lora = self.lora_request.lora_name if self.lora_request else None
        return (
            f"<{self.request_id}: {self.num_tokens} tokens, prompt {self.num_prompt_tokens}, "
            f"{len(self.block_hashes)} hashes, lora={lora}, salt={self.cache_salt}, "
            f"mm={[(f.identifier, f.mm_position.offset, f.mm_position.length) for f in self.mm_features]}, "
            f"session={self.session_id}>"
        )


class FakeLoRARequest:
    """The attributes of vLLM's ``LoRARequest`` that hashing and events read."""

    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str) -> None:
        self.lora_name = lora_name
        self.lora_int_id = lora_int_id
        self.lora_path = lora_path

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name


def fake_mm_feature(identifier: str, offset: int, length: int) -> Any:
    return SimpleNamespace(
        identifier=identifier, mm_position=SimpleNamespace(offset=offset, length=length)
    )


@dataclass
class Family:
    """A shared prompt prefix with the request attributes that enter its hashes."""

    prefix: list[int]
    lora: Any
    cache_salt: str | None
    mm: list[tuple[str, int, int]]
    embeds: bool = False  # prompt embeddings (their digests are extra keys)


@dataclass
class Req:
    fake: FakeRequest
    blocks: dict[int, list[int]]  # group -> block ids (0: the null block)
    num_cached: dict[int, int]
    alloc_tokens: int


@dataclass
class Side:
    label: str
    pool: Any
    foreign: Any  # another pool: its blocks are freed through `pool` and back
    stored_cls: type  # the BlockStored class of the pool's API line
    collector: Any
    watcher_log: list = field(default_factory=list)
    # The reference only: (start, length) in kv_event_queue of each block's
    # BlockRemoved events; called with clear=True when the events are taken.
    removal_segments: Callable[[bool], list[tuple[int, int]]] | None = None


def _id(block: Any) -> int | None:
    return None if block is None else block.block_id


def _ids(blocks: Iterable[Any] | None) -> list[int] | None:
    return None if blocks is None else [b.block_id for b in blocks]


def _short(value: Any, limit: int = 1500) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# ---------------------------------------------------------------------------
# State


def _map_entries(hash_map: Any) -> dict[bytes, list[int]]:
    """Every key of the map and the ids of its blocks in insertion order,
    from its private fields: ``_cache`` maps a key to a block or to a dict
    by id (0.15-0.33), or to the earliest id with the shared keys' ids in
    ``_dup_ids`` (0.34)."""
    dup_ids = getattr(hash_map, "_dup_ids", None)
    if dup_ids is not None:
        return {
            key: list(dup_ids[key]) if key in dup_ids else [value]
            for key, value in hash_map._cache.items()
        }
    return {
        key: list(value) if isinstance(value, dict) else [value.block_id]
        for key, value in hash_map._cache.items()
    }


def _map_state(pool: Any) -> dict[str, Any]:
    hash_map = pool.cached_block_hash_to_block
    entries = {}
    for key, ids in _map_entries(hash_map).items():
        first = hash_map.get_one_block(key)
        entries[key] = (sorted(ids), _id(first))
    return {"len": len(hash_map), "entries": entries}


def block_field_names(features: Features = LATEST) -> list[str]:
    """The names of ``block_fields``' entries."""
    names = ["block_id", "ref_cnt", "is_null", "block_hash"]
    if features.partial:
        names.append("block_hash_num_tokens")
    if features.private_hash_fields:
        names.append("_block_hash")
        if features.partial:
            names.append("_block_hash_num_tokens")
    names += ["prev", "next"]
    if features.block_pool_attr:
        names.append("pool")
    return names


def block_fields(b: Any, pool: Any, features: Features = LATEST) -> tuple:
    """A block's fields (those of the release), its neighbours as ids, its
    pool as "self" (``pool``), "other" or None."""
    out = [b.block_id, b.ref_cnt, b.is_null, b.block_hash]
    if features.partial:
        out.append(b.block_hash_num_tokens)
    if features.private_hash_fields:
        out.append(b._block_hash)
        if features.partial:
            out.append(b._block_hash_num_tokens)
    out += [_id(b.prev_free_block), _id(b.next_free_block)]
    if features.block_pool_attr:
        owner, how = b.pool, ""
        if isinstance(owner, weakref.ref):
            # 0.34: a weak reference, the pool's own ``_weak_self``.
            same = owner is getattr(pool, "_weak_self", None)
            how = " (weak)" if same else " (weak, not the pool's _weak_self)"
            owner = owner()
        label = "self" if owner is pool and pool is not None else (None if owner is None else "other")
        out.append(f"{label}{how}" if how else label)
    return tuple(out)


def pool_state(
    pool: Any, collector: Any = None, features: Features = LATEST, null_ref_cnt: bool = True
) -> dict[str, Any]:
    """Everything observable of a pool of the release (the event queue as
    its length: the events themselves are compared when taken). Without
    ``null_ref_cnt`` the null block's ``ref_cnt`` is left out (a pool that
    does not maintain it, by design)."""
    blocks = pool.blocks
    queue = pool.free_block_queue
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    state: dict[str, Any] = {
        "config": (
            pool.num_gpu_blocks,
            pool.enable_caching,
            pool.hash_block_size,
            pool.enable_kv_cache_events,
            pool.medium if features.medium else None,
            pool.num_hash_lookahead_tokens if features.lookahead else None,
            _id(pool.null_block),
            pool.metrics_collector is collector,
        ),
        "blocks": [block_fields(b, pool, features) for b in blocks],
        "queue": _ids(queue.get_all_free_blocks()),
        "sentinels": (
            head.block_id,
            tail.block_id,
            _id(head.prev_free_block),
            _id(head.next_free_block),
            _id(tail.prev_free_block),
            _id(tail.next_free_block),
        ),
        "num_free": (queue.num_free_blocks, pool.get_num_free_blocks()),
        "usage": (pool.get_usage(), type(pool.get_usage()).__name__),
        "map": _map_state(pool),
        "reprs": [repr(b) for b in blocks],
        "event_queue": (type(pool.kv_event_queue).__name__, len(pool.kv_event_queue)),
    }
    if not null_ref_cnt:
        state["blocks"][0] = (*state["blocks"][0][:1], "(not compared)", *state["blocks"][0][2:])
        state["reprs"][0] = re.sub(r"ref_cnt=-?\d+", "ref_cnt=(not compared)", state["reprs"][0])
    if features.partial:
        state["hashes_by_block"] = (
            type(pool.cached_block_hashes_by_block).__name__,
            {
                bid: (type(keys).__name__, sorted(keys))
                for bid, keys in pool.cached_block_hashes_by_block.items()
            },
        )
    if features.writable:
        state["writable"] = [pool.is_block_writable(b) for b in blocks]
    if collector is not None:
        state["metrics"] = (
            sorted(collector.block_metrics),
            {bid: len(m.access_history) for bid, m in collector.block_metrics.items()},
            [len(e.reuse_gaps_seconds) for e in collector._eviction_events],
        )
    return state


def check_invariants(pool: Any, features: Features = LATEST) -> None:
    """SPEC section 2: ref_cnt == 0 iff in the free queue
    (non-null blocks), no block twice in the queue, num_free matches the queue,
    the links walk the queue, every hash key of a block is in the map under
    that block and every map entry points back."""

    def fail(msg: str) -> None:
        raise AssertionError(f"invariant broken ({type(pool).__module__}): {msg}")

    blocks = pool.blocks
    queue = pool.free_block_queue
    null = pool.null_block
    if null is not blocks[0] or not null.is_null:
        fail(f"bad null block {null!r}")
    free = queue.get_all_free_blocks()
    free_ids = _ids(free)
    if len(set(free_ids)) != len(free_ids):
        fail(f"a block twice in the free queue: {free_ids}")
    if not len(free) == queue.num_free_blocks == pool.get_num_free_blocks():
        fail(
            f"{len(free)} blocks in the queue, num_free_blocks={queue.num_free_blocks}, "
            f"get_num_free_blocks()={pool.get_num_free_blocks()}"
        )
    if 0 in free_ids:
        fail("the null block is in the free queue")
    free_set = set(free_ids)
    for b in free:
        if b is not blocks[b.block_id]:
            fail(f"a foreign block in the free queue: {b!r}")
    for b in blocks[1:]:
        if (b.ref_cnt == 0) != (b.block_id in free_set):
            fail(f"ref_cnt/free-queue mismatch: block {b.block_id} ref_cnt={b.ref_cnt}")
        if b.ref_cnt < 0:
            fail(f"negative ref_cnt on block {b.block_id}")
    chain = [queue.fake_free_list_head, *free, queue.fake_free_list_tail]
    for left, right in zip(chain, chain[1:]):
        if left.next_free_block is not right or right.prev_free_block is not left:
            fail(f"broken links between {_id(left)} and {_id(right)}")
    for b in blocks:
        if b.block_id not in free_set and (
            b.prev_free_block is not None or b.next_free_block is not None
        ):
            fail(f"block {b.block_id} is outside the queue but linked")

    hash_map = pool.cached_block_hash_to_block
    by_block = pool.cached_block_hashes_by_block if features.partial else {}
    # The map's entries, read once (the blocks' keys are checked against them).
    actual = {k: set(ids) for k, ids in _map_entries(hash_map).items()}
    expected: dict[bytes, set[int]] = {}
    for b in blocks:
        extra = by_block.get(b.block_id, set())
        if b.block_hash is None:
            if extra:
                fail(f"block {b.block_id} has secondary keys but no primary hash")
            continue
        if b.is_null:
            fail("the null block carries a hash")
        for k in [b.block_hash, *extra]:
            if b.block_id not in actual.get(k, ()):
                fail(f"block {b.block_id}'s key {k!r} is not in the map under it")
            expected.setdefault(k, set()).add(b.block_id)
    for bid in by_block:
        if not 0 <= bid < len(blocks) or not by_block[bid]:
            fail(f"cached_block_hashes_by_block has a bad entry for {bid}")
    if actual != expected:
        fail(f"the map {actual} does not point back to the blocks' keys {expected}")
    if len(hash_map) != len(expected):
        fail(f"len(map)={len(hash_map)}, {len(expected)} keys on blocks")
    for k, ids in actual.items():
        for bid in ids:
            one = hash_map.get_one_block(k)
            if one is None or one is not blocks[one.block_id]:
                fail(f"get_one_block({k!r}) gives {one!r}")


# ---------------------------------------------------------------------------
# The driver


def lcm_view(hashes: Sequence[bytes], hash_block_size: int, block_size: int) -> list[bytes]:
    """vLLM 0.24+'s BlockHashListWithBlockSize: the last sub-hash of each
    block of ``block_size`` tokens."""
    scale = block_size // hash_block_size
    return [hashes[(i + 1) * scale - 1] for i in range(len(hashes) // scale)]


class Driver:
    """Runs operations on every side in lock-step and compares them.

    ``hasher(request) -> list[bytes]`` computes a request's block hashes at
    ``hash_block_size`` (covering ``num_hash_lookahead_tokens``); ``make_lora``
    and ``make_mm`` build the LoRA request and multimodal features.
    ``check_invariants_on`` names the sides whose invariants are checked.
    ``null_ref_cnt=False`` leaves the null block's ``ref_cnt`` out of the
    comparison. ``features`` is the release's API (default: 0.33.0's); ``hash_view(hashes,
    hash_block_size, block_size)`` the release's hashes of a coarser group
    (``BlockHashListWithBlockSize``).
    """

    OPS: dict[str, int] = {
        "new_request": 14,
        "grow": 8,
        "cache_more": 14,
        "cache_partial": 8,
        "finish": 9,
        "finish_unpin": 3,
        "slide": 3,
        "evict_blocks": 4,
        "maybe_evict": 3,
        "reset": 2,
        "drain_and_reset": 1,
        "lookup": 5,
        "touch_hold": 4,
        "release_holder": 7,
        "bump": 2,
        "move_hashes": 3,
        "insert_hash": 3,
        "iter_after": 3,
        "queue_ops": 3,
        "foreign_alloc": 3,
        "foreign_free": 3,
        "over_alloc": 1,
        "emit_cached": 2,
        "drain_metrics": 1,
        "cow_retained": 2,
        "swap_event_queue": 1,
    }
    # The feature each operation needs (the others run on every release).
    NEEDS: dict[str, str] = {
        "cache_partial": "partial",
        "insert_hash": "partial",
        "finish_unpin": "unpin",
        "emit_cached": "emit_cached",
        "move_hashes": "move_hashes",
        "iter_after": "iter_after",
    }

    def __init__(
        self,
        cfg: Config,
        sides: list[Side],
        hasher: Callable[[FakeRequest], list[bytes]],
        make_lora: Callable[[str, int, str], Any] = FakeLoRARequest,
        make_mm: Callable[[str, int, int], Any] = fake_mm_feature,
        make_embeds: Callable[[list[int]], Any] | None = None,
        label: str = "",
        check_invariants_on: Sequence[str] = (),
        repeats: bool = False,
        features: Features = LATEST,
        hash_view: Callable[[Sequence[bytes], int, int], Sequence[bytes]] = lcm_view,
        null_ref_cnt: bool = True,
    ) -> None:
        self.cfg = cfg
        self.features = features
        self.hash_view = hash_view
        # False: the null block's ref_cnt is not compared (a known deviation).
        self.null_ref_cnt = null_ref_cnt
        #: The operations of the release and their weights.
        self.ops = {
            name: weight
            for name, weight in self.OPS.items()
            if name not in self.NEEDS or getattr(features, self.NEEDS[name])
        }
        self.r: Any = random.Random(0)  # the generator of the current step
        self.sides = sides
        self.hasher = hasher
        self.make_lora = make_lora
        self.make_mm = make_mm
        self.make_embeds = make_embeds
        self.label = label
        self.check_invariants_on = set(check_invariants_on)
        # Whether one free_blocks call may name a block twice (each covered
        # by a reference), as vLLM 0.33's scheduler does for copy-on-write.
        self.repeats = repeats
        self.step = 0
        self.op = ""
        self.history: list[str] = []
        self.counts: collections.Counter[str] = collections.Counter()  # operations applied
        self.calls = 0
        self.requests: list[Req] = []
        self.families: list[Family] = []
        self.holders: list[list[int]] = []  # extra references on own blocks
        self.foreign_holders: list[list[int]] = []  # blocks held in the foreign pool
        self.private: set[int] = set()  # held fresh blocks (copy-on-write / offload targets)
        self.watchers = itertools.count()
        self.request_ids = itertools.count()
        self.loras = [make_lora(f"adapter-{i}", i + 1, f"/adapters/{i}") for i in range(2)]
        # Request lengths scale with the block sizes (a few blocks per group).
        self.unit = max(max(cfg.group_block_sizes), 4 * cfg.hash_block_size)
        self.check()

    # -- plumbing -----------------------------------------------------------

    @property
    def ref(self) -> Any:
        return self.sides[0].pool

    def context(self) -> str:
        recent = "\n    ".join(self.history[-12:])
        return (
            f"{self.label}\nconfig: {self.cfg}\nstep {self.step}: {self.op}\n"
            f"  previous operations (oldest first):\n    {recent}"
        )

    def note(self, text: str) -> None:
        self.op = f"{self.op}; {text}" if self.op else text

    def each(
        self,
        what: str,
        fn: Callable[[Side], Any],
        norm: Callable[[Any], Any] = lambda x: x,
        may_raise: bool = False,
    ) -> Any:
        """``fn(side)`` on every side; all must return the same (normalised)
        value or raise the same exception type (only where ``may_raise``: an
        expected refusal, raised on as ``_Raised``). Returns the reference's
        value."""
        outcomes = []
        self.calls += 1
        for side in self.sides:
            # The same global RNG state for every side: a collector with
            # sample_rate < 1 then samples the same blocks iff the pool calls
            # it the same way.
            random.seed(self.calls)
            try:
                outcomes.append(("ok", norm(fn(side))))
            except Exception as exc:  # noqa: BLE001 - compared below
                outcomes.append(("raised", type(exc).__name__, str(exc)))
        first = outcomes[0]
        if first[0] == "raised" and (first[1] == "AssertionError" or not may_raise):
            raise HarnessError(
                f"the reference raised {first[1]} in {what}: {first[2]}\n{self.context()}"
            )
        for side, out in zip(self.sides[1:], outcomes[1:]):
            if out[:2] != first[:2]:
                raise Mismatch(
                    f"{what}: {side.label} differs from {self.sides[0].label}\n"
                    f"  expected: {_short(first)}\n  got:      {_short(out)}\n{self.context()}"
                )
        if first[0] == "raised":
            raise _Raised(first[1])
        return first[1]

    def blocks(self, side: Side, ids: Iterable[int]) -> list[Any]:
        return [side.pool.blocks[i] for i in ids]

    def run(self, r: Any, steps: int) -> None:
        names = list(self.ops)
        weights = [self.ops[n] for n in names]
        for _ in range(steps):
            for _attempt in range(20):
                name = r.choices(names, weights)[0]
                if self.do(name, r):
                    break

    def do(self, name: str, r: Any) -> bool:
        """One operation (if it applies now), then the comparison."""
        self.step += 1
        self.op = ""
        self.r = r
        try:
            applied = getattr(self, f"op_{name}")(r)
        except _Raised:
            applied = True
        if applied is False:
            self.step -= 1
            return False
        self.op = f"{name}: {self.op}"
        self.counts[name] += 1
        if r.random() < 0.7:
            self.take_events()
        self.check()
        self.history.append(f"step {self.step}: {self.op}")
        return True

    def segments(self, clear: bool) -> list[tuple[int, int]]:
        ref_segments = self.sides[0].removal_segments
        return ref_segments(clear) if ref_segments else []

    def take_events(self) -> None:
        segments = self.segments(clear=True)
        self.each(
            "take_events()",
            lambda side: side.pool.take_events(),
            lambda events: _canonical_events(events, segments),
        )

    def check(self) -> None:
        states = []
        segments = self.segments(clear=False)
        for side in self.sides:
            if side.label in self.check_invariants_on:
                try:
                    check_invariants(side.pool, self.features)
                except AssertionError as exc:
                    raise Mismatch(f"{side.label}: {exc}\n{self.context()}") from None
            state = pool_state(side.pool, side.collector, self.features, self.null_ref_cnt)
            # Queued events are compared as soon as they are queued.
            state["queued_events"] = _canonical_events(list(side.pool.kv_event_queue), segments)
            state["watchers"] = list(side.watcher_log)
            state["foreign"] = pool_state(side.foreign, None, self.features, self.null_ref_cnt)
            states.append(state)
        want = states[0]
        for side, have in zip(self.sides[1:], states[1:]):
            if have != want:
                raise Mismatch(
                    f"state after the step: {side.label} differs from {self.sides[0].label}\n"
                    f"{_state_diff(want, have, self.features)}\n{self.context()}\n"
                    f"  expected state: {_short(want, 6000)}\n  got state:      {_short(have, 6000)}"
                )

    # -- choices from the reference's state ---------------------------------

    def ref_block(self, i: int) -> Any:
        return self.ref.blocks[i]

    def running_ids(self) -> list[int]:
        return [b.block_id for b in self.ref.blocks[1:] if b.ref_cnt > 0]

    def hashed_ids(self) -> list[int]:
        return [b.block_id for b in self.ref.blocks if b.block_hash is not None]

    def free_ids(self) -> list[int]:
        return _ids(self.ref.free_block_queue.get_all_free_blocks())

    def new_blocks(self, k: int, where: str = "") -> list[int]:
        """get_new_blocks(k) everywhere (ValueError everywhere if too many)."""
        self.note(f"get_new_blocks({k}){where}")
        return self.each(
            f"get_new_blocks({k})", lambda s: own(s, s.pool.get_new_blocks(k)), _ids, may_raise=True
        )

    def free_call(self, ids: list[int], *, iterator: bool, via_foreign: bool = False) -> None:
        """free_blocks of own blocks (ids; may include 0) and foreign blocks
        (("f", id)), through the pool or through the foreign pool."""

        def resolve(side: Side) -> list[Any]:
            return [
                side.foreign.blocks[i[1]] if isinstance(i, tuple) else side.pool.blocks[i]
                for i in ids
            ]

        target = "foreign.free_blocks" if via_foreign else "free_blocks"
        # 0.23's free_blocks(prepend=True): freed blocks to the front; 0.34's
        # free_blocks(evict_first=True): cached ones as well.
        prepend = self.features.free_prepend and self.r.random() < 0.3
        evict_first = self.features.evict_first and self.r.random() < 0.3
        flag = ", prepend=True" if prepend else ", evict_first=True" if evict_first else ""
        shown = f"{target}({'iter' if iterator else 'list'} {ids}{flag})"
        self.note(shown)

        def call(side: Side) -> None:
            blocks = resolve(side)
            pool = side.foreign if via_foreign else side.pool
            # vLLM frees a request's blocks as ``reversed(table)``: a one-shot
            # list_reverseiterator.
            arg = reversed(blocks[::-1]) if iterator else blocks
            if prepend:
                pool.free_blocks(arg, prepend=True)
            elif evict_first:
                pool.free_blocks(arg, evict_first=True)
            else:
                pool.free_blocks(arg)

        self.each(shown, call)

    def release_ok(self, ids: list[int], pool: Any) -> bool:
        """Non-null ids of `pool`, each once, each referenced."""
        real = [i for i in ids if i != 0]
        return len(set(real)) == len(real) and all(pool.blocks[i].ref_cnt > 0 for i in real)

    def make_watcher(self, side: Side, wid: int) -> Callable[[Any], None]:
        log = side.watcher_log
        pool = side.pool

        def on_reuse(block: Any) -> None:
            # What a watcher can see of the pool when it is called.
            key = block.block_hash
            log.append(
                (
                    wid,
                    block.block_id,
                    block.ref_cnt,
                    key,
                    pool.get_num_free_blocks(),
                    key is not None and pool.cached_block_hash_to_block.contain(key, block.block_id),
                    sorted(pool.cached_block_hashes_by_block.get(block.block_id, ())),
                    len(pool.kv_event_queue),
                )
            )

        return on_reuse

    # -- requests -------------------------------------------------------------

    def _new_family(self, r: Any) -> Family:
        hbs = self.cfg.hash_block_size
        prefix = [r.randrange(1000) for _ in range(r.randint(0, 2 * self.unit))]
        mm = []
        if prefix and r.random() < 0.3:
            offset = r.randrange(len(prefix))
            length = r.randint(1, max(1, min(2 * hbs, len(prefix) - offset)))
            mm.append((f"img-{r.randrange(3)}", offset, length))
        return Family(
            prefix=prefix,
            lora=r.choice(self.loras) if r.random() < 0.25 else None,
            cache_salt=r.choice(("salt-a", "salt-b")) if r.random() < 0.2 else None,
            mm=mm,
            embeds=self.make_embeds is not None and r.random() < 0.15,
        )

    def _build_request(self, r: Any) -> FakeRequest:
        if self.families and r.random() < 0.75:
            fam = r.choice(self.families)
        else:
            fam = self._new_family(r)
            self.families = (self.families + [fam])[-5:]
        suffix = [r.randrange(1000) for _ in range(r.randint(1, self.unit))]
        prompt = fam.prefix + suffix
        mm = list(fam.mm)
        if r.random() < 0.15:
            start = len(fam.prefix)
            mm.append((f"img-{r.randrange(3)}", start, r.randint(1, len(suffix))))
        outputs = [r.randrange(1000) for _ in range(r.randint(0, self.unit))]
        req = FakeRequest(
            f"req-{next(self.request_ids)}",
            prompt + outputs,
            len(prompt),
            fam.lora,
            fam.cache_salt,
            [self.make_mm(*m) for m in mm],
            r.choice((None, None, "session-1", "session-2")),
        )
        if fam.embeds:
            req.prompt_embeds = self.make_embeds(prompt)
        req.block_hashes = list(self.hasher(req))
        return req

    def _view(self, req: FakeRequest, bs: int) -> list[bytes]:
        return list(self.hash_view(req.block_hashes, self.cfg.hash_block_size, bs))

    def _lookup_hit(self, req: FakeRequest, bs: int, gids: list[int]) -> list[list[int]]:
        """The longest prefix hit of `req` in groups `gids`, hash by hash, as
        the managers look it up (at most num_prompt_tokens - 1 tokens)."""
        hits: list[list[int]] = [[] for _ in gids]
        view = self._view(req, bs)
        limit = min(len(view), (req.num_prompt_tokens - 1) // bs)
        for i in range(limit):
            h = view[i]
            got = self.each(
                f"get_cached_block(hash #{i} of {req.request_id}, {gids})",
                lambda s: own(s, s.pool.get_cached_block(h, list(gids))),
                _ids,
            )
            if got is None or any(b in hit for b, hit in zip(got, hits)):
                break
            for hit, b in zip(hits, got):
                hit.append(b)
        return hits

    def op_new_request(self, r: Any) -> bool:
        if len(self.requests) >= MAX_REQUESTS:
            return False
        req = self._build_request(r)
        self.note(repr(req))
        cfg = self.cfg
        blocks: dict[int, list[int]] = {}
        cached: dict[int, int] = {}
        done: list[int] = []  # groups holding references, for the rollback
        for bs, gids in cfg.classes.items():
            hits = self._lookup_hit(req, bs, gids)
            for g, hit in zip(gids, hits):
                if hit and cfg.sliding[g] and r.random() < 0.4:
                    # A sliding window's hit starts with null blocks.
                    j = r.randint(1, len(hit))
                    hit = [0] * j + hit[j:]
                self.note(f"touch({hit}) [group {g}]")
                self.each(f"touch({hit})", lambda s: s.pool.touch(self.blocks(s, hit)))
                blocks[g] = list(hit)
                cached[g] = len(hit)
                done.append(g)
                if self.features.emit_cached and hit and r.random() < 0.7:
                    self._emit_cached(req, len(hit), bs, g)
                need = -(-req.num_prompt_tokens // bs) - len(hit)
                try:
                    new = self.new_blocks(need, f" [group {g}]")
                except _Raised:
                    for d in reversed(done):
                        self.free_call(list(reversed(blocks[d])), iterator=True)
                    return True
                blocks[g] += new
        self.requests.append(Req(req, blocks, cached, req.num_prompt_tokens))
        if r.random() < 0.5:
            for g in range(len(cfg.group_block_sizes)):
                self._cache_more(self.requests[-1], g, r)
        return True

    def _emit_cached(self, req: FakeRequest, k: int, bs: int, g: int) -> None:
        self.note(f"emit_cached_block_events({req.request_id}, {k}, {bs}, {g})")
        self.each(
            "emit_cached_block_events",
            lambda s: s.pool.emit_cached_block_events(req, k, bs, g),
        )

    def op_emit_cached(self, r: Any) -> bool:
        if not self.requests:
            return False
        rq = r.choice(self.requests)
        g = r.randrange(len(self.cfg.group_block_sizes))
        bs = self.cfg.group_block_sizes[g]
        k = r.randint(0, len(self._view(rq.fake, bs)))
        self._emit_cached(rq.fake, k, bs, g)
        return True

    def op_grow(self, r: Any) -> bool:
        growing = [q for q in self.requests if q.alloc_tokens < q.fake.num_tokens]
        if not growing:
            return False
        q = r.choice(growing)
        target = min(q.fake.num_tokens, q.alloc_tokens + r.randint(1, self.unit))
        self.note(f"{q.fake.request_id} grows to {target} tokens")
        for g, bs in enumerate(self.cfg.group_block_sizes):
            need = -(-target // bs) - len(q.blocks[g])
            if need > 0:
                q.blocks[g] += self.new_blocks(need, f" [group {g}]")
        q.alloc_tokens = target
        return True

    def _num_full(self, q: Req, g: int) -> int:
        bs = self.cfg.group_block_sizes[g]
        hashed = len(q.fake.block_hashes) * self.cfg.hash_block_size
        return min(q.alloc_tokens, hashed) // bs

    def _cache_more(self, q: Req, g: int, r: Any, upto: int | None = None) -> bool:
        if not self.cfg.enable_caching and r.random() < 0.8:
            return False
        start = q.num_cached[g]
        num_full = self._num_full(q, g)
        if start >= num_full:
            if r.random() < 0.1:  # nothing new to cache: a no-op
                shown = f"cache_full_blocks({q.fake.request_id}, ..., {start}, {start}, ...)"
                self.note(shown)
                bs = self.cfg.group_block_sizes[g]
                ids = q.blocks[g]
                self.each(
                    shown,
                    lambda s: s.pool.cache_full_blocks(q.fake, self.blocks(s, ids), start, start, bs, g),
                )
                return True
            return False
        stop = min(num_full, start + r.randint(1, 3) if upto is None else upto)
        bs = self.cfg.group_block_sizes[g]
        mask = None
        if self.features.block_mask and (r.random() < 0.3 or self.cfg.sliding[g] and r.random() < 0.5):
            mask = [r.random() < 0.6 for _ in range(stop - start)]
        ids = q.blocks[g]
        for i in range(start, stop):
            b = self.ref_block(ids[i])
            if b.is_null or (mask is not None and not mask[i - start]):
                continue
            if b.block_hash is not None and not (
                self.features.partial
                and b.block_hash_num_tokens is not None
                and b.block_hash_num_tokens < (i + 1) * bs
            ):
                return False  # not a promotion: vLLM would assert
        fake = q.fake
        shown = (
            f"cache_full_blocks({fake.request_id}, {ids}, {start}, {stop}, {bs}, {g}"
            + (f", block_mask={mask})" if mask is not None else ")")
        )
        self.note(shown)
        if mask is None and (not self.features.block_mask or r.random() < 0.5):
            fn = lambda s: s.pool.cache_full_blocks(fake, self.blocks(s, ids), start, stop, bs, g)  # noqa: E731
        else:
            fn = lambda s: s.pool.cache_full_blocks(  # noqa: E731
                fake, self.blocks(s, ids), start, stop, bs, g, block_mask=mask
            )
        self.each(shown, fn)
        q.num_cached[g] = stop
        return True

    def op_cache_more(self, r: Any) -> bool:
        if not self.requests:
            return False
        q = r.choice(self.requests)
        return self._cache_more(q, r.randrange(len(self.cfg.group_block_sizes)), r)

    def op_cache_partial(self, r: Any) -> bool:
        cfg = self.cfg
        hbs = cfg.hash_block_size
        if not self.requests or not cfg.enable_caching and r.random() < 0.8:
            return False
        q = r.choice(self.requests)
        g = r.randrange(len(cfg.group_block_sizes))
        bs = cfg.group_block_sizes[g]
        if bs == hbs:
            return False
        bounds = [
            m * hbs
            for m in range(1, len(q.fake.block_hashes) + 1)
            if (m * hbs) % bs and m * hbs <= q.alloc_tokens and (m * hbs) // bs < len(q.blocks[g])
        ]
        if not bounds:
            return False
        ahead = [n for n in bounds if n // bs >= q.num_cached[g]]
        # Mostly in the part not cached yet: a later cache_full_blocks promotes it.
        num_tokens = r.choice(ahead if ahead and r.random() < 0.7 else bounds)
        bid = q.blocks[g][num_tokens // bs]
        replace = r.random() < 0.2 and self.features.replace_hashes
        fake = q.fake
        shown = (
            f"cache_partial_block({fake.request_id}, block {bid}, {num_tokens}, {g}, {bs}"
            + (", replace_existing_hashes=True)" if replace else ")")
        )
        self.note(shown)
        if replace or self.features.replace_hashes and r.random() < 0.5:
            fn = lambda s: s.pool.cache_partial_block(  # noqa: E731
                fake, s.pool.blocks[bid], num_tokens, g, bs, replace_existing_hashes=replace
            )
        else:
            fn = lambda s: s.pool.cache_partial_block(fake, s.pool.blocks[bid], num_tokens, g, bs)  # noqa: E731
        self.each(shown, fn)
        j = num_tokens // bs
        if j >= q.num_cached[g] and j < self._num_full(q, g) and r.random() < 0.5:
            # The block fills up and is cached in full: a partial->full promotion.
            self._cache_more(q, g, r, upto=j + 1)
        return True

    def _release_request(self, q: Req, r: Any, unpin: bool) -> None:
        groups = list(q.blocks)
        tables = []
        for g in groups:
            ids = q.blocks[g]
            if r.random() < 0.7:  # pop_blocks_for_free trims the null head
                while ids and ids[0] == 0:
                    ids = ids[1:]
            tables.append(ids)
        together = [i for t in tables for i in t]
        if unpin:
            calls = [together] if r.random() < 0.5 and self.release_ok(together, self.ref) else tables
            for ids in calls:
                self._unpin([i for i in reversed(ids) if i != 0])
            return
        if r.random() < 0.5 and self.release_ok(together, self.ref):
            # A deferred free: one call over every group, maybe with blocks of
            # the other pool mixed in.
            ids: list[Any] = list(reversed(together))
            if self.features.block_pool_attr and self.foreign_holders and r.random() < 0.5:
                held = self.foreign_holders.pop(r.randrange(len(self.foreign_holders)))
                for fid in held:
                    ids.insert(r.randint(0, len(ids)), ("f", fid))
            self.free_call(ids, iterator=r.random() < 0.5)
        else:
            for t in tables:
                self.free_call(list(reversed(t)), iterator=True)

    def _unpin(self, ids: list[int]) -> None:
        wid = next(self.watchers)
        shown = f"unpin_blocks({ids}, watcher {wid})"
        self.note(shown)
        self.each(
            shown,
            lambda s: s.pool.unpin_blocks(self.blocks(s, ids), self.make_watcher(s, wid)),
        )

    def op_finish(self, r: Any) -> bool:
        if not self.requests:
            return False
        q = self.requests.pop(r.randrange(len(self.requests)))
        self.note(f"finish {q.fake.request_id}")
        self._release_request(q, r, unpin=False)
        return True

    def op_finish_unpin(self, r: Any) -> bool:
        if not self.requests:
            return False
        q = self.requests.pop(r.randrange(len(self.requests)))
        self.note(f"finish {q.fake.request_id} by unpinning")
        self._release_request(q, r, unpin=True)
        return True

    def op_slide(self, r: Any) -> bool:
        cands = [
            (q, g)
            for q in self.requests
            for g in q.blocks
            if self.cfg.sliding[g] and sum(1 for i in q.blocks[g] if i) >= 2
        ]
        if not cands:
            return False
        q, g = r.choice(cands)
        positions = [p for p, i in enumerate(q.blocks[g]) if i]
        drop = positions[: r.randint(1, len(positions) - 1)]
        removed = [q.blocks[g][p] for p in reversed(drop)]
        self.note(f"{q.fake.request_id} slides group {g}")
        self.free_call(removed, iterator=False)
        for p in drop:
            q.blocks[g][p] = 0
        return True

    def op_evict_blocks(self, r: Any) -> bool:
        n = self.cfg.num_blocks
        ids = r.sample(range(n), r.randint(0, min(n, 5)))
        kind = r.random()
        if kind < 0.6:
            arg: Any = set(ids)
        elif kind < 0.8:
            arg = ids + ids[:1]  # a list may name a block twice
        else:
            arg = tuple(ids)
        self.note(f"evict_blocks({arg})")
        self.each(f"evict_blocks({arg})", lambda s: s.pool.evict_blocks(arg))
        return True

    def op_maybe_evict(self, r: Any) -> bool:
        i = r.randrange(self.cfg.num_blocks)
        self.note(f"_maybe_evict_cached_block(block {i})")
        self.each(
            f"_maybe_evict_cached_block(block {i})",
            lambda s: s.pool._maybe_evict_cached_block(s.pool.blocks[i]),
        )
        return True

    def op_reset(self, r: Any) -> bool:
        self.note("reset_prefix_cache()")
        self.each("reset_prefix_cache()", lambda s: s.pool.reset_prefix_cache())
        return True

    def op_drain_and_reset(self, r: Any) -> bool:
        while self.requests:
            self._release_request(self.requests.pop(), r, unpin=r.random() < 0.3 and self.features.unpin)
        while self.holders:
            self._release_holder(self.holders.pop(), r)
        while self.foreign_holders:
            held = self.foreign_holders.pop()
            # Through this pool (it hands them on) where blocks know their pool.
            self.free_call(
                [("f", i) for i in held], iterator=False, via_foreign=not self.features.block_pool_attr
            )
        if self.private:
            raise HarnessError(f"held blocks left after the drain: {self.private}")
        self.note("reset_prefix_cache()")
        ok = self.each("reset_prefix_cache()", lambda s: s.pool.reset_prefix_cache())
        if not ok:
            raise HarnessError(f"reset refused on a drained pool\n{self.context()}")
        return True

    def op_lookup(self, r: Any) -> bool:
        cfg = self.cfg
        sources = [q.fake for q in self.requests] + [self._build_request(r)]
        req = r.choice(sources)
        bs = r.choice(list(cfg.classes))
        gid_lists = [cfg.classes[bs], [], [r.randrange(len(cfg.group_block_sizes))], [7]]
        gids = r.choice(gid_lists + [list(reversed(cfg.classes[bs]))])
        fine = r.random() < 0.3  # the fine-grained probe: every sub-hash
        hashes = req.block_hashes if fine else self._view(req, bs)
        self.note(f"lookup {'raw' if fine else f'bs={bs}'} hashes of {req.request_id} in {gids}")
        for i, h in enumerate(hashes):
            self.each(
                f"get_cached_block(hash #{i}, {gids})",
                lambda s: own(s, s.pool.get_cached_block(h, list(gids))),
                _ids,
            )
        # The map's own interface, for keys of blocks and unknown keys.
        keys = [b.block_hash for b in self.ref.blocks if b.block_hash is not None]
        keys += [h + g.to_bytes(4, "big") for h in hashes[:3] for g in gids]
        for key in keys[:8]:
            self.each(
                "cached_block_hash_to_block.get_one_block",
                lambda s: own(s, s.pool.cached_block_hash_to_block.get_one_block(key)),
                _id,
            )
            i = r.randrange(cfg.num_blocks)
            if self.features.partial:
                self.each(
                    f"cached_block_hash_to_block.contain(key, {i})",
                    lambda s: s.pool.cached_block_hash_to_block.contain(key, i),
                )
        return True

    # -- extra references ----------------------------------------------------

    def op_touch_hold(self, r: Any) -> bool:
        if len(self.holders) >= MAX_HOLDERS:
            return False
        cands = [i for i in self.hashed_ids() if i != 0]
        if r.random() < 0.2:
            cands = self.free_ids()  # a free block without a hash is taken too
        if not cands:
            return False
        ids = r.sample(cands, r.randint(1, min(3, len(cands))))
        shown = list(ids)
        if r.random() < 0.2:
            shown.insert(r.randint(0, len(shown)), 0)  # the null block is skipped
        self.note(f"touch({shown}) and hold")
        self.each(f"touch({shown})", lambda s: s.pool.touch(self.blocks(s, shown)))
        self.holders.append(ids)
        return True

    def op_bump(self, r: Any) -> bool:
        if len(self.holders) >= MAX_HOLDERS:
            return False
        cands = self.running_ids()
        if not cands:
            return False
        i = r.choice(cands)
        self.note(f"blocks[{i}].ref_cnt += 1 and hold")

        def bump(s: Side) -> None:
            s.pool.blocks[i].ref_cnt += 1

        self.each(f"blocks[{i}].ref_cnt += 1", bump)
        self.holders.append([i])
        return True

    def _release_holder(self, ids: list[int], r: Any) -> None:
        self.private.difference_update(ids)
        how = r.random()
        if how < 0.25 and self.features.unpin:
            self._unpin(list(ids))
        elif 0.25 <= how < 0.4 and self.features.block_pool_attr:
            # Through the other pool: it must hand our blocks back to us.
            mixed: list[Any] = list(ids)
            if self.foreign_holders:
                for fid in self.foreign_holders.pop(r.randrange(len(self.foreign_holders))):
                    mixed.insert(r.randint(0, len(mixed)), ("f", fid))
            self.free_call(mixed, iterator=False, via_foreign=True)
        else:
            self.free_call(list(ids), iterator=r.random() < 0.5)

    def op_release_holder(self, r: Any) -> bool:
        if not self.holders:
            return False
        ids = self.holders.pop(r.randrange(len(self.holders)))
        if not self.release_ok(ids, self.ref):
            raise HarnessError(f"holder {ids} not releasable\n{self.context()}")
        self._release_holder(ids, r)
        return True

    def op_move_hashes(self, r: Any) -> bool:
        if not self.cfg.enable_caching or len(self.holders) >= MAX_HOLDERS:
            return False
        cands = self.running_ids()
        if not cands or not self.ref.get_num_free_blocks():
            return False
        [dst] = self.new_blocks(1, " [copy-on-write target]")
        d = self.ref_block(dst)
        if d.block_hash is not None or dst in self.ref.cached_block_hashes_by_block:
            raise HarnessError(f"a fresh block carries a hash\n{self.context()}")
        hashed = [i for i in cands if self.ref_block(i).block_hash is not None]
        src = r.choice(hashed) if hashed and r.random() < 0.8 else r.choice(cands)
        free_hashed = [i for i in self.free_ids() if self.ref_block(i).block_hash is not None]
        if free_hashed and r.random() < 0.15:
            src = r.choice(free_hashed)  # an eviction candidate's keys move too
        self.note(f"move_block_hashes(block {src}, block {dst})")
        self.each(
            f"move_block_hashes({src}, {dst})",
            lambda s: s.pool.move_block_hashes(s.pool.blocks[src], s.pool.blocks[dst]),
        )
        if r.random() < 0.5 and self.ref_block(src).ref_cnt > 0:
            # The copy-on-write source keeps an extra reference until the copy ran.
            self.each(f"blocks[{src}].ref_cnt += 1", lambda s: _bump(s.pool.blocks[src]))
            self.note(f"blocks[{src}].ref_cnt += 1")
            self.holders.append([src, dst])
        else:
            self.holders.append([dst])
        self.private.add(dst)
        return True

    def op_insert_hash(self, r: Any) -> bool:
        """What the offload connector does on its CPU pool: a fresh block gets
        the keys of a cached block, and a hand-built BlockStored is queued."""
        if not self.cfg.enable_caching or len(self.holders) >= MAX_HOLDERS:
            return False
        cands = [i for i in self.hashed_ids() if i != 0]
        if not cands or not self.ref.get_num_free_blocks():
            return False
        src = self.ref_block(r.choice(cands))
        keys = [src.block_hash, *sorted(self.ref.cached_block_hashes_by_block.get(src.block_id, ()))]
        ntokens = src.block_hash_num_tokens
        if r.random() < 0.3 and self.private:
            # Into a target already held (it may have keys: they add up).
            dst = r.choice(sorted(self.private))
        else:
            [dst] = self.new_blocks(1, " [offload target]")
            self.holders.append([dst])
            self.private.add(dst)
        for n, key in enumerate(keys):
            num_tokens = ntokens if n == 0 else None
            self.note(f"_insert_block_hash({key.hex()[-12:]}, block {dst}, num_tokens={num_tokens})")
            self.each(
                "_insert_block_hash",
                lambda s: s.pool._insert_block_hash(key, s.pool.blocks[dst], num_tokens=num_tokens),
            )
            if self.cfg.events:
                fields = dict(
                    block_hashes=[int.from_bytes(key[:-4], "big") & (2**64 - 1)],
                    parent_block_hash=None,
                    token_ids=[],
                    block_size=0,
                    lora_id=None,
                    medium=self.cfg.medium,
                    lora_name=None,
                    group_idx=int.from_bytes(key[-4:], "big"),
                )
                stored = {k: v for k, v in fields.items() if k in self.features.stored_fields}
                self.note("kv_event_queue.append(BlockStored(...))")
                self.each(
                    "kv_event_queue.append",
                    lambda s: s.pool.kv_event_queue.append(s.stored_cls(**stored)),
                )
        return True

    def op_iter_after(self, r: Any) -> bool:
        free = self.free_ids()
        cursor = r.choice(free) if free and r.random() < 0.7 else None
        k = r.randint(0, len(free) + 1)
        self.note(f"iter_blocks_after({cursor}), first {k}")

        def walk(s: Side) -> list[int]:
            c = None if cursor is None else s.pool.blocks[cursor]
            walked = list(itertools.islice(s.pool.free_block_queue.iter_blocks_after(c), k))
            return [b.block_id for b in own(s, walked)]

        self.each(f"iter_blocks_after({cursor})", walk)
        return True

    def op_queue_ops(self, r: Any) -> bool:
        """The free queue's own methods; every block taken goes back."""
        free = self.free_ids()
        if not free:
            return False
        kind = r.choice(("popleft", "popleft_n", "remove"))
        if kind == "popleft":
            self.note("free_block_queue.popleft()")
            ids = [self.each("popleft()", lambda s: own(s, s.pool.free_block_queue.popleft()), _id)]
        elif kind == "popleft_n":
            k = r.randint(0, len(free))
            self.note(f"free_block_queue.popleft_n({k})")
            ids = self.each(f"popleft_n({k})", lambda s: own(s, s.pool.free_block_queue.popleft_n(k)), _ids)
        else:
            i = r.choice(free)
            self.note(f"free_block_queue.remove(block {i})")
            self.each(f"remove({i})", lambda s: s.pool.free_block_queue.remove(s.pool.blocks[i]))
            ids = [i]
        r.shuffle(ids)
        backs = ("append", "append_n", "prepend_n") if self.features.prepend_n else ("append", "append_n")
        back = r.choice(backs)
        if back == "append":
            for i in ids:
                self.note(f"free_block_queue.append(block {i})")
                self.each(f"append({i})", lambda s: s.pool.free_block_queue.append(s.pool.blocks[i]))
        else:
            self.note(f"free_block_queue.{back}({ids})")
            self.each(
                f"{back}({ids})",
                lambda s: getattr(s.pool.free_block_queue, back)(self.blocks(s, ids)),
            )
        return True

    # -- the other pool ------------------------------------------------------

    def op_foreign_alloc(self, r: Any) -> bool:
        free = self.sides[0].foreign.get_num_free_blocks()
        if not free or len(self.foreign_holders) >= MAX_HOLDERS:
            return False
        k = r.randint(1, min(3, free))
        self.note(f"foreign.get_new_blocks({k})")
        ids = self.each("foreign.get_new_blocks", lambda s: s.foreign.get_new_blocks(k), _ids)
        if self.requests and r.random() < 0.5 and self.sides[0].foreign.enable_caching:
            q = r.choice(self.requests)
            hbs = self.cfg.hash_block_size
            n = min(k, len(q.fake.block_hashes))
            if n:
                self.note(f"foreign.cache_full_blocks({q.fake.request_id}, {ids}, 0, {n}, {hbs}, 0)")
                self.each(
                    "foreign.cache_full_blocks",
                    lambda s: s.foreign.cache_full_blocks(
                        q.fake, [s.foreign.blocks[i] for i in ids], 0, n, hbs, 0
                    ),
                )
        self.foreign_holders.append(ids)
        return True

    def op_foreign_free(self, r: Any) -> bool:
        if not self.foreign_holders:
            return False
        held = self.foreign_holders.pop(r.randrange(len(self.foreign_holders)))
        mixed: list[Any] = [("f", i) for i in held]
        if not self.features.block_pool_attr:
            # Before KVCacheBlock.pool a block is freed only to its own pool.
            if r.random() < 0.2:
                mixed.insert(r.randint(0, len(mixed)), ("f", 0))
            self.free_call(mixed, iterator=r.random() < 0.5, via_foreign=True)
            return True
        if self.holders and r.random() < 0.6:
            ids = self.holders.pop(r.randrange(len(self.holders)))
            self.private.difference_update(ids)
            for i in ids:
                mixed.insert(r.randint(0, len(mixed)), i)
        if r.random() < 0.2:
            mixed.insert(r.randint(0, len(mixed)), 0)
        if r.random() < 0.2:
            mixed.insert(r.randint(0, len(mixed)), ("f", 0))  # the other pool's null block
        self.free_call(mixed, iterator=r.random() < 0.5, via_foreign=r.random() < 0.3)
        return True

    # -- misc ------------------------------------------------------------------

    def op_over_alloc(self, r: Any) -> bool:
        k = self.ref.get_num_free_blocks() + r.randint(1, 3)
        if r.random() < 0.3:
            k = 0
        try:
            self.new_blocks(k)
        except _Raised:
            pass
        return True

    def op_cow_retained(self, r: Any) -> bool:
        """Two requests copy-on-write from the same source block in one step:
        each gives the source an extra reference and takes a fresh copy target;
        the scheduler then frees the flattened (source, copy) pairs in one call
        (kv_cache_manager.take_kv_cache_block_copies, scheduler
        _free_cow_retained_blocks), the source twice."""
        if not self.repeats or self.ref.get_num_free_blocks() < 2:
            return False
        cands = self.running_ids()
        if not cands:
            return False
        src = r.choice(cands)
        retained: list[int] = []
        for _ in range(2):
            self.note(f"blocks[{src}].ref_cnt += 1")
            self.each(f"blocks[{src}].ref_cnt += 1", lambda s: _bump(s.pool.blocks[src]))
            [dst] = self.new_blocks(1, " [copy-on-write target]")
            retained += [src, dst]
        self.free_call(retained, iterator=False)
        return True

    def op_swap_event_queue(self, r: Any) -> bool:
        """Code outside the pool rebinds its event queue (as take_events does)."""
        self.note("kv_event_queue = []")

        def swap(s: Side) -> None:
            s.pool.kv_event_queue = []

        self.each("kv_event_queue = []", swap)
        self.segments(clear=True)
        return True

    def op_drain_metrics(self, r: Any) -> bool:
        if self.sides[0].collector is None:
            return False
        self.note("metrics_collector.drain_events()")
        self.each("drain_events()", lambda s: len(s.collector.drain_events()))
        return True


class _Raised(Exception):
    """Every side raised the same exception type (an expected refusal)."""


def own(side: Side, result: Any) -> Any:
    """``result`` (a block, a list of blocks or None), after checking that
    each block is the very object in ``side.pool.blocks`` (vLLM's callers
    compare blocks with ``is``)."""
    blocks = [] if result is None else [result] if hasattr(result, "block_id") else result
    for b in blocks:
        if b is not side.pool.blocks[b.block_id]:
            raise TypeError(f"{b!r} is not the pool's own block object {b.block_id}")
    return result


def _bump(block: Any) -> None:
    block.ref_cnt += 1


def _canonical_events(events: list[Any], segments: list[tuple[int, int]]) -> list[bytes]:
    """msgpack bytes of each event; within one block's removal (a segment
    recorded by the reference), the events after the first follow the order of
    a Python ``set`` in vLLM (hash-seed dependent), so they are sorted."""
    encoded = [msgspec.msgpack.encode(e) for e in events]
    if len(encoded) >= max((s + n for s, n in segments), default=0):
        for start, n in segments:
            if n > 2:
                encoded[start + 1 : start + n] = sorted(encoded[start + 1 : start + n])
    return encoded


def _decoded(encoded: bytes | None) -> str:
    return "(none)" if encoded is None else _short(msgspec.msgpack.decode(encoded), 600)


def _state_diff(want: dict[str, Any], have: dict[str, Any], features: Features = LATEST) -> str:
    lines = []
    for key in want:
        a, b = want[key], have.get(key)
        if a == b:
            continue
        if key == "blocks":
            names = block_field_names(features)
            for x, y in zip(a, b):
                if x != y:
                    fields = [f"{n}: {u!r} != {v!r}" for n, u, v in zip(names, x, y) if u != v]
                    lines.append(f"  block {x[0]}: expected vs got: " + ", ".join(fields))
        elif key == "map":
            ea, eb = a["entries"], b["entries"]
            if a["len"] != b["len"]:
                lines.append(f"  len(map): expected {a['len']}, got {b['len']}")
            for k in sorted(set(ea) | set(eb)):
                if ea.get(k) != eb.get(k):
                    lines.append(
                        f"  map[{k.hex()}]: expected (ids, get_one_block) {ea.get(k)}, got {eb.get(k)}"
                    )
        elif key == "queued_events":
            lines.append(f"  queued events: expected {len(a)}, got {len(b)}")
            for i, (x, y) in enumerate(itertools.zip_longest(a, b)):
                if x != y:
                    lines.append(f"  first differing event #{i}:")
                    lines.append(f"    expected: {_decoded(x)}")
                    lines.append(f"    got:      {_decoded(y)}")
                    break
        elif key == "watchers":
            lines.append(
                "  reuse-watcher calls (watcher, block, ref_cnt, block_hash, free blocks, "
                "key in map, secondary keys, queued events): "
                f"expected {len(a)}, got {len(b)}"
            )
            for i, (x, y) in enumerate(itertools.zip_longest(a, b)):
                if x != y:
                    lines.append(f"  first differing call #{i}:\n    expected: {x}\n    got:      {y}")
                    break
        elif key == "foreign":
            lines.append("  the other pool differs:\n  " + _state_diff(a, b, features).replace("\n", "\n  "))
        else:
            lines.append(f"  {key}: expected {_short(a)}, got {_short(b)}")
    return "\n".join(lines)
