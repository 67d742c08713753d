"""Differential tests: kvpool.v0_33's BlockPool, over each core, against vLLM
0.33.0's own pure-Python BlockPool, driven in lock-step by seeded random
operation sequences (``tests/_release_driver.py``: requests with real chained
sha256 block hashes made by vLLM's own block hasher, shared prefixes, LoRA /
cache_salt / multimodal features / session ids, partial entries and
promotions, move_block_hashes, reuse watchers, cross-pool frees with a vLLM
pool, block masks, hybrid block sizes, caching on and off, events and metrics
on and off, lookahead tokens, the CPU medium).

After every step: the returned block ids, every block's fields (neighbours
as ids), the free-queue order, the map (entries and get_one_block), the
blocks' secondary keys, free count, usage, is_block_writable, the queued
events and those taken (msgpack bytes), the metrics collector (keys, access
counts, evictions; not timestamps), the reuse-watcher calls (block id, its
ref_cnt and hash at the call, in order) and the other pool of cross-pool
frees. The first difference fails with the seed, the step, the operation,
what differs and both states.

The candidate ``vllm`` runs vLLM's pool against itself (the harness must
pass), and ``test_harness_catches_broken_pool`` checks that deliberately
broken vLLM pools are caught at the very step their bug shows.

``KVPOOL_DIFF33_SEEDS`` (default 48) and ``KVPOOL_DIFF33_STEPS`` (default 250)
scale the run.
"""

from __future__ import annotations

import collections
import importlib
import logging
import os
import random
from types import ModuleType, SimpleNamespace
from typing import Any

import msgspec
import pytest

try:
    # Not just ``import vllm``: a checkout's tests/vllm directory on sys.path
    # would satisfy that as an empty namespace package.
    import vllm.v1.core.block_pool  # noqa: F401
    from vllm import __version__ as _vllm_version
except ImportError as exc:
    pytest.skip(f"vLLM 0.33.x is not importable here ({exc})", allow_module_level=True)
if not _vllm_version.startswith("0.33."):
    pytest.skip(f"vLLM {_vllm_version} is not 0.33.x", allow_module_level=True)

from vllm.distributed import kv_events as vllm_events  # noqa: E402
from vllm.lora.request import LoRARequest
from vllm.utils.hashing import sha256
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VllmCollector
from vllm.v1.hisparse.block_pool import SharedEventQueueBlockPool

from _release_driver import Config, Driver, HarnessError, Mismatch, Side, block_fields

# The block hasher needs vLLM's seed for the first block's parent hash.
if not hasattr(kv_cache_utils, "NONE_HASH"):
    kv_cache_utils.init_none_hash(sha256)

SEEDS = range(int(os.environ.get("KVPOOL_DIFF33_SEEDS", "48")))
STEPS = int(os.environ.get("KVPOOL_DIFF33_STEPS", "250"))

CORE_MODULES = {"c-extension": "kvpool._core", "pure-python": "kvpool._core_py"}
CORES = [pytest.param("c-extension", marks=pytest.mark.c_extension), "pure-python"]
CANDIDATES = [*CORES, "vllm"]


def _mm_feature(identifier: str, offset: int, length: int) -> Any:
    try:
        from vllm.multimodal.inputs import PlaceholderRange

        position: Any = PlaceholderRange(offset=offset, length=length)
    except ImportError:
        position = SimpleNamespace(offset=offset, length=length)
    return SimpleNamespace(identifier=identifier, mm_position=position)


def _embeds(prompt: list[int]) -> Any:
    """Prompt embeddings (a function of the tokens, so equal prefixes still hit)."""
    import torch

    return torch.tensor(prompt, dtype=torch.float32).unsqueeze(1).repeat(1, 4)


def _lora(name: str, int_id: int, path: str) -> LoRARequest:
    return LoRARequest(lora_name=name, lora_int_id=int_id, lora_path=path)


