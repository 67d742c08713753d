"""The benchmark behind the README's table: the compiled core against its
pure-Python twin, side by side, in one run.

    python -m kvpool.bench            # full run, about 1-2 minutes
    python -m kvpool.bench --quick    # about 10 seconds, smaller pools
    python -m kvpool.bench --json     # machine-readable results on stdout

How it stays honest:

* Both cores run in the same process, A/B interleaved: every round times
  every operation once per core, and the order of the two cores alternates
  from one round to the next, so drift (frequency scaling, a noisy
  neighbour) hits both alike. A cell is the median over rounds; the ratio is
  the median of the per-round ratios (each round pairs the two cores), the
  spread their interquartile range.
* A timed batch is one ``perf_counter_ns`` pair around many repetitions of
  the pool calls; workloads (hashes, requests, traces) are generated before
  the clock starts, and only pool calls and the minimal loop that a caller
  would write sit between the two reads.
* Each batch is preceded by an untimed warm-up; batch sizes are calibrated
  per core (once, during a warm-up phase) to last about the same wall time.
* The cyclic garbage collector is disabled inside timed batches, for both
  cores alike (a full collection runs before each batch). This favours the
  pure-Python core, whose blocks the collector would otherwise walk.
* Construction, ``gc.collect()`` and memory are measured in a fresh
  interpreter per core (``--child``), where nothing else is alive.

The workload classes are shared with the pytest-benchmark files in
``benchmarks/``: ``step()`` is one repetition, ``run(reps)`` a timed batch.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns
from types import ModuleType
from typing import Any

from . import __version__
from .block_pool import make_block_pool_class
from .v0_33 import make_block_pool_class as make_block_pool_class_v0_33
from .v0_34 import make_block_pool_class as make_block_pool_class_v0_34

__all__ = [
    "CORES",
    "OPERATIONS",
    "FakeRequest",
    "load_core",
    "lookup_per_block",
    "main",
    "make_trace",
    "package_dir",
]

# Core key -> (label in the table, module). Pure-Python first: it is the
# baseline, and the column order of the table.
CORES: dict[str, tuple[str, str]] = {
    "pure": ("pure-Python", "kvpool._core_py"),
    "compiled": ("compiled", "kvpool._core"),
}

# vLLM API line -> the facade over a core. Every line runs over the same two
# cores; the 0.33 twin is vLLM 0.33's design (blocks linked through
# themselves, each referring to its pool, a dict map), the 0.34 twin the
# same with 0.34's blocks and map.
LINES: dict[str, Callable[[ModuleType], type]] = {
    "0.15": make_block_pool_class,
    "0.33": make_block_pool_class_v0_33,
    "0.34": make_block_pool_class_v0_34,
}
# The block class of each line but 0.15's (the core's name for it).
_BLOCK_CLASSES = {"0.33": "KVCacheBlock33", "0.34": "KVCacheBlock34"}
_line = "0.15"  # the line being measured (set by run())

BLOCK_SIZE = 16  # tokens per block, as in vLLM's default
HASH_BYTES = 32  # sha256 digests, vLLM's default block hash
BATCH = 256  # blocks per bulk call in the microbenchmarks
GROUP_IDS = [0]  # one KV-cache group, as in a plain decoder-only model


def package_dir() -> str:
    """The directory of the kvpool in use, with a trailing ``/``: how the
    vLLM benchmarks tell kvpool's own files in a profile. Matching on a
    ``/kvpool/`` in the path would also take every vLLM file of an
    environment built from kvpool's cache (``~/.cache/kvpool/...``)."""
    import kvpool

    return os.path.dirname(os.path.abspath(kvpool.__file__)).replace("\\", "/") + "/"


def _in_source_checkout() -> bool:
    """Whether the kvpool in use is a source tree (it has setup.py beside it)."""
    import kvpool

    return (Path(kvpool.__file__).resolve().parent.parent / "setup.py").exists()


def load_core(key: str, line: str | None = None) -> tuple[ModuleType, type]:
    """The core module and the ``BlockPool`` facade of ``line`` (default:
    the line being measured) over it. With ``KVPOOL_BENCH_BASELINE=vllm``
    the pure-Python column is vLLM's own pool of that line (vLLM must be
    importable): how the issues' one-off tables against vLLM are measured."""
    line = line or _line
    if key == "pure" and os.environ.get("KVPOOL_BENCH_BASELINE") == "vllm":
        return _vllm_baseline(line)
    module = importlib.import_module(CORES[key][1])
    return module, LINES[line](module)


def _vllm_baseline(line: str) -> tuple[ModuleType, type]:
    import vllm
    from vllm.v1.core import block_pool, kv_cache_utils

    expected = {"0.15": ("0.15.", "0.16."), "0.33": ("0.33.",), "0.34": ("0.34.",)}[line]
    if not vllm.__version__.startswith(expected):
        raise ImportError(f"vLLM {vllm.__version__} does not serve the {line} line")
    shim = ModuleType("vllm_baseline")
    shim.KVCacheBlock = kv_cache_utils.KVCacheBlock
    for name in _BLOCK_CLASSES.values():
        setattr(shim, name, kv_cache_utils.KVCacheBlock)
    shim.FreeKVCacheBlockQueue = kv_cache_utils.FreeKVCacheBlockQueue
    shim.__file__ = block_pool.__file__
    return shim, block_pool.BlockPool


def _block_class(core: ModuleType) -> type:
    return getattr(core, _BLOCK_CLASSES.get(_line, "KVCacheBlock"))


def _hashes(rng: random.Random, n: int) -> list[bytes]:
    return [rng.randbytes(HASH_BYTES) for _ in range(n)]


class FakeRequest:
    """What ``cache_full_blocks`` reads from a vLLM ``Request``."""

    __slots__ = ("block_hashes", "all_token_ids", "lora_request")

    def __init__(self, block_hashes: list[bytes], all_token_ids: list[int]) -> None:
        self.block_hashes = block_hashes
        self.all_token_ids = all_token_ids
        self.lora_request = None


def _fake_request(rng: random.Random, num_blocks: int) -> FakeRequest:
    tokens = [rng.randrange(32000) for _ in range(num_blocks * BLOCK_SIZE)]
    return FakeRequest(_hashes(rng, num_blocks), tokens)


