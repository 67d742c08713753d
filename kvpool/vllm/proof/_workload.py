"""A scheduler-like workload driven through vLLM's own ``KVCacheManager``, for
the releases whose ``get_computed_blocks`` returns ``(blocks, hit tokens)``:
0.15.0 to 0.25.x (from 0.26.0 ``kvpool.vllm.proof._workload33`` drives the
manager; ``DRIVER_SPLIT`` says where).

Shared by the manager suite of ``python -m kvpool.vllm --prove``
(``kvpool.vllm.proof.manager``), the differential tests
(``tests/vllm/test_vllm_manager.py``, which import it as ``vllm_workload``)
and the benchmark (``benchmarks/bench_vllm_manager.py``), so that all of them
measure and compare the same thing. It imports vLLM: use it only where vLLM
is importable.

The loop follows ``vllm.v1.core.sched.scheduler.Scheduler.schedule`` for
plain decoder-only requests (FCFS, chunked prefill, no speculative decoding,
no connector): running requests first (a prefill chunk or one decode token
each, preempting from the back of the running queue when
``allocate_slots`` fails), then waiting requests (``get_computed_blocks`` +
``allocate_slots``) while no request was preempted in this step; then each
scheduled request advances, a request whose prompt is fully computed gets a
new token, and a request that reached its output length is freed. On top of
that, at fixed steps it calls ``evict_blocks`` (as vLLM does for blocks whose
KV load failed) and ``reset_prefix_cache`` (busy: refused; between phases,
when the engine is idle: done).

What later releases of this range added to the manager, and how their
``Scheduler`` uses it, is detected from the loaded release's API (never from
its version string), so one loop serves them all and runs exactly the 0.15
calls on 0.15.x/0.16.x:

- 0.17.0: ``new_step_starts()`` at the start of every step; 0.17.1:
  ``take_new_block_ids()`` at the end of ``schedule()`` (recorded);
- 0.19.0-0.20.x: the admission gate ``can_fit_full_sequence`` before a
  waiting request's ``allocate_slots`` (``scheduler_reserve_full_isl``, on by
  default; recorded when it refuses); 0.21.0 folds it into
  ``allocate_slots(full_sequence_must_fit=True)``;
- constructor: ``max_num_batched_tokens`` (0.20.0), ``scheduler_block_size``
  (0.23.0), ``watermark`` (0.24.0); ``allocate_slots``: ``reserved_blocks``
  (0.23.0, 0 without an async KV load), ``has_scheduled_reqs`` (0.24.0);
- ``Request`` lost ``eos_token_id`` in 0.17.0.

Everything the scheduler could observe is recorded in ``Run.trace``: every
allocation's block ids per group (or ``None``), every prefix hit's block ids
and token count, the prefix-cache stats and the msgpack bytes of the
``KVEventBatch`` (vLLM's own class) of every step, usage and free-block
counts, common-prefix counts, eviction-metric counts. Two runs that make the
same decisions have equal traces.

Time spent inside manager calls is accumulated in ``Run.manager_seconds``
(one ``perf_counter`` pair per call, so both pools pay the same overhead).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch
from vllm.distributed.kv_events import KVEventBatch
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

from ._base import ProofFailure

# The block hasher needs vLLM's seed for the first block's parent hash. Set it
# once per process: both pools of a comparison then see the same hashes.
if not hasattr(kv_cache_utils, "NONE_HASH"):
    kv_cache_utils.init_none_hash(sha256)

VOCAB = 32_000

#: The first manager method of the releases the 0.33-style driver
#: (``kvpool.vllm.proof._workload33``) serves: vLLM 0.26.0 added it together
#: with the third value of ``get_computed_blocks`` (the shared-prefix
#: boundary) and the per-step copy-on-write drain.
DRIVER_SPLIT = "take_kv_cache_block_copies"


def accepted(function: Callable[..., Any], **arguments: Any) -> dict[str, Any]:
    """The keyword ``arguments`` that ``function`` (of the loaded vLLM
    release) has parameters for: how the drivers pass what a release's
    ``Scheduler`` passes, for arguments that only some releases know."""
    parameters = inspect.signature(function).parameters
    return {name: value for name, value in arguments.items() if name in parameters}


@dataclass(frozen=True)
class Group:
    """One KV-cache group: ``full`` attention or a ``sliding`` window."""

    kind: str
    block_size: int
    sliding_window: int = 0

    def attention_fields(self) -> dict[str, Any]:
        """The fields every attention spec of the drivers shares."""
        return {
            "block_size": self.block_size,
            "num_kv_heads": 1,
            "head_size": 8,
            "dtype": torch.float16,
        }

    def spec(self) -> KVCacheSpec:
        common = self.attention_fields()
        if self.kind == "full":
            return FullAttentionSpec(**common)
        if self.kind == "sliding":
            return SlidingWindowSpec(sliding_window=self.sliding_window, **common)
        raise ValueError(f"unknown group kind {self.kind!r}")


@dataclass(frozen=True)
class Workload:
    name: str
    groups: tuple[Group, ...] = (Group("full", 16),)
    num_blocks: int = 2048
    hash_block_size: int = 16
    max_model_len: int = 8192
    num_requests: int = 4000
    num_prefixes: int = 64
    prefix_tokens: tuple[int, int] = (64, 768)  # shared prompt prefix length
    suffix_tokens: tuple[int, int] = (1, 160)  # unique part of the prompt
    output_tokens: tuple[int, int] = (1, 160)
    max_running: int = 128  # max_num_seqs
    token_budget: int = 2048  # max_num_batched_tokens (chunked prefill)
    phases: int = 2  # the engine drains and resets the prefix cache between phases
    evict_every: int = 97  # steps; 0: never
    evict_count: int = 24  # block ids per evict_blocks call
    busy_reset_every: int = 211  # steps; reset_prefix_cache while busy (refused)
    lora_every: int = 7  # every n-th request carries a LoRA adapter; 0: none
    enable_caching: bool = True  # prefix caching
    enable_events: bool = True
    metrics_sample_rate: float | None = None  # vLLM's KVCacheMetricsCollector
    seed: int = 0

    def scaled(self, **changes: Any) -> Workload:
        return dataclasses.replace(self, **changes)

    @property
    def scheduler_block_size(self) -> int:
        """The scheduler's block size: the LCM of the group block sizes."""
        return math.lcm(*(g.block_size for g in self.groups))