class RecordingBlockPool(vllm_block_pool.BlockPool):
    """vLLM's pool, unchanged, plus two records: where each block's
    BlockRemoved events start in the event queue (their order after the first
    follows a Python set), and counts of what the workload exercised."""

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
        self.seen["removed keys"] += len(block_hashes)
        if len(block_hashes) > 1:
            self.seen["block with several keys removed"] += 1
        super()._emit_block_removed_events(block_hashes)

    def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks, *a, **kw):
        for blk in blocks[num_cached_blocks:num_full_blocks]:
            if blk.block_hash is not None:
                self.seen["promotion candidate"] += 1
        if kw.get("block_mask") is not None:
            self.seen["block_mask"] += 1
        for attr in ("lora_request", "cache_salt", "mm_features", "session_id", "prompt_embeds"):
            if getattr(request, attr) is not None and getattr(request, attr) != []:
                self.seen[attr] += 1
        if self.num_hash_lookahead_tokens and self.enable_kv_cache_events:
            self.seen["lookahead events"] += 1
        return super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, *a, **kw)

    def cache_partial_block(self, *a: Any, **kw: Any) -> Any:
        self.seen["partial"] += 1
        return super().cache_partial_block(*a, **kw)

    def _notify_reuse(self, blocks: Any) -> None:
        blocks = list(blocks)
        fired = [b for b in blocks if b.block_id in self._reuse_watchers]
        self.seen["watcher fired"] += len(fired)
        super()._notify_reuse(blocks)

    def free_blocks(self, ordered_blocks: Any) -> None:
        ordered_blocks = list(ordered_blocks)
        if any(b.pool is not None and b.pool is not self for b in ordered_blocks):
            self.seen["cross-pool free"] += 1
        if any(b.is_null for b in ordered_blocks):
            self.seen["null block freed"] += 1
        super().free_blocks(ordered_blocks)

    def reset_prefix_cache(self) -> bool:
        ok = super().reset_prefix_cache()
        self.seen["reset done" if ok else "reset refused"] += 1
        return ok


@pytest.fixture(autouse=True)
def _quiet_pools() -> None:
    # Refused resets log a warning per call; keep the output readable.
    for name in ("vllm.v1.core.block_pool", "kvpool"):
        logging.getLogger(name).setLevel(logging.ERROR)


_pool_classes: dict[str, type] = {}


def _kvpool_v0_33() -> ModuleType:
    # Imported here, not at the top: a missing kvpool.v0_33 is an ImportError
    # in every kvpool test (loud), while the harness self-checks still run.
    return importlib.import_module("kvpool.v0_33")


def candidate(name: str, seed: int) -> tuple[type, type, type]:
    """(pool class, BlockStored class, metrics collector class) of a candidate."""
    if name == "vllm":
        return vllm_block_pool.BlockPool, vllm_events.BlockStored, VllmCollector
    v33 = _kvpool_v0_33()
    core = importlib.import_module(CORE_MODULES[name])
    if name not in _pool_classes:
        _pool_classes[name] = v33.make_block_pool_class(core)
    # kvpool's pool is given vLLM's collector inside vLLM; its own one too.
    collector = VllmCollector if seed % 2 == 0 else v33.KVCacheMetricsCollector
    return _pool_classes[name], v33.BlockStored, collector


def make_side(label: str, pool_cls: type, stored_cls: type, collector_cls: type, cfg: Config) -> Side:
    collector = collector_cls(sample_rate=cfg.sample_rate) if cfg.metrics else None
    args, kwargs = cfg.pool_args(collector)
    pool = pool_cls(*args, **kwargs)
    foreign = vllm_block_pool.BlockPool(cfg.foreign_blocks, True, cfg.hash_block_size)
    side = Side(label, pool, foreign, stored_cls, collector)
    if isinstance(pool, RecordingBlockPool):
        side.removal_segments = pool.segments
    return side