# --------------------------------------------------------------------------
# Workloads. ``run(reps)`` returns the nanoseconds of ``reps`` repetitions;
# its loop body is ``step()`` inlined (a function call per repetition would
# be harness overhead), so the two are written next to each other.


class Workload:
    """One operation on one core; ``units`` per repetition (blocks, ops...)."""

    units: int = BATCH

    def step(self) -> Any:
        raise NotImplementedError

    def run(self, reps: int) -> int:
        raise NotImplementedError


class QueuePopleftAppend(Workload):
    """``popleft_n(256)`` then ``append_n`` of the same blocks (they go from
    the head to the tail; the queue is unchanged in size)."""

    def __init__(self, core: ModuleType, BlockPool: type, *, standalone: bool = False,
                 num_blocks: int = 4096) -> None:
        if standalone:
            self.queue = core.FreeKVCacheBlockQueue(
                [_block_class(core)(i) for i in range(num_blocks)]
            )
        else:
            self.pool = BlockPool(num_blocks + 1, True, BLOCK_SIZE)
            self.queue = self.pool.free_block_queue

    def step(self) -> None:
        self.queue.append_n(self.queue.popleft_n(BATCH))

    def run(self, reps: int) -> int:
        popleft_n, append_n = self.queue.popleft_n, self.queue.append_n
        t0 = perf_counter_ns()
        for _ in range(reps):
            append_n(popleft_n(BATCH))
        return perf_counter_ns() - t0


class QueueAppendN(Workload):
    """``append_n`` alone (pytest-benchmark only): ``prepare()`` pops the
    blocks, untimed."""

    def __init__(self, core: ModuleType, BlockPool: type, num_blocks: int = 4096) -> None:
        self.pool = BlockPool(num_blocks + 1, True, BLOCK_SIZE)
        self.queue = self.pool.free_block_queue

    def prepare(self) -> list[Any]:
        return self.queue.popleft_n(BATCH)

    def step(self, blocks: list[Any]) -> None:  # type: ignore[override]
        self.queue.append_n(blocks)


class QueueRemoveAppend(Workload):
    """``remove(b)`` then ``append(b)`` for 256 blocks picked at random
    positions of a 4096-block queue (each pair moves ``b`` to the tail, so
    the positions keep changing); the unit is one remove+append pair."""

    def __init__(self, core: ModuleType, BlockPool: type, num_blocks: int = 4096) -> None:
        self.pool = BlockPool(num_blocks + 1, True, BLOCK_SIZE)
        self.queue = self.pool.free_block_queue
        self.picks = random.Random(7).sample(self.pool.blocks[1:], BATCH)

    def step(self) -> None:
        remove, append = self.queue.remove, self.queue.append
        for b in self.picks:
            remove(b)
            append(b)

    def run(self, reps: int) -> int:
        remove, append, picks = self.queue.remove, self.queue.append, self.picks
        t0 = perf_counter_ns()
        for _ in range(reps):
            for b in picks:
                remove(b)
                append(b)
        return perf_counter_ns() - t0


class NewAndFree(Workload):
    """``get_new_blocks(256)`` then ``free_blocks(reversed(...))`` with
    caching on (the blocks carry no hash, so nothing is evicted)."""

    def __init__(self, core: ModuleType, BlockPool: type, num_blocks: int = 4096) -> None:
        self.pool = BlockPool(num_blocks + 1, True, BLOCK_SIZE)

    def step(self) -> None:
        self.pool.free_blocks(reversed(self.pool.get_new_blocks(BATCH)))

    def run(self, reps: int) -> int:
        get_new_blocks, free_blocks = self.pool.get_new_blocks, self.pool.free_blocks
        t0 = perf_counter_ns()
        for _ in range(reps):
            free_blocks(reversed(get_new_blocks(BATCH)))
        return perf_counter_ns() - t0


class _CachedPrefix(Workload):
    """A pool with 256 blocks cached under a request's hashes, all free."""

    def __init__(self, core: ModuleType, BlockPool: type, num_blocks: int = 4096) -> None:
        self.pool = pool = BlockPool(num_blocks + 1, True, BLOCK_SIZE)
        self.request = _fake_request(random.Random(11), BATCH)
        self.hashes = self.request.block_hashes
        blocks = pool.get_new_blocks(BATCH)
        pool.cache_full_blocks(self.request, blocks, 0, BATCH, BLOCK_SIZE, 0)
        pool.free_blocks(reversed(blocks))
        hit = self.step()
        if hit != BATCH:
            raise RuntimeError(f"{type(self).__name__}: expected {BATCH} hits, got {hit}")


def lookup_per_block(get_cached_block: Callable[..., Any], hashes: Sequence[bytes],
                     ) -> list[Any]:
    """The longest cached prefix the way vLLM's managers find it: one
    ``get_cached_block`` per hash until the first miss (one group)."""
    hit = []
    for h in hashes:
        cached = get_cached_block(h, GROUP_IDS)
        if cached is None:
            break
        hit.append(cached[0])
    return hit


class PrefixHitPerBlock(_CachedPrefix):
    """A prefix-cache hit through the per-block API: ``lookup_per_block``,
    ``touch`` the hit, later ``free_blocks`` it in reverse."""

    def step(self) -> int:
        hit = lookup_per_block(self.pool.get_cached_block, self.hashes)
        self.pool.touch(hit)
        self.pool.free_blocks(reversed(hit))
        return len(hit)

    def run(self, reps: int) -> int:
        pool, hashes = self.pool, self.hashes
        get_cached_block, touch, free_blocks = (
            pool.get_cached_block, pool.touch, pool.free_blocks)
        t0 = perf_counter_ns()
        for _ in range(reps):
            hit = lookup_per_block(get_cached_block, hashes)
            touch(hit)
            free_blocks(reversed(hit))
        return perf_counter_ns() - t0


