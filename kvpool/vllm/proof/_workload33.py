"""A scheduler-like workload driven through vLLM 0.33.x's own ``KVCacheManager``,
and that of every release from 0.26.0 (``_workload.DRIVER_SPLIT``).

The 0.33 twin of ``kvpool.vllm.proof._workload`` (vLLM 0.15.0-0.25.x): the same
workloads, the same trace format, but the manager is built and called the way
vLLM 0.33.0's ``Scheduler`` does it (``vllm/v1/core/sched/scheduler.py``).
What the releases 0.26.0-0.32.0 lack is detected from the loaded release's
API: ``record_prefix_cache_stats`` (0.27.0; before, ``get_computed_blocks``
records the hit itself), ``take_boundary_state_offloads`` (0.29.0; 0.27.x and
0.28.0's ``take_partial_tail_offloads`` is called only for a KV producer
connector, so never here), the constructor's ``num_prefill_lookahead``
(0.28.0), ``enable_mamba_fine_grained_prefix_cache`` (0.30.0 only),
``enable_mamba_shared_prefix_checkpoint`` (0.31.0) and
``num_hash_lookahead_tokens`` (0.33.0); the Mamba split reads
``use_eagle`` until 0.29.x, ``use_eagle_block_drop`` after.
Shared by the manager suite of ``python -m kvpool.vllm --prove``
(``kvpool.vllm.proof.manager``), the differential tests
(``tests/vllm33/test_vllm_manager33.py``, which import it as
``vllm_workload33``) and the benchmark (``benchmarks/bench_vllm_manager.py``).
It imports vLLM (0.26 or later): use it only where that vLLM is importable.

Construction (``Scheduler.__init__``): ``KVCacheManager(kv_cache_config,
max_model_len, max_in_flight_tokens=max_num_batched_tokens (one batch in
flight: no async scheduling, no PP), enable_caching, use_eagle=False,
num_hash_lookahead_tokens=0, num_prefill_lookahead=0, log_stats=True,
enable_kv_cache_events, scheduler_block_size=LCM of the group block sizes,
hash_block_size=GCD of them (the engine's ``resolve_kv_cache_block_sizes``;
a single group: its block size), metrics_collector, watermark=0.0)``.

One step follows ``Scheduler.schedule`` then ``update_from_output`` for plain
decoder-only requests (FCFS, chunked prefill, no speculative decoding, no
connector, no async scheduling, ``scheduler_reserve_full_isl`` on as by
default):

- ``new_step_starts()``;
- running requests: a prefill chunk or one decode token each through
  ``allocate_slots(req, n, num_lookahead_tokens=0)``, preempting from the back
  of the running queue (``free``) when it fails;
- waiting requests (none if this step preempted): ``get_computed_blocks``
  (three values in 0.33: blocks, hit tokens, shared-prefix boundary, the last
  stored on the request as the scheduler does), then ``allocate_slots`` with
  the hit, ``full_sequence_must_fit=True`` and ``has_scheduled_reqs``, then
  ``record_prefix_cache_stats`` for the admitted request;
- end of ``schedule()``: ``take_boundary_state_offloads()``,
  ``take_kv_cache_block_copies()`` (the copy-on-write pairs; their retained
  blocks go back through ``block_pool.free_blocks`` as the scheduler does
  without deferred frees), ``take_new_block_ids()``;
- the "model" ran: computed and in-flight counts advance, a request whose
  prompt is fully computed gets a token (``estimate_cached_tokens`` on its
  first one, for the prefill stats), a request that reached its output
  length is freed;
- at fixed steps ``evict_blocks`` (as vLLM does for blocks whose KV load
  failed) and ``reset_prefix_cache`` (busy: refused; between phases, when the
  engine is idle: done);
- ``take_events()``, ``make_prefix_cache_stats()``, ``usage``.

Everything the scheduler could observe is recorded in ``Run.trace``, in the
0.15 driver's format plus the 0.33-only calls: every allocation's block ids
per group (or ``None``), every prefix hit's block ids, token count and
shared-prefix boundary, the copy-on-write pairs and new-block ids of every
step, the prefix-cache stats and the msgpack bytes of the ``KVEventBatch``
(vLLM's own class) of every step, usage and free-block counts, common-prefix
counts, eviction-metric counts. Two runs that make the same decisions have
equal traces.

Time spent inside manager calls is accumulated in ``Run.manager_seconds``
(one ``perf_counter`` pair per call, so both pools pay the same overhead).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import random
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import msgspec
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.v1.core.sched import scheduler as _scheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheSpec, MambaSpec
from vllm.v1.request import Request, RequestStatus

# What does not depend on the vLLM line (groups, workload knobs, the request
# mix, trace helpers) is the 0.15 driver's; it imports only names that 0.33
# still has, and seeds NONE_HASH the same way.
from . import _workload as _v15
from ._base import ProofFailure
from ._workload import VOCAB, _ids, _request_specs, accepted

__all__ = ["VOCAB", "Group", "Workload", "Run", "run", "build_requests", "make_manager"]

VLLM_LINE = "0.33"

#: Whether the loaded release hashes blocks with lookahead tokens (0.33 on:
#: ``Workload.hash_lookahead`` then means something).
HASH_LOOKAHEAD = "num_hash_lookahead_tokens" in inspect.signature(
    kv_cache_utils.get_request_block_hasher
).parameters


def _has_mamba_mode_all() -> bool:
    try:
        from vllm.config.cache import MambaCacheMode
    except ImportError:  # (no such type in this release)
        return False
    return "all" in typing.get_args(MambaCacheMode)


#: Whether the loaded release has Mamba's ``mamba_cache_mode`` "all" (0.30
#: and 0.31: deprecated there, removed in 0.32).
MAMBA_MODE_ALL = _has_mamba_mode_all()

#: Whether the loaded release's ``MambaSpec`` has prefill-checkpoint blocks
#: and their alignment (0.30 on).
MAMBA_CHECKPOINTS = {"num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment"} <= {
    f.name for f in dataclasses.fields(MambaSpec)}


@dataclass(frozen=True)
class Group(_v15.Group):
    """One KV-cache group: ``full`` attention, a ``sliding`` window, an
    ``rswa`` group (0.26 on: reference sliding window, full attention that
    frees the blocks between the prompt and the last ``sliding_window``
    processed tokens), a ``chunked`` local-attention group (chunks of
    ``sliding_window`` tokens, Llama 4's local layers), a ``sink`` group
    (sink attention, two blocks of sink), a ``mamba`` state group (in
    ``mamba_mode`` "align", what enables sub-block prefix hits and their
    copy-on-write; or "none", prefix caching off, with
    ``speculative_blocks`` for MTP), or a ``cross`` attention group (an encoder-decoder
    model's: its blocks hold the request's encoder tokens, allocated when
    the request is admitted; prefix caching off), or a ``ring`` group (a
    compressor's circular buffer: one block a request; 0.30, 0.31 also
    ``kpool-tail``, the same over a sliding-window spec). ``dtype``: an attention group's KV dtype; groups of
    different dtypes make a mixed-precision cache, whose new blocks vLLM
    records for zeroing (``take_new_block_ids``)."""

    dtype: str = "float16"
    mamba_mode: str = "align"
    speculative_blocks: int = 0
    # A Mamba "align" group's prefill-checkpoint blocks: a chunk crossing a
    # state block may keep the state at an inner hash boundary (reserving a
    # block for it), at multiples of ``checkpoint_alignment`` tokens.
    checkpoint_blocks: int = 0
    checkpoint_alignment: int | None = None

    def spec(self) -> KVCacheSpec:
        if self.kind == "mamba":
            checkpoints = {}
            if self.checkpoint_blocks:
                checkpoints = {"num_prefill_checkpoint_blocks": self.checkpoint_blocks,
                               "prefill_checkpoint_alignment": self.checkpoint_alignment}
            return MambaSpec(
                block_size=self.block_size,
                shapes=((4,),),
                dtypes=(torch.float16,),
                mamba_cache_mode=self.mamba_mode,
                num_speculative_blocks=self.speculative_blocks,
                **checkpoints,
            )
        if self.kind in ("sink", "rswa", "chunked", "cross", "ring", "kpool-tail"):
            from vllm.v1 import kv_cache_interface
            from vllm.v1.kv_cache_interface import (
                ChunkedLocalAttentionSpec,
                CrossAttentionSpec,
                RSWASpec,
                SinkFullAttentionSpec,
            )

            common = {**self.attention_fields(), "dtype": getattr(torch, self.dtype)}
            if self.kind == "ring":
                return kv_cache_interface.CircularBufferSpec(**common)
            if self.kind == "kpool-tail":  # (0.30, 0.31)
                return kv_cache_interface.KpoolTailSpec(sliding_window=self.block_size, **common)
            if self.kind == "cross":
                return CrossAttentionSpec(**common)
            if self.kind == "sink":
                return SinkFullAttentionSpec(sink_len=2 * self.block_size, **common)
            if self.kind == "chunked":
                return ChunkedLocalAttentionSpec(attention_chunk_size=self.sliding_window, **common)
            return RSWASpec(rswa_window=self.sliding_window, **common)
        spec = super().spec()
        if self.dtype != "float16":
            spec = dataclasses.replace(spec, dtype=getattr(torch, self.dtype))
        return spec


def kv_cache_config(w: _v15.Workload) -> Any:
    config = _v15.kv_cache_config(w)
    retention = getattr(w, "retention_interval", None)
    if retention is not None:
        # (0.30 on; the engine's default is 0, a KVCacheConfig's None)
        config.prefix_cache_retention_interval = retention
    return config


@dataclass(frozen=True)
class Workload(_v15.Workload):
    # Arrivals: 0 puts a whole phase in the waiting queue at once; n > 0 admits
    # n new requests per step (so requests arrive while others sharing their
    # prefix are still running and their blocks are in use).
    arrivals_per_step: int = 0
    # Every n-th request repeats the previous request's prompt exactly (a
    # retry, or the same question twice): with sub-block hits on, it hits the
    # partial tail block the other one cached. 0: never.
    repeat_every: int = 0
    # The manager's admission watermark (a fraction of the pool's blocks).
    watermark: float = 0.0
    # Speculative decoding: draft tokens proposed for each decoding request
    # on each step (0: none), each accepted with ``accept_rate`` until the
    # first rejection (the rest roll ``num_computed_tokens`` back).
    spec_tokens: int = 0
    accept_rate: float = 0.6
    # The drafter is EAGLE-family (EAGLE, EAGLE-3, MTP): the manager is built
    # with ``use_eagle`` and ``allocate_slots`` reserves ``spec_tokens``
    # lookahead slots; else the drafts are n-gram's (no lookahead).
    eagle: bool = False
    # Multi-module MTP: the drafter reads ``spec_tokens`` prefill tokens
    # ahead (``num_prefill_lookahead``; EAGLE-family otherwise: 1).
    multi_module_mtp: bool = False
    # Lookahead block hashes (0.33 on, the engine's default for the EAGLE
    # family with prefix caching and no connector): each hash also covers
    # the prefill lookahead's tokens after its block, the manager is built
    # without the EAGLE drop (``use_eagle_block_drop`` False) and the pool
    # stores each block's lookahead tokens with it.
    hash_lookahead: bool = False
    # The KV-cache config's prefix_cache_retention_interval (0.30 on): None,
    # every Mamba state and sliding-window tail kept (a KVCacheConfig's
    # default); 0, only those a later request can resume at (the engine's
    # default: its CacheConfig's); n, one per n tokens as well.
    retention_interval: int | None = None
    # A KV connector (one group whose block is the hash block): an external
    # store keeps the prompt blocks of every finished request, and an
    # admission adopts the stored blocks past its local hit as external
    # tokens (up to the last prompt token). Every ``async_load_every``-th
    # such admission loads asynchronously (``delay_cache_blocks``, the
    # request waits ``load_steps`` steps, then its blocks are cached); of
    # those every ``failed_load_every``-th fails halfway (its blocks from
    # there are evicted, the valid part cached, or the request freed) and
    # every ``aborted_load_every``-th is aborted mid-load (freed).
    connector: bool = False
    async_load_every: int = 2
    load_steps: int = 2
    failed_load_every: int = 3
    aborted_load_every: int = 5
    # An encoder-decoder model (a ``cross`` group): each request's encoder
    # tokens, drawn from this range (both ends included), are passed as
    # ``num_encoder_tokens`` with the chunk that starts it from token 0 (an
    # admission, a preempted request's too), as vLLM's scheduler does when it
    # schedules the encoder input. (0, 0): none.
    encoder_tokens: tuple[int, int] = (0, 0)

    @property
    def num_lookahead_tokens(self) -> int:
        """``VllmConfig.num_lookahead_tokens``: the EAGLE family's drafts."""
        return self.spec_tokens if self.eagle else 0

    @property
    def num_prefill_lookahead(self) -> int:
        """``VllmConfig.num_prefill_lookahead_tokens``."""
        if not self.eagle:
            return 0
        return self.spec_tokens if self.multi_module_mtp else 1

    @property
    def num_hash_lookahead_tokens(self) -> int:
        """``VllmConfig.num_hash_lookahead_tokens`` (0.33 on)."""
        if not (self.hash_lookahead and self.enable_caching and not self.connector):
            return 0
        return self.num_prefill_lookahead


@dataclass
class Run(_v15.Run):
    cow_copies: int = 0
    # Admissions whose prefix hit includes blocks a running request holds.
    hits_on_blocks_in_use: int = 0
    # Speculative decoding: drafts scheduled, and those rejected.
    draft_tokens: int = 0
    rejected_tokens: int = 0
    # KV connector: tokens adopted as external, asynchronous loads, failed
    # and aborted ones.
    external_tokens: int = 0
    async_loads: int = 0
    failed_loads: int = 0
    aborted_loads: int = 0


def make_manager(w: Workload, manager_class: type | None = None) -> KVCacheManager:
    """vLLM's ``KVCacheManager`` as the 0.33 scheduler builds it: stats on,
    prefix caching and events as the workload says. Its class is
    ``manager_class`` if given, else whatever the scheduler's module names
    ``KVCacheManager`` right now (kvpool's manager once
    ``kvpool.vllm.install()`` put it there), its pool whatever class
    ``vllm.v1.core.kv_cache_coordinator.BlockPool`` names."""
    if manager_class is None:
        manager_class = _scheduler.KVCacheManager
    collector = (
        KVCacheMetricsCollector(w.metrics_sample_rate)
        if w.metrics_sample_rate is not None
        else None
    )
    return manager_class(
        kv_cache_config=kv_cache_config(w),
        max_model_len=w.max_model_len,
        max_in_flight_tokens=w.token_budget,  # one batch in flight
        enable_caching=w.enable_caching,
        # (Scheduler: use_eagle_block_drop, the EAGLE family's unless
        # lookahead hashes prove the boundary)
        use_eagle=getattr(w, "eagle", False) and not _hash_lookahead(w),
        log_stats=True,
        enable_kv_cache_events=w.enable_events,
        dcp_world_size=1,
        pcp_world_size=1,
        scheduler_block_size=w.scheduler_block_size,
        hash_block_size=w.hash_block_size,
        metrics_collector=collector,
        watermark=w.watermark,
        **accepted(
            manager_class.__init__,
            num_hash_lookahead_tokens=_hash_lookahead(w),  # 0.33.0
            num_prefill_lookahead=getattr(w, "num_prefill_lookahead", 0),  # 0.28.0
            enable_mamba_fine_grained_prefix_cache=False,  # 0.30.0 only
            enable_mamba_shared_prefix_checkpoint=False,  # 0.31.0
        ),
    )


def build_requests(w: Workload) -> list[Request]:
    """Fresh ``Request``s (they carry scheduling state: build new ones for
    every run). Block hashes are computed at ``hash_block_size``, as the
    engine does."""
    hasher = request_block_hasher(w)
    requests = []
    specs = _request_specs(w)
    encoder_rng = random.Random(w.seed + 3)
    for i, spec in enumerate(specs):
        if w.repeat_every and i % w.repeat_every == w.repeat_every - 1:
            spec = dataclasses.replace(spec, prompt=specs[i - 1].prompt)
        req = new_request(spec.request_id, spec.prompt, len(spec.outputs), hasher, spec.lora)
        req._kvpool_outputs = spec.outputs  # the tokens the "model" will emit
        req._kvpool_encoder_tokens = (
            encoder_rng.randint(*w.encoder_tokens) if w.encoder_tokens[1] else 0)
        requests.append(req)
    return requests


def _hash_lookahead(w: _v15.Workload) -> int:
    return getattr(w, "num_hash_lookahead_tokens", 0)


def request_block_hasher(w: _v15.Workload) -> Callable[[Request], list]:
    """vLLM's own request block hasher at the workload's ``hash_block_size``
    (and its lookahead, 0.33 on), as the engine makes it."""
    lookahead = _hash_lookahead(w)
    if lookahead:
        return kv_cache_utils.get_request_block_hasher(
            w.hash_block_size, sha256, num_hash_lookahead_tokens=lookahead)
    return kv_cache_utils.get_request_block_hasher(w.hash_block_size, sha256)


def new_request(
    request_id: str,
    prompt: list[int],
    max_tokens: int,
    hasher: Callable[[Request], list],
    lora: Any = None,
    extra_args: dict[str, Any] | None = None,
) -> Request:
    """A fresh decoder-only ``Request`` as the engine makes it (its block
    hashes made by ``hasher`` now and whenever a token is appended)."""
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, extra_args=extra_args),
        pooling_params=None,
        lora_request=lora,
        block_hasher=hasher,
    )