@dataclass
class Run:
    trace: list[tuple] = field(default_factory=list)
    manager_seconds: float = 0.0
    manager_calls: int = 0
    wall_seconds: float = 0.0
    steps: int = 0
    finished: int = 0
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    events: int = 0
    busy_resets_refused: int = 0


def kv_cache_config(w: Workload) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=w.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(layer_names=[f"layer.{i}"], kv_cache_spec=g.spec())
            for i, g in enumerate(w.groups)
        ],
    )


def make_manager(w: Workload) -> KVCacheManager:
    """vLLM's ``KVCacheManager`` as the scheduler builds it: stats on, prefix
    caching and events as the workload says. Its pool is whatever class
    ``vllm.v1.core.kv_cache_coordinator.BlockPool`` names right now."""
    collector = (
        KVCacheMetricsCollector(w.metrics_sample_rate)
        if w.metrics_sample_rate is not None
        else None
    )
    return KVCacheManager(
        kv_cache_config(w),
        max_model_len=w.max_model_len,
        hash_block_size=w.hash_block_size,
        enable_caching=w.enable_caching,
        log_stats=True,
        enable_kv_cache_events=w.enable_events,
        metrics_collector=collector,
        **accepted(
            KVCacheManager.__init__,
            max_num_batched_tokens=w.token_budget,
            scheduler_block_size=w.scheduler_block_size,
            watermark=0.0,
        ),
    )


