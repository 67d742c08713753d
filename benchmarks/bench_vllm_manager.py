"""vLLM's own ``KVCacheManager`` and ``BlockPool`` against kvpool's, on any
release kvpool has a line for (vLLM 0.15.x ... 0.33.x).

The scheduler-like workload of ``tests/vllm/vllm_workload.py`` (releases
whose ``get_computed_blocks`` returns two values) or
``tests/vllm33/vllm_workload33.py`` (from 0.26 on: the same workloads,
driven as 0.33's scheduler drives its manager) -- shared prompt prefixes,
chunked prefill, decode steps, preemption, frees, ``evict_blocks``,
``reset_prefix_cache``, KV events and prefix-cache stats every step -- runs
in one process on each configuration, interleaved (the order rotates every
round):

- vLLM's manager over vLLM's pool;
- vLLM's manager over kvpool's pool (``KVPOOL_VLLM_MANAGER=0``);
- kvpool's manager over kvpool's pool, on the lines that have one
  (0.30-0.33; ``kvpool.vllm.VLLMLine.manager``).

Reported per configuration: the time spent inside manager calls (median and
range over the rounds), microseconds per call, requests per second of
manager time and end to end; and the ratio of vLLM's time to each kvpool
configuration's per round (median and range). All must make the same
decisions: the runs' counters (steps, preemptions, prefix-hit tokens,
events) are checked equal.

Run it in the environment ``.ci/vllm-env.sh`` builds (vLLM 0.33.0), and for
another release with that release's tree first on ``PYTHONPATH``
(``.ci/vllm-src.sh``; as ``.ci/vllm-mgr-all.sh`` does)::

    .ci/vllm-env.sh --vllm 0.33.0 /tmp/vllm-venv
    /tmp/vllm-venv/bin/python benchmarks/bench_vllm_manager.py
    PYTHONPATH=$(.ci/vllm-src.sh 0.32.0) /tmp/vllm-venv/bin/python benchmarks/bench_vllm_manager.py

``--core`` picks kvpool's core: ``default`` goes through
``kvpool.vllm.install()`` (the package's choice), ``compiled`` /
``pure-python`` force one (the pool of the release's line, with vLLM's own
event classes, and the line's manager put in through the scheduler's name).
``--profile`` runs each configuration once more under cProfile and shows
where the manager's time goes and which pool calls remain (kvpool's
compiled manager functions do not show there: their time is their callers').
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib
import logging
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import vllm
import vllm.envs
from vllm.v1 import kv_cache_interface
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_coordinator, single_type_kv_cache_manager

import kvpool
import kvpool.vllm as kv_vllm
from kvpool.bench import package_dir
from vllm.v1.core.sched import scheduler as vllm_scheduler

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "vllm"))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "vllm33"))
import vllm_workload as _vw15  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager as _VLLMManager  # noqa: E402

# The manager's API decides the driver: 0.33's (from 0.26 on) or 0.15's.
if hasattr(_VLLMManager, _vw15.DRIVER_SPLIT):
    import vllm_workload33 as vw
else:
    vw = _vw15
from kvpool.vllm import vllm_block_pool_class  # noqa: E402

LINE = kv_vllm.vllm_line(vllm.__version__, force=True)
#: kvpool's KV-cache manager of the line (None: the line has none).
MANAGER = LINE.manager


def _pool_class(core_module):
    return vllm_block_pool_class(LINE.name, core_module)


WORKLOAD_FILE = os.path.basename(vw.__file__)

WORKLOADS = {
    "full": vw.FULL,
    "prefill-heavy": vw.PREFILL_HEAVY,
    "hybrid": vw.HYBRID.scaled(metrics_sample_rate=None),
    "mixed": vw.MIXED_BLOCK_SIZES,
}
if hasattr(vw.FULL, "spec_tokens"):  # the 0.26+ driver: speculative decoding
    # EAGLE with 3 drafts (lookahead 3, 60% of drafts accepted in a row),
    # n-gram drafts (4, no lookahead, 40%); and a KV connector.
    WORKLOADS["eagle"] = vw.FULL.scaled(name="EAGLE, 3 drafts", spec_tokens=3, eagle=True)
    WORKLOADS["ngram"] = vw.FULL.scaled(
        name="n-gram drafts", spec_tokens=4, accept_rate=0.4
    )
    # EAGLE over full attention + a sliding window: the hybrid lookup with
    # the window's extra contiguous block and the dropped one.
    WORKLOADS["eagle+sliding"] = vw.HYBRID.scaled(
        name="EAGLE, 3 drafts, full + sliding window", metrics_sample_rate=None,
        spec_tokens=3, eagle=True,
    )
    # A KV connector: external hits, asynchronous loads, failed loads, aborts.
    WORKLOADS["connector"] = vw.FULL.scaled(name="KV connector", connector=True)
    # Full attention + chunked local attention (Llama 4's layout; chunks of
    # 256 tokens so that this workload's requests cross chunk boundaries,
    # Llama 4's are 8192), and R-SWA alone (Unlimited-OCR's default window).
    WORKLOADS["chunked"] = vw.HYBRID.scaled(
        name="full + chunked local attention",
        groups=(vw.Group("full", 16), vw.Group("chunked", 16, sliding_window=256)),
        metrics_sample_rate=None,
    )
    WORKLOADS["rswa"] = vw.FULL.scaled(
        name="R-SWA, window 128", groups=(vw.Group("rswa", 16, sliding_window=128),)
    )
    # An encoder-decoder model (Whisper: 1,500 encoder tokens a request,
    # 94 cross-attention blocks of 16), prefix caching off as vLLM runs it;
    # a pool of 16,384 blocks for the 128 running requests.
    WORKLOADS["cross"] = vw.FULL.scaled(
        name="full + cross-attention (Whisper's 1,500 encoder tokens), no prefix caching",
        groups=(vw.Group("full", 16), vw.Group("cross", 16)),
        enable_caching=False, encoder_tokens=(1500, 1500), num_blocks=16384,
    )
    # A compressor's circular buffer beside full attention (DeepSeek-V4.1's
    # compressor state): one ring block a request.
    WORKLOADS["ring"] = vw.HYBRID.scaled(
        name="full attention + a circular buffer",
        groups=(vw.Group("full", 16), vw.Group("ring", 64)), metrics_sample_rate=None,
    )
    # A Mamba hybrid (Qwen3-Next's layout: three Mamba state groups beside
    # full attention) with prefix caching off: mamba_cache_mode "none", one
    # state block a request and group, as long as the model.
    mamba = vw.Group("mamba", vw.FULL.max_model_len, mamba_mode="none")
    WORKLOADS["mamba"] = vw.FULL.scaled(
        name="full attention + 3 Mamba groups (Qwen3-Next's layout), no prefix caching",
        groups=(vw.Group("full", 16), mamba, mamba, mamba), enable_caching=False,
    )
    # ... and with prefix caching on: mamba_cache_mode "align", a state kept
    # at each 64-token block boundary, hits down to the 16-token hash block
    # (partial hits copied on write), the scheduler's chunks split at the
    # state's boundaries (the driver calls vLLM's own split).
    align = vw.Group("mamba", 64)
    if hasattr(align, "mamba_mode"):
        WORKLOADS["mamba-align"] = vw.FULL.scaled(
            name="full attention + 3 Mamba groups (Qwen3-Next's layout), mamba_cache_mode align",
            groups=(vw.Group("full", 16), align, align, align), metrics_sample_rate=None,
        )
    # ... with prefill checkpoints (a backend that exports a state inside a
    # chunk): a chunk crossing a state boundary keeps one more state block.
    if "num_prefill_checkpoint_blocks" in getattr(
            kv_cache_interface.MambaSpec, "__dataclass_fields__", ()):  # (0.30 on)
        ckpt = vw.Group("mamba", 64, checkpoint_blocks=1, checkpoint_alignment=16)
        WORKLOADS["mamba-ckpt"] = vw.FULL.scaled(
            name="full attention + 3 Mamba groups, mamba_cache_mode align, prefill checkpoints",
            groups=(vw.Group("full", 16), ckpt, ckpt, ckpt), metrics_sample_rate=None,
        )
    # ... and in 0.30/0.31's deprecated mode "all": every 16-token block's
    # state cached (the "none" code with prefix caching on).
    if getattr(vw, "MAMBA_MODE_ALL", False):
        every = vw.Group("mamba", 16, mamba_mode="all")
        WORKLOADS["mamba-all"] = vw.FULL.scaled(
            name="full attention + 3 Mamba groups (Qwen3-Next's layout), mamba_cache_mode all",
            groups=(vw.Group("full", 16), every, every, every),
        )
if getattr(vw, "HASH_LOOKAHEAD", False):
    # 0.33 on: EAGLE as the engine runs it by default, with lookahead block
    # hashes (no dropped block; each BlockStored carries its lookahead token).
    WORKLOADS["eagle-hashes"] = vw.FULL.scaled(
        name="EAGLE, 3 drafts, lookahead block hashes", spec_tokens=3, eagle=True,
        hash_lookahead=True,
    )

# The BlockPool methods vLLM's managers call (``--pool-time`` times them).
POOL_METHODS = (
    "get_cached_block",
    "cache_full_blocks",
    "get_new_blocks",
    "touch",
    "free_blocks",
    "evict_blocks",
    "reset_prefix_cache",
    "take_events",
    "get_usage",
    "get_num_free_blocks",
    # vLLM 0.33's managers also call these (absent methods are skipped).
    "cache_partial_block",
    "move_block_hashes",
    "is_block_writable",
    "emit_cached_block_events",
)

# For the profile summary: what counts as "inside the pool". vLLM's pool is
# block_pool.py plus the block, queue, map and hash helpers of
# kv_cache_utils.py (not the request hasher, which is the engine's); kvpool's
# is everything under kvpool/ plus the compiled core's C methods.
_NOT_POOL = {
    "request_block_hasher",
    "hash_block_tokens",
    "generate_block_hash_extra_keys",
    "_gen_lora_extra_hash_keys",
    "_gen_mm_extra_hash_keys",
    "_gen_prompt_embeds_extra_hash_keys",
    "need_extra_keys",
    # vLLM 0.33: the request's hash views the managers read (not the pool's).
    "resolve_block_hashes",
    "trim_null_head",
    "__getitem__",
    "__iter__",
    "__len__",
}


# kvpool's own files: by the package's directory (package_dir()).
_KVPOOL_DIR = package_dir()


def _is_pool_function(filename: str, func: str) -> bool:
    where = filename.replace("\\", "/")
    if where.endswith("v1/core/block_pool.py") or where.startswith(_KVPOOL_DIR):
        return func not in _NOT_POOL
    if where.endswith("v1/core/kv_cache_utils.py"):
        return func not in _NOT_POOL
    return filename == "~" and (
        "kvpool" in func or "PoolCore" in func or "KVCacheBlock" in func
    )


@contextmanager
def kvpool_pool(core: str, manager: bool) -> Iterator[str]:
    """Make vLLM build kvpool's pool inside the block, and kvpool's manager
    too if ``manager``; yields the core used."""
    if core == "default":
        # As a user installs it (kvpool.vllm picks the line).
        saved = os.environ.get("KVPOOL_VLLM_MANAGER")
        os.environ["KVPOOL_VLLM_MANAGER"] = "1" if manager else "0"
        try:
            with kv_vllm.enabled():
                yield "compiled" if kvpool.USING_EXTENSION else "pure-python"
        finally:
            if saved is None:
                os.environ.pop("KVPOOL_VLLM_MANAGER", None)
            else:
                os.environ["KVPOOL_VLLM_MANAGER"] = saved
        return
    module = importlib.import_module(
        "kvpool._core" if core == "compiled" else "kvpool._core_py"
    )
    pool_class = _pool_class(module)
    # vLLM builds its pool through this name in kv_cache_coordinator; the
    # single-type managers' module holds the same name (annotations). The
    # scheduler builds its manager through its module's KVCacheManager.
    modules = [kv_cache_coordinator, single_type_kv_cache_manager]
    saved = [(m, m.BlockPool) for m in modules]
    saved_manager = vllm_scheduler.KVCacheManager
    for m in modules:
        m.BlockPool = pool_class
    if manager:
        vllm_scheduler.KVCacheManager = importlib.import_module(MANAGER).KVCacheManager
    try:
        yield core
    finally:
        for m, original in saved:
            m.BlockPool = original
        vllm_scheduler.KVCacheManager = saved_manager


@contextmanager
def vllm_pool() -> Iterator[str]:
    assert kv_cache_coordinator.BlockPool is vllm_block_pool.BlockPool
    yield "vLLM"


class PoolTimer:
    """Times the outermost BlockPool calls of one manager: wraps the
    pool's methods on the instance (vLLM's managers call them through the
    instance), so both pools pay the same wrapper cost, measured and
    subtracted."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.by_method: dict[str, list] = {name: [0.0, 0] for name in POOL_METHODS}
        self._depth = 0

    def wrap(self, method, acc: list):
        """``method``, timed into ``acc`` ([seconds, calls]) and the totals,
        unless called from inside another timed call."""
        clock = time.perf_counter

        def timed(*args, **kwargs):
            if self._depth:
                return method(*args, **kwargs)
            self._depth = 1
            t0 = clock()
            try:
                return method(*args, **kwargs)
            finally:
                dt = clock() - t0
                self.seconds += dt
                self.calls += 1
                acc[0] += dt
                acc[1] += 1
                self._depth = 0

        return timed

    def attach(self, mgr) -> None:
        pool = mgr.block_pool
        for name in POOL_METHODS:
            if hasattr(pool, name):
                setattr(
                    pool, name, self.wrap(getattr(pool, name), self.by_method[name])
                )

    @staticmethod
    def overhead_per_call() -> float:
        """Seconds the wrapper itself adds to one call (median of 5)."""
        noop = int  # a cheap C callable, like most pool calls
        samples = []
        for _ in range(5):
            timed = PoolTimer().wrap(noop, [0.0, 0])
            n = 200_000
            start = time.perf_counter()
            for _ in range(n):
                timed()
            wrapped = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(n):
                noop()
            bare = time.perf_counter() - start
            samples.append((wrapped - bare) / n)
        return statistics.median(samples)


