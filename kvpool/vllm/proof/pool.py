"""The pool traces: kvpool's line, over the compiled core as ``install()``
puts it into vLLM (``kvpool.vllm.vllm_block_pool_class``: vLLM's own event
classes) and over each core with kvpool's own event classes, against the
installed vLLM's own pure-Python ``BlockPool``, driven in lock-step by
seeded random operation sequences (``kvpool.vllm.proof._driver``).

The driver uses only what the installed vLLM has, read off its own classes
(``Features.detect``); requests are hashed by its own
``get_request_block_hasher`` and coarse groups by its own
``BlockHashListWithBlockSize``. After every step: the returned block ids,
every block's fields, the free-queue order, the map, the events (msgpack
bytes, queued and taken), the metrics collector, the reuse-watcher calls and
the other pool of cross-pool frees; the first difference fails with the
seed, the step, the operation, what differs and both states.

Candidates: ``vllm`` (vLLM's pool against itself: the harness must pass on
the build), kvpool's line over the compiled and the pure-Python core with
kvpool's own event classes, and over the compiled core as installed into
vLLM. Broken pools (``BROKEN``), at least one for each build, must be caught
at the very step their bug shows: the traces have teeth on this build.

``python -m kvpool.vllm --prove`` runs ``cases(line)``;
``tests/vllm_release/test_pool_diff.py`` runs the same functions for every
listed release, with ``KVPOOL_RELEASE_SEEDS`` (default 24) and
``KVPOOL_RELEASE_STEPS`` (default 200).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import inspect
import logging
import os
import random
from types import SimpleNamespace
from typing import Any

import msgspec
import vllm
from vllm.distributed import kv_events as vllm_events
from vllm.lora.request import LoRARequest
from vllm.utils.hashing import sha256
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VllmCollector

from ._base import Case, HarnessFailure, Patch, ProofFailure
from ._driver import Config, Driver, Features, HarnessError, Mismatch, Side

NAME = "pool traces"
VERSION = vllm.__version__
SEEDS = range(int(os.environ.get("KVPOOL_RELEASE_SEEDS", "24")))
STEPS = int(os.environ.get("KVPOOL_RELEASE_STEPS", "200"))

CORE_MODULES = {"c-extension": "kvpool._core", "pure-python": "kvpool._core_py"}
ALL_CANDIDATES = ["vllm", "c-extension", "pure-python", "c-extension-vllm-events"]
#: What ``--prove`` compares: vLLM against itself (the harness), and
#: kvpool's pool as ``install()`` puts it in (the compiled core, vLLM's
#: event classes).
PROVE_CANDIDATES = ("vllm", "c-extension-vllm-events")
#: The seeds ``--prove`` runs: more than CI's per release (a build is
#: proven once), still well under a minute.
PROVE_SEEDS = range(64)

# The request hasher needs the release's seed for the first parent hash.
if getattr(kv_cache_utils, "NONE_HASH", None) is None:
    kv_cache_utils.init_none_hash(sha256)

FEATURES = Features.detect(vllm_block_pool.BlockPool, vllm_events.BlockStored)


def _hasher(hash_block_size: int, lookahead: int) -> Any:
    """The release's own request block hasher (with the lookahead where the
    release has it)."""
    make = kv_cache_utils.get_request_block_hasher
    if "num_hash_lookahead_tokens" in inspect.signature(make).parameters:
        return make(hash_block_size, sha256, lookahead)
    return make(hash_block_size, sha256)


def _hash_view(hashes: Any, hash_block_size: int, block_size: int) -> list[bytes]:
    """The release's own hashes of a coarser group."""
    if block_size == hash_block_size:
        return list(hashes)
    return list(kv_cache_utils.BlockHashListWithBlockSize(hashes, hash_block_size, block_size))


def _mm_feature(identifier: str, offset: int, length: int) -> Any:
    from vllm.multimodal.inputs import PlaceholderRange

    return SimpleNamespace(identifier=identifier, mm_position=PlaceholderRange(offset=offset, length=length))


def _embeds(prompt: list[int]) -> Any:
    """Prompt embeddings (a function of the tokens, so equal prefixes still hit)."""
    import torch

    return torch.tensor(prompt, dtype=torch.float32).unsqueeze(1).repeat(1, 4)


def _lora(name: str, int_id: int, path: str) -> LoRARequest:
    return LoRARequest(lora_name=name, lora_int_id=int_id, lora_path=path)