class PrefixHitBulk(_CachedPrefix):
    """The same hit through the bulk API: one ``find_longest_cache_hit``."""

    def step(self) -> int:
        hit = self.pool.find_longest_cache_hit(self.hashes, GROUP_IDS)[0]
        self.pool.touch(hit)
        self.pool.free_blocks(reversed(hit))
        return len(hit)

    def run(self, reps: int) -> int:
        pool, hashes, gids = self.pool, self.hashes, GROUP_IDS
        find, touch, free_blocks = pool.find_longest_cache_hit, pool.touch, pool.free_blocks
        t0 = perf_counter_ns()
        for _ in range(reps):
            hit = find(hashes, gids)[0]
            touch(hit)
            free_blocks(reversed(hit))
        return perf_counter_ns() - t0


class CacheFullCycle(Workload):
    """Allocate 256 blocks (each evicting the hash it was cached under two
    cycles ago), ``cache_full_blocks`` them for a request, free them in
    reverse. Eight requests with distinct hashes take turns on a pool of 512
    free blocks, so every allocation evicts 256 cached blocks."""

    NUM_REQUESTS = 8

    def __init__(self, core: ModuleType, BlockPool: type) -> None:
        self.pool = BlockPool(2 * BATCH + 1, True, BLOCK_SIZE)
        rng = random.Random(13)
        self.requests = itertools.cycle(
            [_fake_request(rng, BATCH) for _ in range(self.NUM_REQUESTS)]
        )
        for _ in range(4):
            self.step()
        if len(self.pool.cached_block_hash_to_block) != 2 * BATCH:
            raise RuntimeError("CacheFullCycle: the pool does not hold 512 cached blocks")

    def step(self) -> None:
        pool = self.pool
        blocks = pool.get_new_blocks(BATCH)
        pool.cache_full_blocks(next(self.requests), blocks, 0, BATCH, BLOCK_SIZE, 0)
        pool.free_blocks(reversed(blocks))

    def run(self, reps: int) -> int:
        pool, requests = self.pool, self.requests
        get_new_blocks, cache_full_blocks, free_blocks = (
            pool.get_new_blocks, pool.cache_full_blocks, pool.free_blocks)
        t0 = perf_counter_ns()
        for _ in range(reps):
            blocks = get_new_blocks(BATCH)
            cache_full_blocks(next(requests), blocks, 0, BATCH, BLOCK_SIZE, 0)
            free_blocks(reversed(blocks))
        return perf_counter_ns() - t0


# --------------------------------------------------------------------------
# Trace replay: a scheduler's block bookkeeping over a stream of requests.