def sides(core: str) -> dict:
    """The configurations compared: key -> (label, context-manager factory)."""
    out = {"vllm": ("vLLM manager, vLLM pool", vllm_pool)}
    if MANAGER:
        out["pool"] = (f"vLLM manager, kvpool pool ({core})", lambda: kvpool_pool(core, False))
        out["kvpool"] = (f"kvpool manager and pool ({core})", lambda: kvpool_pool(core, True))
    else:
        out["kvpool"] = (f"vLLM manager, kvpool pool ({core})", lambda: kvpool_pool(core, False))
    return out


def one_run(
    w: vw.Workload, pool_cm, timer: PoolTimer | None = None
) -> tuple[vw.Run, str]:
    requests = vw.build_requests(w)  # outside the timed calls
    gc.collect()
    with pool_cm as label:
        hook = timer.attach if timer is not None else None
        return vw.run(w, record=False, requests=requests, on_manager=hook), label


def decisions(r: vw.Run) -> tuple:
    return (
        r.steps,
        r.finished,
        r.preemptions,
        r.prefix_hit_tokens,
        r.events,
        r.manager_calls,
    )


def fmt_range(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    med = statistics.median(values) * scale
    return f"{med:.{digits}f} [{min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f}]"


def bench(w: vw.Workload, rounds: int, core: str, pool_time: bool) -> dict:
    """``rounds`` clean A/B rounds; with ``pool_time``, as many more rounds
    with the pool calls timed (kept apart: the wrapper slows those runs)."""
    configs = sides(core)
    runs: dict[str, list[vw.Run]] = {name: [] for name in configs}
    timers: dict[str, list[PoolTimer]] = {name: [] for name in configs}
    timed_runs: dict[str, list[vw.Run]] = {name: [] for name in configs}
    names = list(configs)
    for i in range(rounds * (2 if pool_time else 1)):
        instrumented = i >= rounds
        # The order rotates every round.
        for which in names[i % len(names):] + names[: i % len(names)]:
            timer = PoolTimer() if instrumented else None
            run, _ = one_run(w, configs[which][1](), timer)
            if instrumented:
                timers[which].append(timer)
                timed_runs[which].append(run)
            else:
                runs[which].append(run)
    ref = decisions(runs["vllm"][0])
    for name, rs in runs.items():
        for r in rs + timed_runs[name]:
            if decisions(r) != ref:
                raise SystemExit(
                    f"{w.name}: {name} made different decisions: {decisions(r)} != {ref} "
                    f"(steps, finished, preemptions, prefix-hit tokens, events, calls)"
                )
    return {"runs": runs, "timers": timers, "timed_runs": timed_runs,
            "labels": {name: label for name, (label, _) in configs.items()}}


def report(w: vw.Workload, result: dict) -> float:
    runs = result["runs"]
    r0 = runs["vllm"][0]
    print(
        f"\n## {w.name}: {w.num_requests} requests, {w.num_prefixes} prefixes, "
        f"{w.num_blocks} blocks, groups {[(g.kind, g.block_size) for g in w.groups]}, "
        f"events {'on' if w.enable_events else 'off'}"
    )
    print(
        f"   {r0.steps} steps, {r0.manager_calls} manager calls, {r0.preemptions} preemptions, "
        f"{r0.prefix_hit_tokens} prefix-hit tokens, {r0.events} KV events"
    )
    print(
        "| manager and pool | time in manager calls, s | us per call | requests/s (manager time) "
        "| requests/s (end to end) |"
    )
    print("|---|---|---|---|---|")
    for name, label in result["labels"].items():
        rs = runs[name]
        secs = [r.manager_seconds for r in rs]
        per_call = [r.manager_seconds / r.manager_calls for r in rs]
        rps = [w.num_requests / r.manager_seconds for r in rs]
        e2e = [w.num_requests / r.wall_seconds for r in rs]
        print(
            f"| {label} | {fmt_range(secs)} | {fmt_range(per_call, 1e6, 2)} "
            f"| {fmt_range(rps, 1, 0)} | {fmt_range(e2e, 1, 0)} |"
        )
    print()
    for name in runs:
        if name == "vllm":
            continue
        rs = [a.manager_seconds / b.manager_seconds for a, b in zip(runs["vllm"], runs[name])]
        if name == "kvpool":
            ratios = rs
        print(
            f"ratio (time in manager calls, vLLM's / {result['labels'][name]}), per round: "
            f"median {statistics.median(rs):.2f}x, range {min(rs):.2f}x-{max(rs):.2f}x "
            f"over {len(rs)} rounds"
        )
    timers = result["timers"]
    if timers["vllm"]:
        overhead = PoolTimer.overhead_per_call()
        pool_secs = {
            name: [t.seconds - t.calls * overhead for t in ts]
            for name, ts in timers.items()
        }
        timed_runs = result["timed_runs"]
        shares = {
            name: [
                p / (r.manager_seconds - t.calls * overhead)
                for p, r, t in zip(pool_secs[name], timed_runs[name], timers[name])
            ]
            for name in runs
        }
        calls = timers["vllm"][0].calls
        print(
            f"\ntime inside BlockPool calls, from {len(timers['vllm'])} more rounds with each "
            f"pool call timed ({calls} outermost pool calls a run; the wrapper's "
            f"{overhead * 1e9:.0f} ns/call measured and subtracted):"
        )
        print("| pool | in pool calls, s | share of manager time | ns per pool call |")
        print("|---|---|---|---|")
        for name, label in result["labels"].items():
            per = [p / calls for p in pool_secs[name]]
            print(
                f"| {label} | {fmt_range(pool_secs[name])} | {fmt_range(shares[name], 100, 0)}% "
                f"| {fmt_range(per, 1e9, 0)} |"
            )
        vllm_share = statistics.median(shares["vllm"])
        print(
            f"\nceiling: vLLM's pool is {vllm_share:.0%} of the time in manager calls, so a "
            f"pool that cost nothing would give at most {1 / (1 - vllm_share):.2f}x here"
        )
        pool_ratios = [a / b for a, b in zip(pool_secs["vllm"], pool_secs["kvpool"])]
        print(
            f"\nratio (time inside pool calls, vLLM pool / kvpool): median "
            f"{statistics.median(pool_ratios):.2f}x, range {min(pool_ratios):.2f}x-"
            f"{max(pool_ratios):.2f}x"
        )
        print("\nper pool method (median over rounds, wrapper overhead subtracted):")
        print(
            "| method | calls a run | vLLM, s | kvpool, s | vLLM ns/call | kvpool ns/call | ratio |"
        )
        print("|---|---|---|---|---|---|---|")
        floor = 30e-9  # below this per call, the wrapper's noise dominates
        for name in POOL_METHODS:
            n = timers["vllm"][0].by_method[name][1]
            if not n:
                continue
            med = {
                which: statistics.median(
                    t.by_method[name][0] - n * overhead for t in ts
                )
                for which, ts in timers.items()
            }
            per = {which: med[which] / n for which in med}
            cells = [
                f"{per[w] * 1e9:.0f}" if per[w] >= floor else "<30"
                for w in ("vllm", "kvpool")
            ]
            ratio = (
                f"{per['vllm'] / per['kvpool']:.2f}x"
                if min(per.values()) >= floor
                else "-"
            )
            print(
                f"| {name} | {n} | {max(med['vllm'], 0):.3f} | {max(med['kvpool'], 0):.3f} "
                f"| {cells[0]} | {cells[1]} | {ratio} |"
            )
    return statistics.median(ratios)


def profile(w: vw.Workload, core: str, top: int) -> None:
    for label, cm_factory in sides(core).values():
        requests = vw.build_requests(w)
        gc.collect()
        prof = cProfile.Profile()
        with cm_factory():
            prof.enable()
            vw.run(w, record=False, requests=requests)
            prof.disable()
        stats = pstats.Stats(prof)
        in_manager = 0.0  # cumulative time of the workload's manager calls
        in_pool = 0.0  # cumulative time of pool functions entered from outside the pool
        rows = []
        for (filename, line, func), (cc, nc, tt, ct, callers) in stats.stats.items():
            if filename.endswith("kv_cache_manager.py"):
                in_manager += sum(
                    c[3]
                    for caller, c in callers.items()
                    if caller[0].endswith(WORKLOAD_FILE)
                )
            is_pool = _is_pool_function(filename, func)
            if is_pool:
                in_pool += sum(
                    c[3]
                    for caller, c in callers.items()
                    if not _is_pool_function(caller[0], caller[2])
                )
            rows.append(
                (tt, nc, is_pool, f"{os.path.basename(filename)}:{line}({func})")
            )
        rows.sort(reverse=True)
        print(
            f"\n### cProfile, {label}, {w.name}: {in_manager:.2f} s in manager calls "
            f"(profiled), of which {in_pool:.2f} s ({in_pool / in_manager:.0%}) inside the pool "
            f"(a pool that cost nothing: at most {in_manager / (in_manager - in_pool):.2f}x); "
            f"top functions by own time, whole run (the workload's own code and the request "
            f"hasher included):"
        )
        print("| own time, s | calls | pool? | function |")
        print("|---|---|---|---|")
        for tt, nc, is_pool, name in rows[:top]:
            print(f"| {tt:.3f} | {nc} | {'pool' if is_pool else ''} | {name} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="full")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=None, help="default: 4000")
    parser.add_argument("--blocks", type=int, default=None, help="default: 2048")
    parser.add_argument("--prefixes", type=int, default=None, help="default: 64")
    parser.add_argument("--events", choices=["on", "off"], default="on")
    parser.add_argument(
        "--core", choices=["default", "compiled", "pure-python"], default="default"
    )
    parser.add_argument(
        "--pool-time",
        action="store_true",
        help="also time the BlockPool calls themselves (wrapped per call)",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25, help="rows of the profile")
    args = parser.parse_args()

    # Refused busy resets log a warning per call in both pools (kvpool: under
    # "kvpool.", all lines); silence both alike.
    for name in ("vllm.v1.core.block_pool", "kvpool"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # As EngineCore does once it is up: vLLM's pool then reads
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES from a cache, not os.environ.
    vllm.envs.enable_envs_cache()

    print(
        f"# vLLM KVCacheManager: vLLM BlockPool vs kvpool\n"
        f"vllm {vllm.__version__}, kvpool {kvpool.__version__} "
        f"(package default core: {'compiled' if kvpool.USING_EXTENSION else 'pure-python'}), "
        f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs"
    )
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    for name in names:
        changes = {"enable_events": args.events == "on"}
        if args.requests:
            changes["num_requests"] = args.requests
        if args.blocks:
            changes["num_blocks"] = args.blocks
        if args.prefixes:
            changes["num_prefixes"] = args.prefixes
        w = WORKLOADS[name].scaled(**changes)
        report(w, bench(w, args.rounds, args.core, args.pool_time))
        if args.profile:
            profile(w, args.core, args.top)


if __name__ == "__main__":
    main()