@dataclass
class _Spec:
    request_id: str
    prompt: list[int]
    outputs: list[int]
    lora: LoRARequest | None


def _request_specs(w: Workload) -> list[_Spec]:
    rng = random.Random(w.seed)
    prefixes = [
        [rng.randrange(VOCAB) for _ in range(rng.randint(*w.prefix_tokens))]
        for _ in range(w.num_prefixes)
    ]
    loras = [
        LoRARequest(f"adapter-{i}", i + 1, f"/nonexistent/adapter-{i}")
        for i in range(2)
    ]
    specs = []
    for i in range(w.num_requests):
        # Popular prefixes are reused more (a skewed, realistic mix).
        prefix = prefixes[
            min(int(rng.expovariate(4.0 / w.num_prefixes)), w.num_prefixes - 1)
        ]
        suffix = [rng.randrange(VOCAB) for _ in range(rng.randint(*w.suffix_tokens))]
        outputs = [rng.randrange(VOCAB) for _ in range(rng.randint(*w.output_tokens))]
        lora = loras[i % 2] if w.lora_every and i % w.lora_every == 0 else None
        specs.append(_Spec(f"req-{i}", prefix + suffix, outputs, lora))
    return specs


def _ids(blocks: Any) -> tuple | None:
    """Block ids of a ``KVCacheBlocks`` (per group), or None."""
    if blocks is None:
        return None
    return tuple(tuple(b.block_id for b in group) for group in blocks.blocks)


def _stats_tuple(stats: Any) -> tuple:
    # (vLLM 0.33's PrefixCacheStats has a dict field, hits_by_source.)
    return tuple(
        (k, tuple(sorted(v.items())) if isinstance(v, dict) else v)
        for k, v in sorted(dataclasses.asdict(stats).items())
    )


def build_requests(w: Workload) -> list[Request]:
    """Fresh ``Request``s (they carry scheduling state: build new ones for
    every run). Block hashes are computed at ``hash_block_size``, as the
    engine does."""
    hasher = kv_cache_utils.get_request_block_hasher(w.hash_block_size, sha256)
    requests = []
    for spec in _request_specs(w):
        req = Request(
            request_id=spec.request_id,
            prompt_token_ids=spec.prompt,
            sampling_params=SamplingParams(max_tokens=len(spec.outputs)),
            pooling_params=None,
            lora_request=spec.lora,
            block_hasher=hasher,
            **accepted(Request.__init__, eos_token_id=None),
        )
        req._kvpool_outputs = spec.outputs  # the tokens the "model" will emit
        requests.append(req)
    return requests


def end_of_step(
    w: Workload,
    mgr: KVCacheManager,
    step: int,
    rng: random.Random,
    running: list[Request],
    out: Run,
    record: bool,
    encoder: msgspec.msgpack.Encoder,
) -> tuple[float, int]:
    """The end of every step, the same in each vLLM line's driver: occasional
    ``evict_blocks`` / busy ``reset_prefix_cache``, then ``take_events``,
    ``make_prefix_cache_stats`` and ``usage`` (recorded with the step's
    ``KVEventBatch`` bytes, free count, common-prefix counts and eviction
    samples). Returns the seconds spent inside manager calls and their
    number."""
    trace = out.trace
    clock = time.perf_counter
    spent = 0.0
    calls = 0
    if w.evict_every and step % w.evict_every == 0:
        ids = {rng.randrange(w.num_blocks) for _ in range(w.evict_count)}
        t0 = clock()
        mgr.evict_blocks(ids)
        spent += clock() - t0
        calls += 1
        if record:
            trace.append(("evict", step, tuple(sorted(ids))))
    if w.busy_reset_every and step % w.busy_reset_every == 0:
        t0 = clock()
        ok = mgr.reset_prefix_cache()
        spent += clock() - t0
        calls += 1
        out.busy_resets_refused += not ok
        if record:
            trace.append(("reset", step, ok))

    t0 = clock()
    events = mgr.take_events()
    stats = mgr.make_prefix_cache_stats()
    usage = mgr.usage
    spent += clock() - t0
    calls += 3
    out.events += len(events)
    if record:
        batch = (
            encoder.encode(KVEventBatch(ts=float(step), events=events)) if events else b""
        )
        common = (
            tuple(mgr.get_num_common_prefix_blocks(running[0].request_id))
            # (gone in 0.34: cascade attention was removed)
            if running and hasattr(mgr, "get_num_common_prefix_blocks")
            else ()
        )
        evictions = (
            len(mgr.metrics_collector.drain_events()) if mgr.metrics_collector else 0
        )
        trace.append(
            (
                "step",
                step,
                batch,
                _stats_tuple(stats),
                usage,
                mgr.block_pool.get_num_free_blocks(),
                common,
                evictions,
            )
        )
    return spent, calls