def make_driver(
    seed: int,
    cand: tuple[str, type, type, type],
    monkeypatch,
    repeats: bool = False,
    ref_cls: Any = RecordingBlockPool,
) -> tuple[Driver, random.Random]:
    label, pool_cls, stored_cls, collector_cls = cand
    r = random.Random(seed)
    cfg = Config.random(r)
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1" if cfg.int_hashes else "0")
    ref = make_side("vLLM 0.33.0", ref_cls, vllm_events.BlockStored, VllmCollector, cfg)
    other = make_side(label, pool_cls, stored_cls, collector_cls, cfg)
    driver = Driver(
        cfg,
        [ref, other],
        hasher=kv_cache_utils.get_request_block_hasher(cfg.hash_block_size, sha256, cfg.lookahead),
        make_lora=_lora,
        make_mm=_mm_feature,
        make_embeds=_embeds,
        label=f"seed {seed}, {label} vs vLLM 0.33.0",
        check_invariants_on=[label] if label.startswith("kvpool") else [],
        repeats=repeats,
    )
    return driver, r


def run_diff(seed: int, cand: tuple[str, type, type, type], monkeypatch, **kw: Any) -> Driver:
    driver, r = make_driver(seed, cand, monkeypatch, **kw)
    driver.run(r, STEPS)
    return driver


def check_same(name: str, seed: int, monkeypatch, **kw: Any) -> None:
    pool_cls, stored_cls, collector_cls = candidate(name, seed)
    if "wrap" in kw:
        pool_cls = kw.pop("wrap")(pool_cls)
    label = name if name == "vllm" else f"kvpool.v0_33 ({name} core)"
    try:
        run_diff(seed, (label, pool_cls, stored_cls, collector_cls), monkeypatch, **kw)
    except Mismatch as exc:
        pytest.fail(f"{exc}", pytrace=False)
    except HarnessError as exc:
        pytest.fail(f"HARNESS BUG (not a kvpool difference): {exc}", pytrace=False)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", CANDIDATES)
def test_same_as_vllm(name: str, seed: int, monkeypatch) -> None:
    check_same(name, seed, monkeypatch)


@pytest.mark.parametrize("seed", SEEDS[:12])
@pytest.mark.parametrize("name", CANDIDATES)
def test_same_as_vllm_with_repeated_blocks(name: str, seed: int, monkeypatch) -> None:
    """As above, plus one free_blocks call naming a block twice, each covered
    by a reference: vLLM 0.33's scheduler frees the retained endpoints of two
    copy-on-writes from one source block that way."""
    check_same(name, seed, monkeypatch, repeats=True)


class RecordingSharedQueue(SharedEventQueueBlockPool, RecordingBlockPool):
    """vLLM's HiSparse host pool (its event queue is a property reading the
    owner's), recording like the reference; the owner's queue is never
    cleared by the pool, so the recorded places stay valid."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, event_owner=SimpleNamespace(kv_event_queue=[]), **kwargs)

    def segments(self, clear: bool) -> list[tuple[int, int]]:
        return super().segments(clear=False)


def shared_queue_class(base: type) -> type:
    """The same subclass over another pool class (the body of vLLM 0.33's
    vllm/v1/hisparse/block_pool.py)."""

    class SharedQueue(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._event_owner = SimpleNamespace(kv_event_queue=[])
            super().__init__(*args, **kwargs)

        @property
        def kv_event_queue(self) -> list:
            return self._event_owner.kv_event_queue

        @kv_event_queue.setter
        def kv_event_queue(self, events: list) -> None:
            assert not events

    return SharedQueue


@pytest.mark.parametrize("seed", SEEDS[:8])
@pytest.mark.parametrize("name", CANDIDATES)
def test_same_as_vllm_with_event_queue_property(name: str, seed: int, monkeypatch) -> None:
    """A Python subclass turns kv_event_queue into a property (vLLM 0.33's
    SharedEventQueueBlockPool): every event must go through it."""
    check_same(name, seed, monkeypatch, wrap=shared_queue_class, ref_cls=RecordingSharedQueue)


def test_workload_covers_every_operation(monkeypatch) -> None:
    """Over all seeds, vLLM's pool against itself: every operation family is
    applied and the interesting paths of vLLM's pool are taken."""
    ops: collections.Counter[str] = collections.Counter()
    seen: collections.Counter[str] = collections.Counter()
    configs = []
    for seed in SEEDS:
        cand = ("vllm", vllm_block_pool.BlockPool, vllm_events.BlockStored, VllmCollector)
        driver = run_diff(seed, cand, monkeypatch, repeats=True)
        ops.update(driver.counts)
        seen.update(driver.sides[0].pool.seen)
        configs.append(driver.cfg)
    missing = [name for name in Driver.OPS if not ops[name]]
    assert not missing, f"operations never applied: {missing} ({ops})"
    for what in (
        "promotion candidate",
        "block_mask",
        "partial",
        "watcher fired",
        "cross-pool free",
        "null block freed",
        "reset done",
        "reset refused",
        "block with several keys removed",
        "lora_request",
        "cache_salt",
        "mm_features",
        "session_id",
        "prompt_embeds",
        "lookahead events",
    ):
        assert seen[what], f"never exercised: {what} ({seen})"
    for attr, values in (
        ("enable_caching", {True, False}),
        ("events", {True, False}),
        ("metrics", {True, False}),
        ("int_hashes", {True, False}),
    ):
        assert {getattr(c, attr) for c in configs} == values, attr
    assert {c.medium for c in configs} >= {"GPU", "CPU"}
    assert any(c.lookahead for c in configs)
    assert any(len(set(c.group_block_sizes)) > 1 for c in configs)