def _align_tables(managers: list) -> tuple:
    """What each align-mode Mamba manager keeps per request, for the trace:
    a step that left one of these tables otherwise than vLLM's code would
    shows here even where no block or event shows it yet."""
    def ids(value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(ids(v) for v in value)
        return getattr(value, "block_id", value)

    def table(m: Any, name: str) -> tuple:
        # (a table the release's manager does not keep: empty)
        value = getattr(m, name, {})
        if isinstance(value, dict):
            return tuple(sorted((k, ids(v)) for k, v in value.items()))
        return tuple(sorted(value))

    return tuple(
        tuple(table(m, name) for name in (
            "_checkpoints", "_allocated_block_reqs", "last_state_block_idx",
            "_num_retired_blocks", "_partial_hit_reqs", "_producer_partial_tail_reqs",
            "num_cached_block"))
        for m in managers
    )


def _mamba_split(w: Workload, mgr: KVCacheManager) -> Callable[..., int] | None:
    """With a Mamba "align" group the scheduler clips prefill chunks to where
    Mamba state must be cached: vLLM's own
    ``Scheduler._mamba_block_aligned_split``, bound to the attributes it
    reads, set as ``Scheduler.__init__`` sets them for this configuration
    (EAGLE's block drop and the prefill-checkpoint blocks as the workload's,
    no long-prefill threshold)."""
    mamba = [g for g in w.groups if g.kind == "mamba"]
    if not mamba or not w.enable_caching:
        return None
    drop = getattr(w, "eagle", False) and not _hash_lookahead(w)
    partial = (
        w.hash_block_size < w.scheduler_block_size
        and mgr.coordinator.enable_partial_hash_hits
    )
    scheduler = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=mamba[0].block_size),
        block_size=w.scheduler_block_size,
        hash_block_size=w.hash_block_size,
        use_eagle=drop,  # until 0.29.x
        use_eagle_block_drop=drop,  # from 0.30.0
        mamba_fine_grained_prefix_cache=False,  # 0.30.0 only
        num_hash_lookahead_tokens=_hash_lookahead(w),
        mamba_has_prefill_checkpoint_blocks=all(g.checkpoint_blocks > 0 for g in mamba),
        mamba_prefill_checkpoint_alignment=mamba[0].checkpoint_alignment,
        max_num_scheduled_tokens=w.token_budget,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        mamba_partial_cache_hit=partial,
        mamba_shared_prefix_checkpoint=partial
        and getattr(mgr, "mamba_shared_prefix_checkpoint", False),
    )
    return functools.partial(Scheduler._mamba_block_aligned_split, scheduler)


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
    split = _mamba_split(w, mgr)
    align_managers = [
        m for m in mgr.coordinator.single_type_managers
        if getattr(m, "mamba_cache_mode", None) == "align" and m.enable_caching
    ]
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
    # module docstring): a stand-in where the loaded release has not.
    record_prefix_cache_stats = getattr(
        mgr, "record_prefix_cache_stats", lambda request, num_hits: None
    )
    take_boundary_state_offloads = getattr(mgr, "take_boundary_state_offloads", dict)
    WAITING, RUNNING, PREEMPTED = (
        RequestStatus.WAITING,
        RequestStatus.RUNNING,
        RequestStatus.PREEMPTED,
    )

    phase_size = -(-len(requests) // w.phases)
    phases = [requests[i : i + phase_size] for i in range(0, len(requests), phase_size)]
    waiting: collections.deque[Request] = collections.deque()
    running: list[Request] = []
    rng = random.Random(w.seed + 1)
    spec_rng = random.Random(w.seed + 2)  # the drafts' acceptance
    # KV connector: the external store (block hashes), the asynchronous loads
    # in flight (done step, number, request, local hit tokens), and the
    # external hits so far.
    store: set = set()
    loading: collections.deque = collections.deque()
    loads = 0
    failing: dict[str, int] = {}  # synchronous loads failing this step: local hit
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
        arrivals = collections.deque(phase)
        if not w.arrivals_per_step:
            waiting.extend(arrivals)
            arrivals.clear()
        while arrivals or waiting or running or loading:
            step += 1
            for _ in range(min(w.arrivals_per_step, len(arrivals))):
                waiting.append(arrivals.popleft())
            budget = w.token_budget
            scheduled: list[tuple[Request, int]] = []
            drafts: dict[str, int] = {}  # request id: drafts scheduled this step
            preempted = False

            t0 = clock()
            mgr.new_step_starts()
            spent += clock() - t0
            calls += 1

            # 0. KV loads that finished (the scheduler's
            # _update_waiting_for_remote_kv), in the order they started.
            while loading and loading[0][0] <= step:
                _, n, req, local = loading.popleft()
                t0 = clock()
                if w.aborted_load_every and n % w.aborted_load_every == 0:
                    # Aborted mid-load: its blocks are freed.
                    mgr.free(req)
                    spent += clock() - t0
                    calls += 1
                    out.aborted_loads += 1
                    out.finished += 1
                    req.status = RequestStatus.FINISHED_ABORTED
                    if record:
                        trace.append(("aborted", step, req.request_id))
                    continue
                if w.failed_load_every and n % w.failed_load_every == 0:
                    # Failed halfway: the blocks from there are evicted, the
                    # valid prefix is cached (or, none, the request freed).
                    req.num_computed_tokens = _fail_load(
                        w, mgr, req, local, req.num_computed_tokens)
                    if req.num_computed_tokens:
                        mgr.cache_blocks(req, req.num_computed_tokens)
                    else:
                        mgr.free(req)
                    calls += 3
                    out.failed_loads += 1
                else:
                    mgr.cache_blocks(req, req.num_computed_tokens)
                    calls += 1
                spent += clock() - t0
                if record:
                    trace.append(("loaded", step, req.request_id, req.num_computed_tokens))
                req.status = PREEMPTED if req.num_preemptions else WAITING
                waiting.appendleft(req)

            # 1. Running requests: a prefill chunk or one decode token each.
            i = 0
            while i < len(running) and budget > 0:
                req = running[i]
                # (num_tokens_with_spec: the request's drafts too)
                num_new = min(req.num_tokens_with_spec - req.num_computed_tokens, budget)
                num_new = min(num_new, w.max_model_len - req.num_computed_tokens - 1)
                if split is not None:
                    num_new = split(req, num_new)
                num_new = _reserve_prefill_lookahead(w, req, req.num_computed_tokens, num_new)
                if num_new <= 0:
                    i += 1
                    continue
                while True:
                    t0 = clock()
                    new_blocks = mgr.allocate_slots(
                        req, num_new, num_lookahead_tokens=w.num_lookahead_tokens
                    )
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
                    victim.status = PREEMPTED
                    victim.num_computed_tokens = 0
                    victim.num_preemptions += 1
                    victim.spec_token_ids = []
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
                _schedule_drafts(req, num_new, drafts)

            # The blocks in-flight prefills still need (the scheduler's
            # _request_remaining_blocks, through the coordinator).
            for req in running:
                if req.num_computed_tokens >= req.num_prompt_tokens:
                    continue
                full = min(req.num_tokens, w.max_model_len)
                coordinator = mgr.coordinator
                t0 = clock()
                remaining = coordinator.get_num_blocks_to_allocate(
                    request_id=req.request_id,
                    num_tokens=full,
                    new_computed_blocks=mgr.empty_kv_cache_blocks.blocks,
                    num_encoder_tokens=0,
                    total_computed_tokens=req.num_computed_tokens,
                    num_local_computed_tokens=req.num_computed_tokens,
                    num_tokens_main_model=full,
                    apply_admission_cap=True,
                    **accepted(
                        type(coordinator).get_num_blocks_to_allocate,
                        prefill_end=max(req.num_prompt_tokens, req.num_tokens - 1),
                    ),
                )
                spent += clock() - t0
                calls += 1
                if record:
                    trace.append(("remaining", step, req.request_id, remaining))

            # 2. Waiting requests, unless this step preempted.
            while (
                not preempted
                and waiting
                and budget > 0
                and len(running) < w.max_running
            ):
                req = waiting[0]
                # A request whose KV load finished has its blocks and
                # computed tokens already: no lookup (the scheduler's).
                loaded = req.num_computed_tokens
                if loaded:
                    computed, num_computed, boundary = mgr.empty_kv_cache_blocks, 0, 0
                else:
                    t0 = clock()
                    computed, num_computed, boundary = mgr.get_computed_blocks(req)
                    spent += clock() - t0
                    calls += 1
                    req.shared_prefix_boundary = boundary
                out.prefix_hit_tokens += num_computed
                if num_computed and running:
                    in_use = {
                        b.block_id for g in computed.blocks for b in g if b.ref_cnt > 0
                    }
                    out.hits_on_blocks_in_use += bool(in_use)
                if record:
                    trace.append(
                        (
                            "hit",
                            step,
                            req.request_id,
                            num_computed,
                            boundary,
                            _ids(computed),
                        )
                    )
                ext = 0 if loaded else _external_hit(w, req, num_computed, store)
                load_async = False
                if ext:
                    loads += 1
                    load_async = loads % w.async_load_every == 0
                start = loaded + num_computed + ext
                num_new = 0 if load_async else min(req.num_tokens - start, budget)
                if split is not None:
                    num_new = split(req, num_new, num_computed, 0)
                    if num_new == 0:
                        break
                if not load_async:
                    num_new = _reserve_prefill_lookahead(w, req, start, num_new)
                    if num_new == 0:
                        break
                t0 = clock()
                new_blocks = mgr.allocate_slots(
                    req,
                    num_new,
                    num_new_computed_tokens=num_computed,
                    new_computed_blocks=computed,
                    # (an asynchronous load: its lookahead slots come later)
                    num_lookahead_tokens=0 if load_async else w.num_lookahead_tokens,
                    num_external_computed_tokens=ext,
                    delay_cache_blocks=load_async,
                    # (the encoder input is scheduled with the chunk from token 0)
                    num_encoder_tokens=req._kvpool_encoder_tokens if start == 0 else 0,
                    full_sequence_must_fit=True,
                    reserved_blocks=0,
                    has_scheduled_reqs=bool(running),
                    # 0.32 on: the group an asynchronous load writes
                    **accepted(
                        type(mgr).allocate_slots,
                        skip_zeroing_group_ids=(0,) if load_async else (),
                    ),
                )
                spent += clock() - t0
                calls += 1
                if record:
                    trace.append(
                        ("alloc", step, req.request_id, num_new, _ids(new_blocks))
                    )
                    if ext:
                        trace.append(("external", step, req.request_id, ext, load_async))
                if new_blocks is None:
                    break
                out.external_tokens += ext
                if not loaded:
                    t0 = clock()
                    record_prefix_cache_stats(req, num_computed)
                    spent += clock() - t0
                    calls += 1
                t0 = clock()
                admitted_blocks = mgr.get_blocks(req.request_id)
                spent += clock() - t0
                calls += 1
                if record:
                    trace.append(("blocks", step, req.request_id, _ids(admitted_blocks)))
                waiting.popleft()
                req.num_computed_tokens = start
                if load_async:
                    # WAITING_FOR_REMOTE_KVS until the load is done.
                    out.async_loads += 1
                    req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    loading.append((step + w.load_steps, out.async_loads, req, num_computed))
                    continue
                running.append(req)
                req.status = RUNNING
                scheduled.append((req, num_new))
                budget -= num_new
                if ext and w.failed_load_every and loads % w.failed_load_every == 1:
                    # This synchronous load will fail halfway (step 4).
                    failing[req.request_id] = num_computed

            # 3. End of schedule(): the per-step drains.
            t0 = clock()
            offloads = take_boundary_state_offloads()
            copies, retained = mgr.take_kv_cache_block_copies()
            if copies:
                mgr.block_pool.free_blocks(retained)
            zero_ids = mgr.take_new_block_ids()
            spent += clock() - t0
            calls += 3 + bool(copies)
            out.cow_copies += len(copies)
            if record:
                trace.append(
                    (
                        "drain",
                        step,
                        tuple((c.src_block_id, c.dst_block_id) for c in copies),
                        tuple(b.block_id for b in retained),
                        tuple(zero_ids),
                        tuple(sorted(offloads.items())),
                    )
                )
                if align_managers:
                    trace.append(("mamba", step, _align_tables(align_managers)))
            for req, num_new in scheduled:
                req.num_computed_tokens += num_new
                req.num_in_flight_tokens += num_new
                req.is_prefill_chunk = req.num_computed_tokens < req.num_tokens

            # 4. update_from_output: the "model" ran; emit tokens, finish.
            # A failed synchronous load first (the scheduler's
            # _update_requests_with_invalid_blocks): its blocks from halfway
            # through the external tokens are evicted, it recomputes from
            # there, and its output of this step is dropped.
            dropped = set()
            for req, num_new in scheduled:
                local = failing.pop(req.request_id, None)
                if local is None:
                    continue
                t0 = clock()
                req.num_computed_tokens = _fail_load(
                    w, mgr, req, local, req.num_computed_tokens - num_new)
                spent += clock() - t0
                calls += 2
                dropped.add(req.request_id)
                out.failed_loads += 1
                if record:
                    trace.append(("load-failed", step, req.request_id, req.num_computed_tokens))
            finished = []
            for req, num_new in scheduled:
                req.num_in_flight_tokens -= num_new
                if req.request_id in dropped:
                    continue
                if req.num_computed_tokens >= req.num_tokens:
                    outputs = req._kvpool_outputs
                    # The drafts scheduled: accepted until the first
                    # rejection, the rest rolled back; the accepted ones and
                    # the bonus token emitted (up to the request's length).
                    num_drafts = drafts.get(req.request_id, 0)
                    num_accepted = 0
                    while num_accepted < num_drafts and spec_rng.random() < w.accept_rate:
                        num_accepted += 1
                    req.num_computed_tokens -= num_drafts - num_accepted
                    out.draft_tokens += num_drafts
                    out.rejected_tokens += num_drafts - num_accepted
                    req.append_output_token_ids(outputs[req.num_output_tokens])
                    for _ in range(num_accepted):
                        if req.num_output_tokens >= len(outputs):
                            break
                        req.append_output_token_ids(outputs[req.num_output_tokens])
                    if getattr(w, "spec_tokens", 0) and req.num_output_tokens < len(outputs):
                        # update_draft_token_ids: the next step's drafts.
                        req.spec_token_ids = [
                            spec_rng.randrange(1, 30000) for _ in range(w.spec_tokens)
                        ]
                    if req.prefill_stats is not None:
                        req.prefill_stats = None
                        t0 = clock()
                        cached = mgr.estimate_cached_tokens(req)
                        spent += clock() - t0
                        calls += 1
                        if record:
                            trace.append(("cached", step, req.request_id, cached))
                    if req.num_output_tokens >= len(outputs):
                        finished.append(req)
            for req in finished:
                running.remove(req)
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                if getattr(w, "connector", False):
                    # The connector saved its prompt's full blocks.
                    store.update(req.block_hashes[: req.num_prompt_tokens // w.hash_block_size])
                # As the scheduler does before it hands a finished request's
                # table to a connector.
                t0 = clock()
                mgr.remove_skipped_blocks(
                    request_id=req.request_id,
                    processed_computed_tokens=max(
                        0, req.num_computed_tokens - req.num_in_flight_tokens
                    ),
                    num_prompt_tokens=req.num_prompt_tokens,
                )
                final_ids = mgr.get_block_ids(req.request_id)
                spent += clock() - t0
                calls += 2
                if record:
                    trace.append(("final", step, req.request_id, final_ids))
                t0 = clock()
                mgr.free(req)
                spent += clock() - t0
                calls += 1
                out.finished += 1
                if record:
                    trace.append(("free", step, req.request_id))

            # 5. Occasional cache maintenance; 6. what the engine publishes.
            dt, n = _v15.end_of_step(w, mgr, step, rng, running, out, record, encoder)
            spent += dt
            calls += n

    out.wall_seconds = clock() - wall0
    out.manager_seconds = spent
    out.manager_calls = calls
    out.steps = step
    return out


def _reserve_prefill_lookahead(
    w: _v15.Workload, req: Request, num_computed: int, num_new: int
) -> int:
    """``Scheduler._reserve_prefill_lookahead``: multi-module MTP never ends a
    prefill chunk within its prefill lookahead of the prefill end."""
    lookahead = getattr(w, "num_prefill_lookahead", 0)
    remaining = req.num_tokens - num_computed - num_new
    if 0 < remaining < lookahead:
        num_new -= lookahead - remaining
    return max(num_new, 0)


def _fail_load(w: _v15.Workload, mgr: KVCacheManager, req: Request, local: int,
               external_end: int) -> int:
    """A KV load that failed halfway through the external tokens (those
    from ``local`` to ``external_end``): the request's blocks from there on
    are evicted (``get_block_ids``, ``evict_blocks``); the tokens still
    valid, the block-aligned start of the failure."""
    bs = w.hash_block_size
    first = (local + (external_end - local) // 2) // bs
    ids = mgr.get_block_ids(req.request_id)[0]
    mgr.evict_blocks(set(ids[first : external_end // bs]))
    return first * bs


def _external_hit(w: _v15.Workload, req: Request, num_local: int, store: set) -> int:
    """The connector's matched tokens past a local hit: the stored blocks
    that follow it, up to the last prompt token (computed for its logits);
    for a third of the prompts all of them but the last token (a remote
    prefill's hit, which ends inside a block)."""
    if not getattr(w, "connector", False):
        return 0
    bs = w.hash_block_size
    hashes = req.block_hashes
    first = num_local // bs
    last = min((req.num_tokens - 1) // bs, len(hashes))
    k = first
    while k < last and hashes[k] in store:
        k += 1
    if k == last > first and req.num_prompt_tokens % 3 == 0:
        # A remote prefill's (P/D disaggregation): every prompt token but
        # the last, the partial block included.
        return req.num_tokens - 1 - num_local
    return (k - first) * bs


def _schedule_drafts(req: Request, num_new: int, drafts: dict[str, int]) -> None:
    """The scheduler's speculative-decode bookkeeping of a scheduled request:
    the drafts that fit in ``num_new`` are scheduled, the request's list is
    cleared (the drafter sets the next one)."""
    if req.spec_token_ids:
        num_spec = num_new + req.num_computed_tokens - req.num_tokens
        if num_spec > 0:
            drafts[req.request_id] = min(num_spec, len(req.spec_token_ids))
        req.spec_token_ids = []


def _port(w: _v15.Workload, **changes: Any) -> Workload:
    fields = {f.name: getattr(w, f.name) for f in dataclasses.fields(w)}
    return Workload(**{**fields, **changes})


# The configurations the tests and the benchmark share: the 0.15 driver's.
FULL = _port(_v15.FULL)
HYBRID = _port(_v15.HYBRID)
MIXED_BLOCK_SIZES = _port(_v15.MIXED_BLOCK_SIZES)
PREFILL_HEAVY = _port(_v15.PREFILL_HEAVY)