class RecordingBlockPool(vllm_block_pool.BlockPool):
    """The release's pool, unchanged, plus two records: where each block's
    BlockRemoved events start in the event queue (0.24+: their order after
    the first follows a Python set), and counts of what the workload
    exercised. Methods the release lacks are never called."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._segments: list[tuple[int, int]] = []
        self.seen: collections.Counter[str] = collections.Counter()

    def segments(self, clear: bool) -> list[tuple[int, int]]:
        out = self._segments
        if clear:
            self._segments = []
        return list(out)

    def _emit_block_removed_events(self, block_hashes: list[bytes]) -> None:
        if self.enable_kv_cache_events and block_hashes:
            self._segments.append((len(self.kv_event_queue), len(block_hashes)))
        if len(block_hashes) > 1:
            self.seen["block with several keys removed"] += 1
        super()._emit_block_removed_events(block_hashes)

    def _maybe_evict_cached_block(self, block: Any) -> bool:
        evicted = super()._maybe_evict_cached_block(block)
        self.seen["evicted"] += bool(evicted)
        return evicted

    def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks, *a, **kw):
        for blk in blocks[num_cached_blocks:num_full_blocks]:
            if blk.block_hash is not None:
                self.seen["promotion candidate"] += 1
        if kw.get("block_mask") is not None:
            self.seen["block_mask"] += 1
        for attr in ("lora_request", "cache_salt", "mm_features", "session_id", "prompt_embeds"):
            if getattr(request, attr) is not None and getattr(request, attr) != []:
                self.seen[attr] += 1
        if getattr(self, "num_hash_lookahead_tokens", 0) and self.enable_kv_cache_events:
            self.seen["lookahead events"] += 1
        return super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, *a, **kw)

    def cache_partial_block(self, *a: Any, **kw: Any) -> Any:
        self.seen["partial"] += 1
        return super().cache_partial_block(*a, **kw)

    def _notify_reuse(self, blocks: Any) -> None:
        blocks = list(blocks)
        self.seen["watcher fired"] += sum(1 for b in blocks if b.block_id in self._reuse_watchers)
        super()._notify_reuse(blocks)

    def free_blocks(self, ordered_blocks: Any, *a: Any, **kw: Any) -> None:
        ordered_blocks = list(ordered_blocks)
        if any(getattr(b, "pool", None) not in (None, self) for b in ordered_blocks):
            self.seen["cross-pool free"] += 1
        if any(b.is_null for b in ordered_blocks):
            self.seen["null block freed"] += 1
        if kw.get("prepend"):
            self.seen["prepend"] += 1
        super().free_blocks(ordered_blocks, *a, **kw)

    def reset_prefix_cache(self) -> bool:
        ok = super().reset_prefix_cache()
        self.seen["reset done" if ok else "reset refused"] += 1
        return ok


def quiet_pools() -> None:
    """Refused resets log a warning per call; keep the output readable."""
    for name in ("vllm.v1.core.block_pool", "kvpool"):
        logging.getLogger(name).setLevel(logging.ERROR)


def kvpool_line() -> Any:
    """kvpool's line for this release (an UnsupportedVLLMVersionError names
    the release if kvpool has none: a kvpool candidate then fails loudly)."""
    import kvpool.vllm

    return kvpool.vllm.vllm_line(VERSION)


_pool_classes: dict[tuple[str, str], tuple[type, type, type]] = {}

#: Where a kvpool line differs from its releases by design, by line name.
#: "null ref_cnt": the 0.15 line does not maintain the null block's
#: ref_cnt (SPEC section 2: touch and free_blocks skip it), while vLLM
#: 0.15-0.32 count it up in touch and down in free_blocks (0.33 skips it too).
#: The comparison leaves it out for that line only; everything else of the
#: null block is compared.
# The lines built on the 0.15 facade (0.17-0.23) share its null block rule.
KNOWN_DEVIATIONS: dict[str, frozenset[str]] = {}


def candidate(name: str, seed: int, line: Any = None) -> tuple[str, type, type, type]:
    """(label, pool class, BlockStored class, metrics collector class) of
    candidate ``name`` on ``line`` (default: this release's)."""
    if name == "vllm":
        return name, vllm_block_pool.BlockPool, vllm_events.BlockStored, VllmCollector
    line = kvpool_line() if line is None else line
    module = importlib.import_module(line.module)
    if (line.name, name) not in _pool_classes:
        core = importlib.import_module(CORE_MODULES[name.removesuffix("-vllm-events")])
        if name.endswith("-vllm-events"):
            from kvpool.vllm import vllm_block_pool_class

            cls, stored = vllm_block_pool_class(line.name, core), vllm_events.BlockStored
        else:
            cls, stored = module.make_block_pool_class(core), module.BlockStored
        _pool_classes[line.name, name] = (cls, stored, module.KVCacheMetricsCollector)
    cls, stored, own_collector = _pool_classes[line.name, name]
    # kvpool's pool is given vLLM's collector inside vLLM; its own one too.
    collector = VllmCollector if seed % 2 == 0 else own_collector
    return f"kvpool {line.module} ({name})", cls, stored, collector


def make_side(label: str, pool_cls: type, stored_cls: type, collector_cls: type, cfg: Config) -> Side:
    collector = collector_cls(sample_rate=cfg.sample_rate) if cfg.metrics else None
    args, kwargs = cfg.pool_args(collector, FEATURES)
    pool = pool_cls(*args, **kwargs)
    foreign = vllm_block_pool.BlockPool(cfg.foreign_blocks, True, cfg.hash_block_size)
    side = Side(label, pool, foreign, stored_cls, collector)
    if isinstance(pool, RecordingBlockPool):
        side.removal_segments = pool.segments
    return side


def make_driver(
    seed: int, cand: tuple[str, type, type, type], patch: Patch, repeats: bool = False,
    line: Any = None,
) -> tuple[Driver, random.Random]:
    """The driver of seed ``seed``: vLLM's pool (recording) and ``cand``.
    ``patch`` (pytest's ``monkeypatch`` will do) sets the event hash
    format the seed's config draws."""
    label, pool_cls, stored_cls, collector_cls = cand
    if label.startswith("kvpool"):
        deviations = KNOWN_DEVIATIONS.get((kvpool_line() if line is None else line).name, frozenset())
    else:
        deviations = frozenset()
    r = random.Random(seed)
    cfg = Config.random(r, FEATURES)
    patch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1" if cfg.int_hashes else "0")
    ref = make_side(f"vLLM {VERSION}", RecordingBlockPool, vllm_events.BlockStored, VllmCollector, cfg)
    other = make_side(label, pool_cls, stored_cls, collector_cls, cfg)
    driver = Driver(
        cfg,
        [ref, other],
        hasher=_hasher(cfg.hash_block_size, cfg.lookahead),
        make_lora=_lora,
        make_mm=_mm_feature,
        make_embeds=_embeds,
        label=f"seed {seed}, {label} vs vLLM {VERSION}",
        check_invariants_on=[label] if label.startswith("kvpool") else [],
        repeats=repeats,
        features=FEATURES,
        hash_view=_hash_view,
        null_ref_cnt="null ref_cnt" not in deviations,
    )
    return driver, r


def check_same(name: str, seed: int, patch: Patch, repeats: bool = False, line: Any = None,
               steps: int = STEPS) -> Driver:
    """Candidate ``name`` against vLLM's pool over seed ``seed``; raises
    ``ProofFailure`` at the first difference (``HarnessFailure`` where the
    driver itself went wrong)."""
    try:
        driver, r = make_driver(seed, candidate(name, seed, line), patch, repeats, line)
        driver.run(r, steps)
    except Mismatch as exc:
        raise ProofFailure(str(exc)) from None
    except HarnessError as exc:
        raise HarnessFailure(f"HARNESS BUG (not a kvpool difference): {exc}") from None
    return driver


#: Copy-on-write (0.26+, with move_block_hashes): the scheduler frees the
#: retained (source, copy) pairs of two copies from one source in one call.
REPEATS = FEATURES.move_hashes


# ---------------------------------------------------------------------------
# The harness has teeth: broken pools are caught where their bug shows.


class _Broken(RecordingBlockPool):
    """The release's pool with one bug; ``bug_steps`` records each step at
    which the bug changed something observable (``driver`` is set after
    construction). ``applies`` says whether the release has what it breaks."""

    driver: Any = None

    @staticmethod
    def applies() -> bool:
        return True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bug_steps: list[int] = []

    def bug(self) -> None:
        self.bug_steps.append(self.driver.step if self.driver else 0)


class FreesInReverse(_Broken):
    """Blocks freed in one call enter the queue in the opposite order (where
    they all go to one end: 0.15-0.23)."""

    @staticmethod
    def applies() -> bool:
        return not FEATURES.partial

    def free_blocks(self, ordered_blocks: Any, *a: Any, **kw: Any) -> None:
        blocks = list(ordered_blocks)
        reaching_zero: collections.Counter[int] = collections.Counter()
        for b in {id(b): b for b in blocks}.values():
            if b.ref_cnt == 1 and not b.is_null:
                reaching_zero[id(getattr(b, "pool", None) or self)] += 1
        if any(n >= 2 for n in reaching_zero.values()):
            self.bug()
        super().free_blocks(blocks[::-1], *a, **kw)


class NullTouchFlipped(_Broken):
    """The null block's ref_cnt in touch the other way round: counted where
    the release skips it (0.33), skipped where the release counts it."""

    def touch(self, blocks: Any) -> None:
        blocks = list(blocks)
        before = self.null_block.ref_cnt
        super().touch(blocks)
        if any(b.is_null for b in blocks):
            self.bug()
            if self.null_block.ref_cnt != before:
                self.null_block.ref_cnt = before
            else:
                self.null_block.ref_cnt += 1


class _StoredEventField(_Broken):
    """A BlockStored field the release has, queued with the wrong value."""

    field = ""

    @classmethod
    def applies(cls) -> bool:
        return cls.field in FEATURES.stored_fields

    def wrong(self, value: Any) -> Any:
        raise NotImplementedError

    def cache_full_blocks(self, *a: Any, **kw: Any) -> None:
        n = len(self.kv_event_queue)
        super().cache_full_blocks(*a, **kw)
        for i in range(n, len(self.kv_event_queue)):
            event = self.kv_event_queue[i]
            value = getattr(event, self.field, None)
            wrong = self.wrong(value)
            if isinstance(event, vllm_events.BlockStored) and wrong != value:
                self.bug()
                self.kv_event_queue[i] = msgspec.structs.replace(event, **{self.field: wrong})


class StoredWithoutExtraKeys(_StoredEventField):
    field = "extra_keys"

    def wrong(self, value: Any) -> Any:
        return None


class StoredInGroupZero(_StoredEventField):
    field = "group_idx"

    def wrong(self, value: Any) -> Any:
        return 0


class RemovedInGroupZero(_Broken):
    """BlockRemoved events of evictions queued with group_idx 0."""

    @staticmethod
    def applies() -> bool:
        return "group_idx" in vllm_events.BlockRemoved.__struct_fields__

    def _maybe_evict_cached_block(self, block: Any) -> bool:
        n = len(self.kv_event_queue)
        evicted = super()._maybe_evict_cached_block(block)
        for i in range(n, len(self.kv_event_queue)):
            event = self.kv_event_queue[i]
            if isinstance(event, vllm_events.BlockRemoved) and event.group_idx:
                self.bug()
                self.kv_event_queue[i] = msgspec.structs.replace(event, group_idx=0)
        return evicted


class IgnoresBlockMask(_Broken):
    @staticmethod
    def applies() -> bool:
        return FEATURES.block_mask

    def cache_full_blocks(self, request, blocks, num_cached, num_full, *a, block_mask=None, **kw):
        if block_mask is not None and any(
            not keep and not b.is_null for keep, b in zip(block_mask, blocks[num_cached:num_full])
        ):
            self.bug()
        super().cache_full_blocks(request, blocks, num_cached, num_full, *a, **kw)


class FreesUncachedToBack(_Broken):
    """0.15's order: blocks meant for the front appended instead."""

    @staticmethod
    def applies() -> bool:
        return FEATURES.prepend_n

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        queue = self.free_block_queue
        append_n = queue.append_n

        def prepend_n(blocks: list) -> None:
            if blocks and queue.num_free_blocks:
                self.bug()
            append_n(blocks)

        queue.prepend_n = prepend_n


class TokensOffByOne(_Broken):
    @staticmethod
    def applies() -> bool:
        return FEATURES.partial

    def _insert_block_hash(self, key: bytes, block: Any, num_tokens: int | None) -> None:
        before = block.block_hash_num_tokens
        super()._insert_block_hash(key, block, None if num_tokens is None else num_tokens + 1)
        if block.block_hash_num_tokens != before and num_tokens is not None:
            self.bug()


class WatchersAfterEviction(_Broken):
    @staticmethod
    def applies() -> bool:
        return FEATURES.unpin

    def get_new_blocks(self, num_blocks: int) -> list:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        watchers, self._reuse_watchers = self._reuse_watchers, {}
        blocks = super().get_new_blocks(num_blocks)
        self._reuse_watchers = watchers
        if any(b.block_id in watchers for b in blocks):
            self.bug()
        self._notify_reuse(blocks)
        return blocks


BROKEN = [
    FreesInReverse,
    NullTouchFlipped,
    StoredWithoutExtraKeys,
    StoredInGroupZero,
    RemovedInGroupZero,
    IgnoresBlockMask,
    FreesUncachedToBack,
    TokensOffByOne,
    WatchersAfterEviction,
]


def broken_pool_caught(broken: type, patch: Patch, seeds: range = SEEDS, steps: int = STEPS) -> None:
    """A broken pool the release can have fails the comparison at the first
    step whose result its bug changed, over the first two seeds that reach
    the bug; ``HarnessFailure`` otherwise (the traces would not see it)."""
    caught = 0
    for seed in seeds:
        cand = (broken.__name__, broken, vllm_events.BlockStored, VllmCollector)
        driver, r = make_driver(seed, cand, patch)
        pool = driver.sides[1].pool
        pool.driver = driver
        try:
            driver.run(r, steps)
        except Mismatch as exc:
            where = f"{broken.__name__}, seed {seed}"
            if not pool.bug_steps:
                raise HarnessFailure(f"{where}: a mismatch without the bug:\n{exc}") from None
            if driver.step != pool.bug_steps[0]:
                raise HarnessFailure(f"{where}: the bug showed at step {pool.bug_steps[0]} but was "
                                     f"reported at step {driver.step}:\n{exc}") from None
            if f"seed {seed}" not in str(exc) or f"step {driver.step}:" not in str(exc):
                raise HarnessFailure(f"{where}: the report names neither seed nor step:\n{exc}") from None
            caught += 1
            if caught == 2:
                return
        else:
            if pool.bug_steps:
                raise HarnessFailure(f"{broken.__name__}, seed {seed}: the bug showed at steps "
                                     f"{pool.bug_steps} but nothing was reported")
    if not caught:
        raise HarnessFailure(f"{broken.__name__}: the workload never reached the bug")


def applicable_broken() -> list[type]:
    """The broken pools this vLLM can have (at least one, or the traces
    prove nothing here)."""
    found = [b for b in BROKEN if b.applies()]
    if not found:
        raise HarnessFailure(f"no broken pool applies to vLLM {VERSION}")
    return found


def line_has_the_release_api(name: str, line: Any = None) -> None:
    """kvpool's line shows the driver what the release shows: the same
    features (or more: one core serves every line), read the same way off
    its classes, and every public method and attribute of the release's
    pool, block, queue and map."""
    _, pool_cls, stored_cls, _ = candidate(name, 0, line)
    got = Features.detect(pool_cls, stored_cls)
    # One core serves every line: a line may have more of the queue's
    # methods than its release, never fewer of anything.
    for field in dataclasses.fields(Features):
        want, have = getattr(FEATURES, field.name), getattr(got, field.name)
        if isinstance(want, bool):
            if want and not have:
                raise ProofFailure(f"kvpool's line lacks {field.name} (vLLM {VERSION} has it)")
        elif have != want:
            raise ProofFailure(f"{field.name}: kvpool's line has {have}, vLLM {VERSION} {want}")
    ours, theirs = pool_cls(4, True, 1), vllm_block_pool.BlockPool(4, True, 1)
    for what, a, b in (
        ("BlockPool", ours, theirs),
        ("KVCacheBlock", ours.blocks[1], theirs.blocks[1]),
        ("FreeKVCacheBlockQueue", ours.free_block_queue, theirs.free_block_queue),
        ("BlockHashToBlockMap", ours.cached_block_hash_to_block, theirs.cached_block_hash_to_block),
    ):
        # Public names (the private ones vLLM's callers use are driven above).
        missing = sorted(n for n in dir(b) if not n.startswith("_") and not hasattr(a, n))
        if missing:
            raise ProofFailure(f"kvpool's {what} lacks {missing} of vLLM {VERSION}'s")


def applies(line: Any) -> str | None:
    """Every line has a pool: the traces apply to every build."""
    return None


def cases(line: Any, seeds: range = PROVE_SEEDS, steps: int = STEPS) -> list[Case]:
    """What ``--prove`` runs on ``line``: the line's API against the
    release's, vLLM's pool against itself and kvpool's (as installed) against
    vLLM's over each seed, with the copy-on-write repeats where the build
    has them, and each applicable broken pool caught."""
    quiet_pools()
    out = [Case("the line has the release's API",
                lambda patch: line_has_the_release_api("c-extension-vllm-events", line))]
    for name in PROVE_CANDIDATES:
        for seed in seeds:
            out.append(Case(f"{name}, seed {seed}",
                            lambda patch, n=name, s=seed: check_same(n, s, patch, line=line, steps=steps)))
        if REPEATS:
            for seed in seeds[: max(1, len(seeds) // 4)]:
                out.append(Case(f"{name}, seed {seed}, repeated blocks",
                                lambda patch, n=name, s=seed: check_same(n, s, patch, True, line, steps)))
    for broken in applicable_broken():
        out.append(Case(f"broken pool {broken.__name__} caught",
                        lambda patch, b=broken: broken_pool_caught(b, patch, seeds, steps)))
    return out