# ---------------------------------------------------------------------------
# The harness has teeth: broken pools are caught where their bug shows.


class _Broken(vllm_block_pool.BlockPool):
    """vLLM's pool with one bug; ``bug_steps`` records each step at which the
    bug changed something observable (``driver`` is set after construction)."""

    driver: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bug_steps: list[int] = []

    def bug(self) -> None:
        self.bug_steps.append(self.driver.step if self.driver else 0)


class FreesUncachedToBack(_Broken):
    """0.15's order: blocks without a hash appended instead of prepended."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        queue = self.free_block_queue
        append_n = queue.append_n

        def prepend_n(blocks: list) -> None:
            if blocks and queue.num_free_blocks:
                self.bug()
            append_n(blocks)

        queue.prepend_n = prepend_n


class RemovedWithoutGroup(_Broken):
    def _emit_block_removed_events(self, block_hashes: list) -> None:
        if not self.enable_kv_cache_events:
            return
        for key in block_hashes:
            self.bug()
            self.kv_event_queue.append(
                vllm_events.BlockRemoved(
                    block_hashes=[
                        kv_cache_utils.maybe_convert_block_hash(kv_cache_utils.get_block_hash(key))
                    ],
                    medium=self.medium,
                )
            )


class TokensOffByOne(_Broken):
    def _insert_block_hash(self, key: bytes, block: Any, num_tokens: int | None) -> None:
        before = block.block_hash_num_tokens
        super()._insert_block_hash(key, block, None if num_tokens is None else num_tokens + 1)
        if block.block_hash_num_tokens != before and num_tokens is not None:
            self.bug()


class WatchersAfterEviction(_Broken):
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


class TouchesNull(_Broken):
    """0.32's touch: the null block's ref_cnt goes up."""

    def touch(self, blocks: Any) -> None:
        blocks = list(blocks)
        for b in blocks:
            if b.is_null:
                self.bug()
                b.ref_cnt += 1
        super().touch(blocks)


class UnpinsToFront(_Broken):
    def unpin_blocks(self, blocks: Any, on_reuse: Any) -> None:
        released = []
        for block in blocks:
            block.ref_cnt -= 1
            self._reuse_watchers[block.block_id] = on_reuse
            if block.ref_cnt == 0:
                released.append(block)
        if released and self.free_block_queue.num_free_blocks:
            self.bug()
        self.free_block_queue.prepend_n(released)


BROKEN = [
    FreesUncachedToBack,
    RemovedWithoutGroup,
    TokensOffByOne,
    WatchersAfterEviction,
    TouchesNull,
    UnpinsToFront,
]


@pytest.mark.parametrize("broken", BROKEN, ids=lambda c: c.__name__)
def test_harness_catches_broken_pool(broken: type, monkeypatch) -> None:
    """Each broken pool fails the comparison at the first step whose result
    its bug changed (over the first seeds that reach the bug at all)."""
    caught = 0
    for seed in SEEDS:
        cand = (broken.__name__, broken, vllm_events.BlockStored, VllmCollector)
        driver, r = make_driver(seed, cand, monkeypatch)
        pool = driver.sides[1].pool
        pool.driver = driver
        try:
            driver.run(r, STEPS)
        except Mismatch as exc:
            assert pool.bug_steps, f"seed {seed}: a mismatch without the bug:\n{exc}"
            assert driver.step == pool.bug_steps[0], (
                f"seed {seed}: the bug showed at step {pool.bug_steps[0]} but was "
                f"reported at step {driver.step}:\n{exc}"
            )
            assert f"seed {seed}" in str(exc) and f"step {driver.step}:" in str(exc)
            caught += 1
            if caught == 3:
                return
        else:
            assert not pool.bug_steps, (
                f"seed {seed}: the bug showed at steps {pool.bug_steps} but nothing was reported"
            )
    assert caught, f"{broken.__name__}: the workload never reached the bug"


# ---------------------------------------------------------------------------
# Pieces compared directly


def test_hash_views_match() -> None:
    """BlockHashListWithBlockSize and resolve_block_hashes: the last sub-hash
    of each coarse block (0.33), lengths, slices, iteration."""
    v33 = _kvpool_v0_33()
    r = random.Random(7)
    for _ in range(200):
        hbs = r.choice((1, 2, 4, 16))
        scale = r.choice((1, 2, 3, 4))
        hashes = [r.randbytes(32) for _ in range(r.randint(0, 13))]
        want = kv_cache_utils.BlockHashListWithBlockSize(hashes, hbs, hbs * scale)
        got = v33.BlockHashListWithBlockSize(hashes, hbs, hbs * scale)
        assert len(got) == len(want)
        assert list(got) == list(want)
        assert [got[i] for i in range(len(got))] == [want[i] for i in range(len(want))]
        start, stop = r.randint(-3, 5), r.randint(-3, 8)
        assert got[start:stop] == want[start:stop]
        assert got[::2] == want[::2]
        for bs in (hbs, hbs * scale):
            w = kv_cache_utils.resolve_block_hashes(hashes, hbs, bs)
            g = v33.resolve_block_hashes(hashes, hbs, bs)
            assert list(g) == list(w)


@pytest.mark.parametrize("int_hashes", ["1", "0"])
def test_event_structs_encode_like_vllm(int_hashes: str, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", int_hashes)
    v33 = _kvpool_v0_33()
    stored = dict(
        block_hashes=[1, 2**63 + 5, b"\x01" * 32],
        parent_block_hash=None,
        token_ids=[1, 2, 3],
        block_size=16,
        lora_id=None,
        medium="CPU",
        lora_name=None,
    )
    variants = [
        {},
        {"extra_keys": [("adapter-0",), None, ("img", 3), ("salt",)]},
        {"group_idx": 0},
        {"group_idx": 2, "session_id": "s", "lookahead_token_ids": [[1], [2, 3]]},
        {"kv_cache_spec_kind": "full", "kv_cache_spec_sliding_window": 128},
        {"locality": "LOCAL", "ownership": "tier-1", "lora_id": 3, "lora_name": "a"},
        {"parent_block_hash": 7},
    ]
    encode = msgspec.msgpack.encode
    for extra in variants:
        kw = {**stored, **extra}
        assert encode(v33.BlockStored(**kw)) == encode(vllm_events.BlockStored(**kw)), kw
    for kw in ({}, {"group_idx": 0}, {"group_idx": 3, "locality": "REMOTE", "ownership": "x"}):
        args = dict(block_hashes=[5], medium="GPU", **kw)
        assert encode(v33.BlockRemoved(**args)) == encode(vllm_events.BlockRemoved(**args))
    assert encode(v33.AllBlocksCleared()) == encode(vllm_events.AllBlocksCleared())
    events = [
        (v33.BlockStored(**stored), vllm_events.BlockStored(**stored)),
        (v33.BlockRemoved(block_hashes=[1], medium=None), vllm_events.BlockRemoved(block_hashes=[1], medium=None)),
        (v33.AllBlocksCleared(), vllm_events.AllBlocksCleared()),
    ]
    for rank in (None, 2):
        got = v33.KVEventBatch(ts=1.5, events=[e for e, _ in events], data_parallel_rank=rank)
        want = vllm_events.KVEventBatch(ts=1.5, events=[e for _, e in events], data_parallel_rank=rank)
        assert encode(got) == encode(want)
    # vLLM's consumers decode kvpool's bytes into vLLM's classes.
    decoded = msgspec.msgpack.decode(encode(got), type=vllm_events.KVEventBatch)
    assert decoded == want
    assert (v33.MEDIUM_GPU, v33.MEDIUM_CPU, v33.MEDIUM_STORAGE) == (
        vllm_events.MEDIUM_GPU,
        vllm_events.MEDIUM_CPU,
        vllm_events.MEDIUM_STORAGE,
    )


@pytest.mark.parametrize("core_name", CORES)
def test_standalone_block_like_vllm(core_name: str) -> None:
    """A block built outside a pool, as vLLM 0.33's connectors build them."""
    core = importlib.import_module(CORE_MODULES[core_name])
    Block = core.KVCacheBlock33
    VBlock = kv_cache_utils.KVCacheBlock

    def fields(b: Any) -> tuple:
        return block_fields(b, None)

    key = b"k" * 32 + (1).to_bytes(4, "big")
    for args, kwargs in (
        ((0,), {}),
        ((5, 2), {}),
        ((), {"block_id": 7}),
        ((3,), {"_block_hash": key}),
        ((3,), {"_block_hash": key, "_block_hash_num_tokens": 12}),
        ((9,), {"ref_cnt": 1, "is_null": True}),
    ):
        got, want = Block(*args, **kwargs), VBlock(*args, **kwargs)
        assert fields(got) == fields(want), (args, kwargs)
        got.ref_cnt += 1
        want.ref_cnt += 1
        assert got.ref_cnt == want.ref_cnt
        got.reset_hash()
        want.reset_hash()
        assert fields(got) == fields(want)
        got.set_block_hash(key, num_tokens=16)
        want.set_block_hash(key, num_tokens=16)
        assert fields(got) == fields(want)
        got.reset_hash()
        got.set_block_hash(key)
        want.reset_hash()
        want.set_block_hash(key)
        assert fields(got) == fields(want)