class TraceRequest(FakeRequest):
    """A request of the trace, with everything the replay needs precomputed."""

    __slots__ = ("lookup_hashes", "num_blocks", "num_full_blocks")

    def __init__(self, block_hashes: list[bytes], all_token_ids: list[int]) -> None:
        super().__init__(block_hashes, all_token_ids)
        num_tokens = len(all_token_ids)
        self.num_full_blocks = len(block_hashes)
        self.num_blocks = -(-num_tokens // BLOCK_SIZE)
        # As vLLM: the last token is always recomputed, so a hit covers at
        # most (num_tokens - 1) // block_size blocks.
        self.lookup_hashes = block_hashes[: (num_tokens - 1) // BLOCK_SIZE]


@dataclass(frozen=True)
class TraceConfig:
    num_requests: int
    pool_blocks: int = 4096
    num_groups: int = 32  # distinct shared prompt prefixes ("system prompts")
    max_running: int = 16  # requests holding blocks at once
    seed: int = 2026


def make_trace(cfg: TraceConfig) -> list[TraceRequest]:
    """Requests whose prompts (8 to 64 full blocks plus a partial one) start
    with one of ``num_groups`` shared prefixes (4 to 47 blocks, Zipf-popular)
    and end with a unique suffix (1 to 16 blocks)."""
    rng = random.Random(cfg.seed)
    groups = []
    for _ in range(cfg.num_groups):
        n = rng.randint(4, 47)
        groups.append((_hashes(rng, n), [rng.randrange(32000) for _ in range(n * BLOCK_SIZE)]))
    weights = [1.0 / (g + 1) for g in range(cfg.num_groups)]
    trace = []
    for _ in range(cfg.num_requests):
        prefix_hashes, prefix_tokens = rng.choices(groups, weights)[0]
        n_prefix = len(prefix_hashes)
        n_suffix = rng.randint(max(1, 8 - n_prefix), min(16, 64 - n_prefix))
        partial = rng.randrange(BLOCK_SIZE)
        base = rng.randrange(32000)
        suffix_tokens = [(base + i) % 32000 for i in range(n_suffix * BLOCK_SIZE + partial)]
        trace.append(TraceRequest(prefix_hashes + _hashes(rng, n_suffix),
                                  prefix_tokens + suffix_tokens))
    return trace


def replay(pool: Any, trace: Sequence[TraceRequest], max_running: int,
           bulk: bool = False) -> tuple[int, int]:
    """Replay ``trace`` on ``pool``: per request, find the longest cached
    prefix (``get_cached_block`` per block, or one ``find_longest_cache_hit``
    with ``bulk``), ``touch`` it, allocate the rest, ``cache_full_blocks``,
    and keep the request running until ``max_running`` newer ones arrive (or
    its blocks are needed); then free its blocks in reverse. Returns (blocks
    hit, blocks allocated), the same for every correct core."""
    get_cached_block = pool.get_cached_block
    find = pool.find_longest_cache_hit if bulk else None  # vLLM's pool has none
    touch, get_new_blocks, free_blocks = pool.touch, pool.get_new_blocks, pool.free_blocks
    cache_full_blocks, num_free = pool.cache_full_blocks, pool.get_num_free_blocks
    gids = GROUP_IDS
    running: deque[list[Any]] = deque()
    hits = allocated = 0
    for req in trace:
        if find is not None:
            blocks = find(req.lookup_hashes, gids)[0]
        else:
            blocks = lookup_per_block(get_cached_block, req.lookup_hashes)
        touch(blocks)
        num_hit = len(blocks)
        need = req.num_blocks - num_hit
        while num_free() < need:
            free_blocks(reversed(running.popleft()))
        blocks += get_new_blocks(need)
        cache_full_blocks(req, blocks, num_hit, req.num_full_blocks, BLOCK_SIZE, 0)
        running.append(blocks)
        if len(running) > max_running:
            free_blocks(reversed(running.popleft()))
        hits += num_hit
        allocated += need
    while running:
        free_blocks(reversed(running.popleft()))
    return hits, allocated


class TraceReplay(Workload):
    """One repetition replays the whole trace on a fresh pool (built before
    the clock starts); the unit is one request."""

    def __init__(self, core: ModuleType, BlockPool: type, trace: list[TraceRequest],
                 cfg: TraceConfig, *, bulk: bool = False) -> None:
        self.BlockPool, self.trace, self.cfg, self.bulk = BlockPool, trace, cfg, bulk
        self.units = len(trace)
        self.stats = replay(self.new_pool(), trace, cfg.max_running, bulk)

    def new_pool(self) -> Any:
        return self.BlockPool(self.cfg.pool_blocks + 1, True, BLOCK_SIZE)

    def step(self, pool: Any | None = None) -> tuple[int, int]:
        return replay(pool if pool is not None else self.new_pool(),
                      self.trace, self.cfg.max_running, self.bulk)

    def run(self, reps: int) -> int:
        total = 0
        for _ in range(reps):
            pool = self.new_pool()
            t0 = perf_counter_ns()
            replay(pool, self.trace, self.cfg.max_running, self.bulk)
            total += perf_counter_ns() - t0
        return total


# --------------------------------------------------------------------------
# The table's rows.


@dataclass(frozen=True)
class Target:
    """``kind`` "ratio": pure/compiled must be >= value. "max": the compiled
    value must be <= value."""

    kind: str
    value: float

    def text(self, unit: str) -> str:
        if self.kind == "ratio":
            return f">= {self.value:g}x"
        return f"<= {self.value:g} {unit.split('/')[0]}"

    def holds(self, ratio: float | None, compiled: float | None) -> bool | None:
        if self.kind == "ratio":
            return None if ratio is None else ratio >= self.value
        return None if compiled is None else compiled <= self.value


@dataclass(frozen=True)
class Scale:
    """The workload size a row's targets are stated for: a ``Settings`` field
    and its value. A row measured at another size (``--quick``, ``--smoke``)
    shows its figures but is not judged: an idle ``gc.collect()`` (~1-6 ms)
    or a pool's fixed cost weighs differently at 200,000 blocks than at the
    1,000,000 a target speaks of."""

    setting: str  # a Settings field: "subprocess_blocks" or "trace_requests"
    value: int
    text: str  # for the table: "1M blocks"

    def holds_for(self, st: Settings) -> bool:
        return bool(getattr(st, self.setting) == self.value)


#: The pool size of the fresh-interpreter rows' targets (construction,
#: gc.collect(), memory per block), and the trace length of the trace's.
AT_1M_BLOCKS = Scale("subprocess_blocks", 1_000_000, "1M blocks")
FULL_TRACE = Scale("trace_requests", 3000, "3,000 requests")


@dataclass(frozen=True)
class Operation:
    id: str
    label: str
    unit: str  # ns/block, ns/op, us/request, ms, B/block
    target: Target | None = None
    # In-process rows: how to build the workload. A row with pure_from and
    # compiled_from borrows its two columns from two other rows (the
    # bulk-vs-loop row). A row with neither is measured in a subprocess.
    factory: Callable[..., Workload] | None = None
    pure_from: str | None = None
    compiled_from: str | None = None
    note: str = ""
    # The 0.33 and later lines' target where it differs (issue 7's, set
    # against vLLM 0.33.0's pool, whose blocks are slotted dataclasses).
    target33: Target | None = None
    # The size the targets are stated for, if the row's workload depends on
    # the mode's sizes (None: the same workload in every mode).
    scale: Scale | None = None

    def target_for(self, line: str) -> Target | None:
        return self.target33 if line != "0.15" and self.target33 else self.target

    @property
    def in_subprocess(self) -> bool:
        return self.factory is None and self.pure_from is None


def _trace_factory(bulk: bool) -> Callable[..., Workload]:
    def build(core: ModuleType, BlockPool: type, ctx: dict[str, Any]) -> Workload:
        return TraceReplay(core, BlockPool, ctx["trace"], ctx["trace_cfg"], bulk=bulk)
    return build


def _simple(cls: type, **kw: Any) -> Callable[..., Workload]:
    return lambda core, BlockPool, ctx: cls(core, BlockPool, **kw)


OPERATIONS: list[Operation] = [
    Operation("queue_popleft_append", "popleft_n(256) + append_n", "ns/block",
              Target("ratio", 7), _simple(QueuePopleftAppend),
              note="the pool's free_block_queue, 4096 free blocks",
              target33=Target("ratio", 6)),
    Operation("queue_popleft_append_standalone",
              "popleft_n(256) + append_n, standalone queue", "ns/block", None,
              _simple(QueuePopleftAppend, standalone=True),
              note="FreeKVCacheBlockQueue([KVCacheBlock(i) for i in range(4096)])"),
    Operation("queue_remove_append", "remove(b) + append(b)", "ns/op",
              Target("ratio", 2.5), _simple(QueueRemoveAppend),
              note="256 blocks at random positions of a 4096-block queue"),
    Operation("new_free", "get_new_blocks(256) + free_blocks", "ns/block",
              Target("ratio", 15), _simple(NewAndFree), note="caching on",
              target33=Target("ratio", 12)),
    Operation("prefix_hit", "prefix hit, 256 blocks, per-block API", "ns/block",
              Target("ratio", 5), _simple(PrefixHitPerBlock),
              note="get_cached_block per hash, touch, free_blocks(reversed)",
              target33=Target("ratio", 4)),
    Operation("prefix_hit_bulk", "prefix hit, 256 blocks, bulk API", "ns/block", None,
              _simple(PrefixHitBulk),
              note="find_longest_cache_hit, touch, free_blocks(reversed), both cores"),
    Operation("prefix_hit_bulk_vs_loop",
              "prefix hit: compiled bulk API vs pure-Python per-block loop", "ns/block",
              Target("ratio", 20), pure_from="prefix_hit", compiled_from="prefix_hit_bulk",
              note="pure column: per-block loop on the twin; compiled column: bulk API"),
    Operation("cache_full_cycle", "cache_full_blocks cycle (256, with eviction)",
              "ns/block", Target("ratio", 6), _simple(CacheFullCycle),
              note="get_new_blocks(256) evicting 256 cached, cache_full_blocks, free",
              target33=Target("ratio", 5)),
    Operation("trace_replay", "trace replay (per-block lookup)", "us/request",
              Target("ratio", 3), _trace_factory(bulk=False),
              note="scheduler-like trace on a 4096-block pool", scale=FULL_TRACE),
    Operation("trace_replay_bulk", "trace replay (bulk lookup)", "us/request", None,
              _trace_factory(bulk=True), note="same trace, find_longest_cache_hit",
              scale=FULL_TRACE),
    # Measured in a fresh interpreter per core.
    Operation("construct", "BlockPool({n}, True, 16)", "ms", Target("ratio", 20),
              note="median of 3 constructions, gc enabled as in an engine",
              scale=AT_1M_BLOCKS),
    Operation("gc_collect", "gc.collect() with that pool alive", "ms", Target("ratio", 15),
              note="after a full collect; median of several", target33=Target("ratio", 10),
              scale=AT_1M_BLOCKS),
    Operation("gc_collect_materialised",
              "gc.collect(), after pool.blocks was accessed", "ms", None,
              note="the compiled core creates block objects on first access",
              scale=AT_1M_BLOCKS),
    Operation("memory", "memory per block at {n} blocks (tracemalloc)", "B/block",
              Target("max", 48),
              note="tracemalloc current after construction minus before, / N",
              scale=AT_1M_BLOCKS),
    Operation("memory_materialised",
              "memory per block, after pool.blocks was accessed (tracemalloc)",
              "B/block", None, note="every block object created", scale=AT_1M_BLOCKS),
    Operation("memory_rss", "memory per block (RSS delta)", "B/block", None,
              note="resident set growth over the first construction, / N",
              scale=AT_1M_BLOCKS),
]

_BY_ID = {op.id: op for op in OPERATIONS}
_UNIT_SCALE = {"ns/block": 1.0, "ns/op": 1.0, "us/request": 1e-3}


# --------------------------------------------------------------------------
# Settings.


@dataclass(frozen=True)
class Settings:
    mode: str
    rounds: int
    batch_ms: float
    trace_requests: int
    subprocess_blocks: int
    construct_repeats: int
    gc_repeats: int

    @classmethod
    def for_mode(cls, mode: str) -> Settings:
        if mode == "smoke":
            return cls(mode, 1, 1.0, 40, 20_000, 1, 1)
        if mode == "quick":
            return cls(mode, 7, 25.0, 600, 200_000, 3, 3)
        return cls(mode, 20, 150.0, FULL_TRACE.value, AT_1M_BLOCKS.value, 3, 5)


# --------------------------------------------------------------------------
# Measuring.


def _progress(msg: str) -> None:
    print(f"[kvpool.bench] {msg}", file=sys.stderr, flush=True)


def _timed_batch(w: Workload, reps: int, disable_gc: bool) -> int:
    w.run(max(1, reps // 10))  # warm-up: caches, branch predictors
    gc.collect()
    if disable_gc:
        gc.disable()
    try:
        return w.run(reps)
    finally:
        if disable_gc:
            gc.enable()


def _calibrate(w: Workload, batch_ns: float) -> int:
    """Repetitions for a batch of about ``batch_ns`` (doubles as warm-up)."""
    reps = 1
    while True:
        elapsed = w.run(reps)
        if elapsed >= batch_ns / 4 or reps >= 1 << 24:
            return max(1, round(reps * batch_ns / max(elapsed, 1)))
        reps *= 2


@dataclass
class Cell:
    values: list[float] = field(default_factory=list)  # per round, in the row's unit

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _run_in_process(cores: dict[str, tuple[ModuleType, type]], ops: list[Operation],
                    st: Settings, disable_gc: bool, errors: list[str],
                    ) -> tuple[dict[str, dict[str, Cell]], dict[str, Any]]:
    cells: dict[str, dict[str, Cell]] = {op.id: {k: Cell() for k in cores} for op in ops}
    extra: dict[str, Any] = {}
    ctx: dict[str, Any] = {}
    if any(op.id.startswith("trace") for op in ops):
        ctx["trace_cfg"] = cfg = TraceConfig(st.trace_requests)
        _progress(f"generating a trace of {cfg.num_requests} requests")
        ctx["trace"] = make_trace(cfg)
    workloads: dict[tuple[str, str], Workload] = {}
    reps: dict[tuple[str, str], int] = {}
    batch_ns = st.batch_ms * 1e6
    for op in ops:
        if op.factory is None:
            continue
        for key, (core, BlockPool) in cores.items():
            _progress(f"warm-up {op.label} [{CORES[key][0]}]")
            try:
                w = op.factory(core, BlockPool, ctx)
                reps[op.id, key] = _calibrate(w, batch_ns)
                workloads[op.id, key] = w
            except Exception as exc:  # a broken core must not hide the others' rows
                errors.append(f"{op.id} [{CORES[key][0]}]: {type(exc).__name__}: {exc}")
                _progress(f"ERROR {errors[-1]}")
        if op.id.startswith("trace"):
            stats = {k: workloads[op.id, k].stats for k in cores if (op.id, k) in workloads}
            extra[op.id] = {k: {"blocks_hit": s[0], "blocks_allocated": s[1]}
                            for k, s in stats.items()}
            if len(set(stats.values())) > 1:
                errors.append(f"{op.id}: the cores disagree on (blocks hit, blocks "
                              f"allocated): {stats}")
                _progress(f"DEVIATION {errors[-1]}")
    order = list(cores)
    t_start = time.perf_counter()
    for r in range(st.rounds if workloads else 0):
        parts = []
        for op in ops:
            if op.factory is None:
                continue
            for key in order:
                w = workloads.get((op.id, key))
                if w is None:
                    continue
                ns = _timed_batch(w, reps[op.id, key], disable_gc)
                per_unit = ns / (reps[op.id, key] * w.units)
                cells[op.id][key].values.append(per_unit * _UNIT_SCALE[op.unit])
            if all(cells[op.id][k].values for k in cores) and len(cores) == 2:
                parts.append(f"{op.id} {cells[op.id]['pure'].values[-1] / cells[op.id]['compiled'].values[-1]:.1f}x")
        order.reverse()
        _progress(f"round {r + 1}/{st.rounds} ({time.perf_counter() - t_start:.0f} s) "
                  + (" | ".join(parts) if parts else ""))
    for op in ops:  # derived rows: cells borrowed from other rows
        if op.pure_from and op.compiled_from:
            if "pure" in cores:
                cells[op.id]["pure"] = cells[op.pure_from]["pure"]
            if "compiled" in cores:
                cells[op.id]["compiled"] = cells[op.compiled_from]["compiled"]
    extra["reps"] = {f"{o}[{k}]": n for (o, k), n in reps.items()}
    if "trace_cfg" in ctx:
        cfg = ctx["trace_cfg"]
        lookups = sum(len(q.lookup_hashes) for q in ctx["trace"])
        extra["trace"] = {"requests": cfg.num_requests, "pool_blocks": cfg.pool_blocks,
                          "prefix_groups": cfg.num_groups, "max_running": cfg.max_running,
                          "lookup_blocks": lookups}
    return cells, extra


# Subprocess measurements ---------------------------------------------------


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _child_timing(key: str, n: int, repeats: int, gc_repeats: int) -> dict[str, Any]:
    _, BlockPool = load_core(key)

    def time_gc() -> list[float]:
        gc.collect()
        out = []
        for _ in range(gc_repeats):
            t0 = perf_counter_ns()
            gc.collect()
            out.append((perf_counter_ns() - t0) / 1e6)
        return out

    gc_baseline = time_gc()
    pool = None
    construct = []
    rss_per_block = None
    for i in range(repeats):
        pool = None
        gc.collect()
        rss0 = _rss_bytes()
        t0 = perf_counter_ns()
        pool = BlockPool(n, True, BLOCK_SIZE)
        construct.append((perf_counter_ns() - t0) / 1e6)
        rss1 = _rss_bytes()
        if i == 0 and rss0 is not None and rss1 is not None:
            rss_per_block = (rss1 - rss0) / n
    gc_alive = time_gc()
    assert pool is not None and len(pool.blocks) == n  # materialises the blocks
    gc_materialised = time_gc()
    return {"construct_ms": construct, "gc_ms": gc_alive,
            "gc_materialised_ms": gc_materialised, "gc_baseline_ms": gc_baseline,
            "rss_bytes_per_block": rss_per_block}


def _child_memory(key: str, n: int) -> dict[str, Any]:
    import tracemalloc

    _, BlockPool = load_core(key)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    pool = BlockPool(n, True, BLOCK_SIZE)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    blocks = pool.blocks
    gc.collect()
    after_blocks = tracemalloc.get_traced_memory()[0]
    assert len(blocks) == n
    return {"bytes_per_block": (after - before) / n,
            "bytes_per_block_materialised": (after_blocks - before) / n}


def _run_child(kind: str, key: str, n: int, st: Settings) -> dict[str, Any]:
    """Run ``--child kind`` for core ``key`` in a fresh interpreter."""
    # The child must import this very kvpool: ``-m`` puts the working
    # directory first on sys.path, so run it from the package's parent.
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "kvpool.bench", "--child", kind, "--core", key,
           "--line", _line,
           "--blocks", str(n), "--construct-repeats", str(st.construct_repeats),
           "--gc-repeats", str(st.gc_repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=pkg_parent)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited with {proc.returncode}: "
                           f"{proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run_subprocesses(columns: dict[str, str], st: Settings, errors: list[str],
                      ) -> tuple[dict[str, dict[str, Cell]], dict[str, Any]]:
    """``columns``: table column (core key) -> the core to run in it."""
    n = st.subprocess_blocks
    ids = [op.id for op in OPERATIONS if op.in_subprocess]
    cells: dict[str, dict[str, Cell]] = {i: {k: Cell() for k in columns} for i in ids}
    extra: dict[str, Any] = {"blocks": n, "gc_baseline_ms": {}}
    for key, core_key in columns.items():
        label = CORES[key][0]
        try:
            _progress(f"fresh interpreter [{label}]: construction and gc.collect() at {n:,} blocks")
            t = _run_child("timing", core_key, n, st)
            _progress(f"fresh interpreter [{label}]: tracemalloc at {n:,} blocks")
            m = _run_child("memory", core_key, n, st)
        except Exception as exc:
            errors.append(f"subprocess [{label}]: {exc}")
            _progress(f"ERROR {errors[-1]}")
            continue
        cells["construct"][key].values = t["construct_ms"]
        cells["gc_collect"][key].values = t["gc_ms"]
        cells["gc_collect_materialised"][key].values = t["gc_materialised_ms"]
        cells["memory"][key].values = [m["bytes_per_block"]]
        cells["memory_materialised"][key].values = [m["bytes_per_block_materialised"]]
        if t["rss_bytes_per_block"] is not None:
            cells["memory_rss"][key].values = [t["rss_bytes_per_block"]]
        extra["gc_baseline_ms"][key] = statistics.median(t["gc_baseline_ms"])
    return cells, extra


# Results -------------------------------------------------------------------


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import Cython  # type: ignore[import-not-found]
        cython_version: str | None = Cython.__version__
    except ImportError:
        cython_version = None
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "python_build": " ".join(platform.python_build()),
        "python_compiler": platform.python_compiler(),
        "kvpool": __version__,
        "cython": cython_version,
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


def _row(op: Operation, cells: dict[str, Cell], st: Settings) -> dict[str, Any]:
    """One table row. Its target is judged only when the row was measured at
    the size the target is stated for (``op.scale``); otherwise ``ok`` is
    None and ``not_judged`` says why."""
    pure, comp = cells.get("pure"), cells.get("compiled")
    pm = pure.median if pure else None
    cm = comp.median if comp else None
    ratio_of_medians = pm / cm if pm is not None and cm else None
    per_round = ([p / c for p, c in zip(pure.values, comp.values) if c]
                 if pure and comp else [])
    # The headline ratio pairs the two cores' batches of the same round: a
    # noisy round then spoils one ratio, not one core's median.
    ratio = statistics.median(per_round) if per_round else ratio_of_medians
    row: dict[str, Any] = {
        "id": op.id, "label": op.label.format(n=f"{st.subprocess_blocks:_}"),
        "unit": op.unit, "note": op.note,
        "pure": {"median": pm, "values": pure.values if pure else []},
        "compiled": {"median": cm, "values": comp.values if comp else []},
        "ratio": ratio,
        "ratio_of_medians": ratio_of_medians,
        "ratio_per_round": per_round,
        "ratio_min": min(per_round) if len(per_round) > 1 else None,
        "ratio_max": max(per_round) if len(per_round) > 1 else None,
        "ratio_q1": None, "ratio_q3": None,
        "target": None, "ok": None, "not_judged": None,
    }
    if len(per_round) > 1:
        q = statistics.quantiles(per_round, n=4, method="inclusive")
        row["ratio_q1"], row["ratio_q3"] = q[0], q[2]
    target = op.target_for(_line)
    if target:
        row["target"] = {"kind": target.kind, "value": target.value,
                         "text": target.text(op.unit)}
        if op.scale is None or op.scale.holds_for(st):
            row["ok"] = target.holds(ratio, cm)
        else:
            row["not_judged"] = f"target at {op.scale.text}"
    return row


def target_summary(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The ids of the rows with a target, by verdict: ``met``, ``missed``,
    ``not_judged`` (measured at another size than the target's) and
    ``no_result`` (a core's figure is missing)."""
    out: dict[str, list[str]] = {"met": [], "missed": [], "not_judged": [], "no_result": []}
    for r in rows:
        if r["target"] is None:
            continue
        verdict = ("not_judged" if r["not_judged"] else
                   {True: "met", False: "missed", None: "no_result"}[r["ok"]])
        out[verdict].append(r["id"])
    return out


def _fmt_ratio(x: float | None) -> str:
    # Two decimals below 10x, so that a ratio just under a target never
    # prints as the target itself.
    if x is None:
        return "-"
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def _format_target_summary(targets: dict[str, list[str]]) -> str:
    text = f"Targets: {len(targets['met'])} met, {len(targets['missed'])} missed"
    if targets["missed"]:
        text += f" ({', '.join(targets['missed'])})"
    if targets["no_result"]:
        text += f", {len(targets['no_result'])} without a result ({', '.join(targets['no_result'])})"
    if targets["not_judged"]:
        text += (f"; {len(targets['not_judged'])} not judged, measured at another size than "
                 f"their target is stated for: {', '.join(targets['not_judged'])}")
    return text + "."


def format_table(result: dict[str, Any]) -> str:
    m, s = result["machine"], result["settings"]
    baseline = ("vLLM's own pool" if os.environ.get("KVPOOL_BENCH_BASELINE") == "vllm"
                else "pure-Python")
    head = ["operation", "unit", baseline, "compiled", "ratio", "ratio IQR",
            "target", ""]
    lines = []
    for r in result["operations"]:
        spread = (f"{_fmt_ratio(r['ratio_q1'])[:-1]}-{_fmt_ratio(r['ratio_q3'])}"
                  if r["ratio_q1"] is not None else "-")
        ok = (f"n/a ({r['not_judged']})" if r["not_judged"]
              else {True: "ok", False: "MISS", None: ""}[r["ok"]])
        lines.append([r["label"], r["unit"], _fmt(r["pure"]["median"]),
                      _fmt(r["compiled"]["median"]),
                      _fmt_ratio(r["ratio"]),
                      spread, r["target"]["text"] if r["target"] else "", ok])
    widths = [max(len(x[i]) for x in [head] + lines) for i in range(len(head))]
    right = {2, 3, 4, 5}

    def fmt_line(cols: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cols, widths))) + " |"

    out = [
        f"kvpool {m['kvpool']} benchmark, vLLM {result['line']} API line "
        f"({'kvpool' if result['line'] == '0.15' else 'kvpool.v0_' + result['line'][2:]}): pure-Python "
        f"twin (kvpool._core_py) vs compiled core (kvpool._core)",
        f"Python {m['python']} ({m['python_implementation']}, {m['python_compiler']}) | "
        f"Cython {m['cython'] or 'not installed'} | CPU: {m['cpu']} ({m['cpus']} logical) | "
        f"{m['platform']}",
        "",
        fmt_line(head),
        "|" + "|".join(("-" * (w + 1) + ":") if i in right else ("-" * (w + 2))
                       for i, w in enumerate(widths)) + "|",
    ]
    out += [fmt_line(x) for x in lines]
    sub = result["subprocess"]
    n = sub.get("blocks")
    out += [
        "",
        f"{s['rounds']} round(s), A/B interleaved (core order alternates each round); "
        f"cells are medians over rounds of one timed batch (~{s['batch_ms']:g} ms); "
        "ratio = median of the per-round ratios pure-Python/compiled (the ratio of the "
        "two medians is in --json); ratio IQR = their interquartile range.",
        ("The cyclic gc is disabled inside timed batches, for both cores alike."
         if s["gc_disabled"] else "The cyclic gc stays enabled during timed batches."),
    ]
    if sub.get("gc_baseline_ms"):
        out.append(
            f"Construction, gc.collect() and memory: a fresh interpreter per core, {n:,} blocks"
            + (f" (--quick/--smoke size; the targets are stated for {AT_1M_BLOCKS.value:,})"
               if n != AT_1M_BLOCKS.value else "")
            + "; gc.collect() of an idle interpreter: "
            + ", ".join(f"{CORES[k][0]} {v:.2f} ms" for k, v in sub["gc_baseline_ms"].items())
            + ".")
    load = result["load_average"]
    if load["before"] is not None:
        out.append(f"1-minute load average: {load['before']:.2f} before the run, "
                   f"{load['after']:.2f} after ({m['cpus']} logical CPUs)"
                   + ("; the machine was busy, expect noise." if load["before"] > 0.5 else "."))
    if "trace" in result["extra"]:
        t = result["extra"]["trace"]
        out.append(f"Trace: {t['requests']} requests, {t['prefix_groups']} shared prefixes, "
                   f"{t['pool_blocks']}-block pool, {t['max_running']} running.")
    out.append(_format_target_summary(result["targets"]))
    if s["same_core"]:
        out.append(f"!! A/A check: both columns are the {CORES[s['same_core']][0]} core "
                   f"({CORES[s['same_core']][1]}).")
    if not result["cores"]["compiled"]["available"]:
        out.append(f"!! compiled core not available: {result['cores']['compiled']['error']}")
        if _in_source_checkout():
            out.append("!! kvpool was imported from a source checkout without the built "
                       "module (python -m puts the current directory first on sys.path): "
                       "run `kvpool-bench`, or `python -m kvpool.bench` from another "
                       "directory, or build in place with `python setup.py build_ext --inplace`.")
    for e in result["errors"]:
        out.append(f"!! {e}")
    return "\n".join(out)


def run(st: Settings, *, disable_gc: bool = True, only: list[str] | None = None,
        subprocesses: bool = True, same_core: str | None = None,
        line: str = "0.15") -> dict[str, Any]:
    """Run the benchmark of one vLLM API line; ``same_core`` (an A/A check of
    the harness) puts that core in both columns, where every ratio should be
    close to 1."""
    global _line
    _line = line
    _progress(f"vLLM {line} API line")
    t0 = time.perf_counter()
    load_before = _load_average()
    errors: list[str] = []
    cores: dict[str, tuple[ModuleType, type]] = {}
    status: dict[str, dict[str, Any]] = {}
    for key, (_, module) in CORES.items():
        if same_core is not None:
            module = CORES[same_core][1]
        try:
            cores[key] = load_core(same_core or key)
            status[key] = {"module": module, "available": True, "error": None,
                           "file": getattr(cores[key][0], "__file__", None)}
        except ImportError as exc:
            status[key] = {"module": module, "available": False, "error": str(exc)}
            _progress(f"cannot import {module}: {exc}")
    if only is not None:  # a derived row needs the rows it borrows from
        only = set(only) | {x for op in OPERATIONS if op.id in only
                            for x in (op.pure_from, op.compiled_from) if x}
    ops = [op for op in OPERATIONS if only is None or op.id in only]
    in_process = [op for op in ops if not op.in_subprocess]
    cells, extra = _run_in_process(cores, in_process, st, disable_gc, errors)
    sub_extra: dict[str, Any] = {"blocks": st.subprocess_blocks}
    if subprocesses and any(op.in_subprocess for op in ops):
        sub_cells, sub_extra = _run_subprocesses(
            {k: same_core or k for k in cores}, st, errors)
        cells.update(sub_cells)
    rows = [_row(op, cells[op.id], st) for op in ops if op.id in cells]
    return {
        "kvpool_bench": 1,
        "line": line,
        "machine": _machine(),
        "settings": {"mode": st.mode, "rounds": st.rounds, "batch_ms": st.batch_ms,
                     "gc_disabled": disable_gc, "subprocess_blocks": st.subprocess_blocks,
                     "construct_repeats": st.construct_repeats, "gc_repeats": st.gc_repeats,
                     "trace_requests": st.trace_requests, "same_core": same_core},
        "cores": status,
        "operations": rows,
        "targets": target_summary(rows),
        "subprocess": sub_extra,
        "extra": extra,
        "errors": errors,
        "elapsed_s": time.perf_counter() - t0,
        # 1-minute load averages: other work on the machine shows up here.
        "load_average": {"before": load_before, "after": _load_average()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvpool.bench",
        description="Benchmark kvpool's compiled core against its pure-Python twin.")
    p.add_argument("--quick", action="store_true", help="a ~10 s run (smaller batches, "
                   "fewer rounds, 200,000-block subprocess pools)")
    p.add_argument("--rounds", type=int, help="number of A/B rounds")
    p.add_argument("--json", action="store_true", help="print JSON results instead of the table")
    p.add_argument("--only", help="comma-separated operation ids ("
                   + ", ".join(op.id for op in OPERATIONS) + ")")
    p.add_argument("--keep-gc", action="store_true",
                   help="leave the cyclic gc enabled during timed batches")
    p.add_argument("--no-subprocess", action="store_true",
                   help="skip construction, gc.collect() and memory (fresh interpreters)")
    p.add_argument("--line", choices=[*LINES, "all"], default="all",
                   help="the vLLM API line(s) to measure: kvpool (0.15), "
                   "kvpool.v0_33 (0.33), kvpool.v0_34 (0.34); default: all, one table each")
    p.add_argument("--same-core", choices=list(CORES),
                   help="A/A check of the harness: this core in both columns")
    p.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child", choices=["timing", "memory"], help=argparse.SUPPRESS)
    p.add_argument("--core", choices=list(CORES), help=argparse.SUPPRESS)
    p.add_argument("--blocks", type=int, help=argparse.SUPPRESS)
    p.add_argument("--construct-repeats", type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument("--gc-repeats", type=int, default=5, help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.child:
        global _line
        _line = "0.15" if a.line == "all" else a.line
        if a.child == "timing":
            res = _child_timing(a.core, a.blocks, a.construct_repeats, a.gc_repeats)
        else:
            res = _child_memory(a.core, a.blocks)
        print(json.dumps(res))
        return 0

    st = Settings.for_mode("smoke" if a.smoke else "quick" if a.quick else "full")
    if a.rounds is not None:
        if a.rounds < 1:
            p.error("--rounds must be >= 1")
        st = Settings(**{**st.__dict__, "rounds": a.rounds})
    only = None
    if a.only:
        only = [x.strip() for x in a.only.split(",") if x.strip()]
        unknown = sorted(set(only) - set(_BY_ID))
        if unknown:
            p.error(f"unknown operation id(s): {', '.join(unknown)}")
    lines = list(LINES) if a.line == "all" else [a.line]
    results = {}
    for line in lines:
        results[line] = run(st, disable_gc=not a.keep_gc, only=only,
                            subprocesses=not a.no_subprocess, same_core=a.same_core,
                            line=line)
        _progress(f"vLLM {line} line done in {results[line]['elapsed_s']:.0f} s")
    if a.json:
        # One line: its result; several: {line: result}.
        print(json.dumps(results[lines[0]] if len(lines) == 1 else results, indent=2))
    else:
        print("\n\n".join(format_table(r) for r in results.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