def run(
    w: Workload,
    *,
    record: bool = True,
    requests: list[Request] | None = None,
    on_manager: Callable[[KVCacheManager], None] | None = None,
) -> Run:
    """Drive a fresh manager through the workload. ``record=False`` keeps the
    trace empty (for timing); the decisions are the same either way.
    ``on_manager`` sees the manager before the first call (the benchmark
    instruments its pool there)."""
    if w.metrics_sample_rate is not None:
        random.seed(w.seed)  # the collector samples with the global RNG
    mgr = make_manager(w)
    if on_manager is not None:
        on_manager(mgr)
    if requests is None:
        requests = build_requests(w)
    out = Run()
    trace = out.trace
    encoder = msgspec.msgpack.Encoder()
    clock = time.perf_counter
    spent = 0.0
    calls = 0
    # The manager calls only some releases of this range have (see the
    # module docstring); None where the loaded release has not.
    step_starts = getattr(mgr, "new_step_starts", None)
    take_new_block_ids = getattr(mgr, "take_new_block_ids", None)
    can_fit_full_sequence = getattr(mgr, "can_fit_full_sequence", None)
    admission = accepted(
        mgr.allocate_slots,
        full_sequence_must_fit=True,
        reserved_blocks=0,
        has_scheduled_reqs=True,
    )

    phase_size = -(-len(requests) // w.phases)
    phases = [requests[i : i + phase_size] for i in range(0, len(requests), phase_size)]
    waiting: collections.deque[Request] = collections.deque()
    running: list[Request] = []
    rng = random.Random(w.seed + 1)
    step = 0
    wall0 = clock()

    for phase_no, phase in enumerate(phases):
        if phase_no:
            # Idle engine: the reset must succeed (the RLHF weight-update path).
            t0 = clock()
            ok = mgr.reset_prefix_cache()
            spent += clock() - t0
            calls += 1
            if not ok:
                raise ProofFailure("reset_prefix_cache refused on an idle engine")
            if record:
                trace.append(("reset", step, ok))
        waiting.extend(phase)
        while waiting or running:
            step += 1
            budget = w.token_budget
            scheduled: list[tuple[Request, int]] = []
            preempted = False
            if step_starts is not None:
                t0 = clock()
                step_starts()
                spent += clock() - t0
                calls += 1

            # 1. Running requests: a prefill chunk or one decode token each.
            i = 0
            while i < len(running) and budget > 0:
                req = running[i]
                num_new = min(req.num_tokens - req.num_computed_tokens, budget)
                num_new = min(num_new, w.max_model_len - 1 - req.num_computed_tokens)
                while True:
                    t0 = clock()
                    new_blocks = mgr.allocate_slots(req, num_new)
                    spent += clock() - t0
                    calls += 1
                    if record:
                        trace.append(
                            ("alloc", step, req.request_id, num_new, _ids(new_blocks))
                        )
                    if new_blocks is not None:
                        break
                    # Out of blocks: preempt the lowest-priority (last) request.
                    victim = running.pop()
                    t0 = clock()
                    mgr.free(victim)
                    spent += clock() - t0
                    calls += 1
                    victim.status = RequestStatus.PREEMPTED
                    victim.num_computed_tokens = 0
                    victim.num_preemptions += 1
                    waiting.appendleft(victim)
                    preempted = True
                    out.preemptions += 1
                    if record:
                        trace.append(("preempt", step, victim.request_id))
                    if victim is req:
                        break
                if new_blocks is None:
                    break
                scheduled.append((req, num_new))
                budget -= num_new
                i += 1

            # 2. Waiting requests, unless this step preempted.
            while (
                not preempted
                and waiting
                and budget > 0
                and len(running) < w.max_running
            ):
                req = waiting[0]
                t0 = clock()
                computed, num_computed = mgr.get_computed_blocks(req)
                spent += clock() - t0
                calls += 1
                out.prefix_hit_tokens += num_computed
                if record:
                    trace.append(
                        ("hit", step, req.request_id, num_computed, _ids(computed))
                    )
                num_new = min(req.num_tokens - num_computed, budget)
                if can_fit_full_sequence is not None:
                    t0 = clock()
                    fits = can_fit_full_sequence(
                        req,
                        num_new_computed_tokens=num_computed,
                        new_computed_blocks=computed,
                    )
                    spent += clock() - t0
                    calls += 1
                    if not fits:
                        if record:
                            trace.append(("no-fit", step, req.request_id))
                        break
                if "has_scheduled_reqs" in admission:
                    admission["has_scheduled_reqs"] = bool(running)
                t0 = clock()
                new_blocks = mgr.allocate_slots(
                    req, num_new, num_computed, computed, **admission
                )
                spent += clock() - t0
                calls += 1
                if record:
                    trace.append(
                        ("alloc", step, req.request_id, num_new, _ids(new_blocks))
                    )
                if new_blocks is None:
                    break
                waiting.popleft()
                running.append(req)
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = num_computed
                scheduled.append((req, num_new))
                budget -= num_new

            # The end of schedule(): blocks the workers must zero.
            if take_new_block_ids is not None:
                t0 = clock()
                zero_ids = take_new_block_ids()
                spent += clock() - t0
                calls += 1
                if record:
                    trace.append(("zero", step, tuple(zero_ids)))

            # 3. The "model" ran: advance, emit tokens, finish.
            finished = []
            for req, num_new in scheduled:
                req.num_computed_tokens += num_new
                if req.num_computed_tokens >= req.num_tokens:
                    outputs = req._kvpool_outputs
                    req.append_output_token_ids(outputs[req.num_output_tokens])
                    if req.num_output_tokens >= len(outputs):
                        finished.append(req)
            for req in finished:
                running.remove(req)
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                t0 = clock()
                mgr.free(req)
                spent += clock() - t0
                calls += 1
                out.finished += 1
                if record:
                    trace.append(("free", step, req.request_id))

            # 4. Occasional cache maintenance; 5. what the engine publishes.
            dt, n = end_of_step(w, mgr, step, rng, running, out, record, encoder)
            spent += dt
            calls += n

    out.wall_seconds = clock() - wall0
    out.manager_seconds = spent
    out.manager_calls = calls
    out.steps = step
    return out


# The configurations the tests and the benchmark share.
FULL = Workload("full-attention")
HYBRID = Workload(
    "full+sliding-window",
    groups=(Group("full", 16), Group("sliding", 16, sliding_window=128)),
    metrics_sample_rate=0.5,
)
MIXED_BLOCK_SIZES = Workload(
    "full32+sliding16",
    groups=(Group("full", 32), Group("sliding", 16, sliding_window=96)),
    hash_block_size=16,
)
# Long shared prompts, short answers: prefix hits, touch, caching and frees
# weigh more than the per-token decode path.
PREFILL_HEAVY = Workload(
    "prefill-heavy",
    prefix_tokens=(512, 2048),
    suffix_tokens=(16, 256),
    output_tokens=(1, 8),
    num_blocks=4096,
    max_running=64,
    token_budget=8192,
)