@pytest.mark.parametrize("core_name", CORES)
def test_hash_map_like_vllm(core_name: str) -> None:
    """BlockHashToBlockMap on its own, with standalone blocks: insert, pop
    (also of an id the key does not hold), contain, get_one_block, len and
    the ``_cache`` snapshot."""
    _kvpool_v0_33()  # the 0.33 line must exist
    core = importlib.import_module(CORE_MODULES[core_name])
    r = random.Random(11)
    for _ in range(20):
        got_map, want_map = core.BlockHashToBlockMap(), vllm_block_pool.BlockHashToBlockMap()
        got_blocks = [core.KVCacheBlock33(i) for i in range(6)]
        want_blocks = [kv_cache_utils.KVCacheBlock(i) for i in range(6)]
        keys = [bytes([k]) * 8 + (k % 2).to_bytes(4, "big") for k in range(4)]
        for step in range(150):
            op, key, i = r.choice(("insert", "insert", "pop", "contain", "get")), r.choice(keys), r.randrange(6)
            if op == "insert":
                got, want = got_map.insert(key, got_blocks[i]), want_map.insert(key, want_blocks[i])
            elif op == "pop":
                got, want = _id(got_map.pop(key, i)), _id(want_map.pop(key, i))
            elif op == "contain":
                got, want = got_map.contain(key, i), want_map.contain(key, i)
            else:
                got, want = _id(got_map.get_one_block(key)), _id(want_map.get_one_block(key))
            assert got == want, (step, op, key, i)
            assert len(got_map) == len(want_map)
            snapshot = {
                k: sorted(v) if isinstance(v, dict) else [v.block_id] for k, v in got_map._cache.items()
            }
            expected = {
                k: sorted(v) if isinstance(v, dict) else [v.block_id] for k, v in want_map._cache.items()
            }
            assert snapshot == expected, (step, op)
            for k in keys:
                assert _id(got_map.get_one_block(k)) == _id(want_map.get_one_block(k)), (step, k)


def _id(block: Any) -> int | None:
    return None if block is None else block.block_id
