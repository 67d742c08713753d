"""A hypothesis state machine that drives two vLLM ``KVCacheManager``s side by
side with the same random operation sequence: vLLM's own manager over vLLM's
own ``BlockPool`` (the reference) and kvpool's manager of a line (vLLM's class
with compiled ``allocate_slots`` / ``cache_blocks``,
``kvpool.v0_33.kv_cache_manager``) over kvpool's pool of that line, on a core
drawn per example. Shared by ``tests/vllm33/test_manager_stateful.py`` (vLLM
0.33) and ``tests/vllm_release_mgr/test_release_manager_stateful.py`` (each
release with a kvpool manager, in the overlay environment). Imports vLLM.

Configurations. Per machine (``machine_for``), so that each gets its share
of the examples: the layout (``LAYOUTS``: one full-attention group of block 4
or 16; full attention + sliding window with equal block sizes, 4/4 and
16/16; a sliding window alone, block 4; with a full-attention block larger
than the hash block, 8 + 4 over hash 4 and 32 + 16 over hash 16, whose
prompt tails are cached as partial blocks; R-SWA alone, block 4, window 4,
whose decodes free the blocks between prompt and window; full attention +
chunked local attention, block 4, chunks of 8; full/4, full/4 + sliding/4 and
sliding/4 again under EAGLE, whose prefix-cache lookups drop the last hit
block; Mamba hybrids in mamba_cache_mode "align", prefix caching on only:
state blocks of 8 over hash blocks of 4, Qwen3-Next's three Mamba groups, a
state block of the hash block beside full attention of two, EAGLE with
speculative blocks, each with prefill-checkpoint blocks from 0.30 on, their
prefill chunks clipped by the scheduler's own
``_mamba_block_aligned_split`` and their drafts and lookahead held to the
speculative blocks; 0.30 and 0.31's mode "all", with MTP too) and prefix
caching on or off. Per example: KV events on or off;
vLLM's metrics collector off, sampling half or every block (the global RNG
it samples with is seeded the same before each side's call); an admission
watermark or none; a mixed-precision cache (vLLM then records new blocks for
zeroing, ``take_new_block_ids``); a tight ``max_model_len`` or not; pools of
10 to 48 blocks; with an align group, the states kept (every one, those a
later request can resume at, or one per 16 tokens as well);
``max_in_flight_tokens`` 16, 64 or 2048 (the sliding window's admission
cap).

Operations, the way vLLM's scheduler makes them, in one weighted rule
(``ManagerMachine.OPS``; one that does not apply runs another,
``INSTEAD``): requests over a few shared prompt prefixes with tokens from a
small alphabet (exact repeats too, LoRA adapters,
``kv_cache_report_mode="full"``), hashed by vLLM's own request block hasher;
admitting a waiting or preempted request (``get_computed_blocks`` and
``allocate_slots`` with the hit, or without a lookup; any chunk, 0 with a
hit; ``full_sequence_must_fit``, ``has_scheduled_reqs``, lookahead tokens,
``delay_cache_blocks``, ``reserved_blocks``); a running request's next chunk
or decode token with draft tokens and lookahead, also while an earlier step
is in flight (async scheduling), and with the token count as a ``bool`` or
an ``int`` subclass (the compiled path hands those to vLLM's code); the
model's output (in-flight tokens settle, rejected drafts roll the computed
tokens back, tokens appended through ``append_output_token_ids``, then
``cache_blocks`` as 0.33's ``update_from_output`` calls it, and after a
delayed-caching step as when a KV load finishes); ``cache_blocks`` of any
count; ``free``; preemption (``Scheduler._preempt_request``); the end of a
step (``take_boundary_state_offloads``, ``take_kv_cache_block_copies`` and
the copied blocks freed, ``take_new_block_ids``,
``take_events``, ``make_prefix_cache_stats``, ``new_step_starts``);
``evict_blocks``; ``reset_prefix_cache``; ``get_blocks``,
``get_block_ids``, ``estimate_cached_tokens``,
``get_num_common_prefix_blocks``; and a call vLLM refuses
(``allocate_slots(request, 0)`` with nothing to adopt: a ``ValueError`` on
both sides, and neither changed).

After every step the two sides must agree: every call's result (block ids
per group, or ``None``, or the exception's type), each request's blocks per
group, each single-type manager's ``req_to_blocks`` (empty entries too),
``num_cached_block``, partial-hit entries and recorded new block ids (an
align group's state, checkpoint and tail tables too); the
pools' whole observable state (``_release_driver.pool_state``: every block's
fields, the free queue's order and links, the hash map and secondary keys,
free count, usage, the metrics collector's sampled blocks, access and
eviction counts, not its timestamps); the queued KV events (msgpack bytes
of vLLM's own event structs; they carry no timestamps); the prefix-cache
stats; and kvpool's pool keeps its own invariants
(``_release_driver.check_invariants``). A failure prints the operations and
every drawn argument, by name.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

import msgspec
import vllm_workload33 as vw
from _release_driver import Features, check_invariants, pool_state
from _vllm_helpers import pool_in_vllm
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from vllm.lora.request import LoRARequest
from vllm.distributed import kv_events as vllm_kv_events
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_coordinator
from vllm.v1.core.kv_cache_manager import KVCacheManager as VLLMKVCacheManager
from vllm.v1.request import Request, RequestStatus
from vllm_workload import _ids, _stats_tuple

__all__ = [
    "BROKEN",
    "CASES",
    "LAYOUTS",
    "MISMATCH",
    "ManagerMachine",
    "assert_served",
    "broken_machine_settings",
    "delays_caching",
    "machine_for",
    "run_until_served",
    "skips_caching",
    "unserved",
]

#: What the loaded release's pool has (``_release_driver.Features``).
FEATURES = Features.detect(vllm_block_pool.BlockPool, vllm_kv_events.BlockStored)

G = vw.Group

#: name: (groups, hash block size)
LAYOUTS: dict[str, tuple[tuple[vw.Group, ...], int]] = {
    "full/4": ((G("full", 4),), 4),
    "full/16": ((G("full", 16),), 16),
    "full/4+sliding/4": ((G("full", 4), G("sliding", 4, sliding_window=10)), 4),
    "full/16+sliding/16": ((G("full", 16), G("sliding", 16, sliding_window=40)), 16),
    "sliding/4": ((G("sliding", 4, sliding_window=10),), 4),
    "full/8+sliding/4": ((G("full", 8), G("sliding", 4, sliding_window=10)), 4),
    "full/32+sliding/16": ((G("full", 32), G("sliding", 16, sliding_window=48)), 16),
    # R-SWA: full attention freeing the blocks between the prompt and the
    # last 4 processed tokens.
    "rswa/4": ((G("rswa", 4, sliding_window=4),), 4),
    # Chunked local attention beside full attention (Llama 4), chunks of 8.
    "full/4+chunked/4": ((G("full", 4), G("chunked", 4, sliding_window=8)), 4),
    # An encoder-decoder model: full attention + cross-attention over each
    # request's encoder tokens (``ManagerMachine.encoder_tokens``), prefix
    # caching off (as vLLM runs it: ``CASES``).
    "full/4+cross/4": ((G("full", 4), G("cross", 4)), 4),
    # A Mamba hybrid with prefix caching off (mamba_cache_mode "none"): the
    # state's blocks behind the last token freed (blocks of 8 here, the
    # model's length in vLLM's sizing), with 2 speculative blocks (MTP).
    "full/4+mamba/8": ((G("full", 4), G("mamba", 8, mamba_mode="none")), 4),
    "full/4+mamba/8+spec": (
        (G("full", 4), G("mamba", 8, mamba_mode="none", speculative_blocks=2)), 4),
    # A compressor's circular buffer beside full attention: one ring block
    # a request.
    "full/4+ring/8": ((G("full", 4), G("ring", 8)), 4),
    # ... and beside full attention and a sliding window, a ring of the
    # hash block: the simple hybrid's lookup, the ring left out.
    "full/4+sliding/4+ring/4": (
        (G("full", 4), G("sliding", 4, sliding_window=10), G("ring", 4)), 4),
}
# The same under EAGLE (use_eagle: the lookups drop the last hit block).
LAYOUTS.update({
    f"{name}+eagle": LAYOUTS[name]
    for name in ("full/4", "full/4+sliding/4", "sliding/4", "full/4+sliding/4+ring/4")
})
# Mamba hybrids with prefix caching on, mamba_cache_mode "align" (issue 52):
# a state block of 8 over hash blocks of 4 (partial hash hits, their
# copy-on-write), with prefill-checkpoint blocks where the release's
# MambaSpec has them (0.30 on), Qwen3-Next's three Mamba groups of one spec,
# a state block of the hash block beside full attention of two, and under
# EAGLE with speculative blocks. Chunks are clipped by the scheduler's own
# ``_mamba_block_aligned_split`` (``ManagerMachine.split``).
_CKPT = {"checkpoint_blocks": 1, "checkpoint_alignment": 4} if vw.MAMBA_CHECKPOINTS else {}
LAYOUTS.update({
    "full/4+mamba/8-align": ((G("full", 4), G("mamba", 8, **_CKPT)), 4),
    "full/4+3mamba/8-align": (
        (G("full", 4), G("mamba", 8, **_CKPT), G("mamba", 8, **_CKPT), G("mamba", 8, **_CKPT)), 4),
    "full/8+mamba/4-align": ((G("full", 8), G("mamba", 4, **_CKPT)), 4),
    "full/4+mamba/8-align+eagle": (
        (G("full", 4), G("mamba", 8, speculative_blocks=2, **_CKPT)), 4),
})
if vw.MAMBA_MODE_ALL:
    # (0.30, 0.31) The deprecated mode "all": every Mamba block of the
    # attention block a cached state; with MTP's speculative blocks too.
    LAYOUTS.update({
        "full/4+mamba/4-all": ((G("full", 4), G("mamba", 4, mamba_mode="all")), 4),
        "full/4+mamba/4-all+spec": (
            (G("full", 4), G("mamba", 4, mamba_mode="all", speculative_blocks=2)), 4),
    })


def has_cross(layout: str) -> bool:
    """Whether ``layout`` has a cross-attention group."""
    return any(g.kind == "cross" for g in LAYOUTS[layout][0])


@functools.cache
def _takes_prefill_end(coordinator_cls: type) -> bool:
    """Whether the coordinator's ``get_num_blocks_to_allocate`` takes the
    prompt's end (0.31 on, for Mamba groups)."""
    return "prefill_end" in inspect.signature(
        coordinator_cls.get_num_blocks_to_allocate).parameters


def mamba_groups(layout: str) -> list[vw.Group]:
    """``layout``'s Mamba groups."""
    return [g for g in LAYOUTS[layout][0] if g.kind == "mamba"]


def caching_only(layout: str) -> bool:
    """Whether vLLM runs ``layout`` only with prefix caching (a Mamba group
    in mamba_cache_mode "align" or "all")."""
    return any(g.mamba_mode != "none" for g in mamba_groups(layout))


def speculative_blocks(layout: str) -> int | None:
    """How many drafts and lookahead tokens a step of ``layout`` may carry:
    a Mamba group's speculative blocks if it caches its state (None: no
    limit)."""
    if not caching_only(layout):
        return None
    return min(g.speculative_blocks for g in mamba_groups(layout))


def no_caching_only(layout: str) -> bool:
    """Whether vLLM runs ``layout`` only without prefix caching (a
    cross-attention group: its manager's ``cache_blocks`` raises; a Mamba
    group in mamba_cache_mode "none")."""
    return has_cross(layout) or any(
        g.kind == "mamba" and g.mamba_mode == "none" for g in LAYOUTS[layout][0])


#: The (layout, prefix caching) pairs the state-machine tests run.
CASES = [
    (layout, caching)
    for layout in LAYOUTS
    for caching in (True, False)
    if not (caching and no_caching_only(layout)) and not (not caching and caching_only(layout))
]

LORAS = (
    LoRARequest("adapter-0", 1, "/nonexistent/adapter-0"),
    LoRARequest("adapter-1", 2, "/nonexistent/adapter-1"),
)

#: What a difference between the two sides fails the machine with.
MISMATCH = "the managers differ|vLLM's manager"

ALPHABET = st.integers(0, 3)
MAX_LIVE = 6  # requests waiting or running at once
PICK = st.integers(0, 1 << 16)  # which candidate, modulo their number
FEW = st.sampled_from([0, 0, 0, 1, 5])  # lookahead tokens
SOMETIMES = st.sampled_from([False, False, False, True])
RESERVED = st.sampled_from([0, 0, 0, 2])
ACCEPTED = st.integers(0, 3)  # draft tokens accepted
SAMPLED = st.lists(ALPHABET, min_size=4, max_size=4)  # tokens the model emits


class Count(int):
    """A token count that is an ``int`` but not exactly one: kvpool's
    compiled paths hand such a call to vLLM's code. (NumPy integers are not
    used: kvpool's pool refuses them where vLLM's takes them, a deliberate
    difference of the pool's, not the manager's.)"""


@dataclasses.dataclass(frozen=True)
class Refused:
    """A call both sides refused, with the exception type's name."""

    exception: str


@dataclasses.dataclass
class Side:
    label: str
    manager: Any


@dataclasses.dataclass
class Twin:
    """One request of the workload: the same ``Request`` on each side (it
    carries scheduling state, so each side has its own)."""

    rid: str
    reqs: list[Request]
    state: str = "waiting"  # "waiting", "running" or "done"
    # Steps in flight, oldest first: (tokens scheduled, draft tokens among
    # them, computed tokens once scheduled, whether caching was delayed).
    steps: list[tuple[int, int, int, bool]] = dataclasses.field(default_factory=list)

    @property
    def ref(self) -> Request:
        return self.reqs[0]

    def set(self, **values: Any) -> None:
        for req in self.reqs:
            for name, value in values.items():
                setattr(req, name, value)

    def add(self, **deltas: int) -> None:
        for req in self.reqs:
            for name, delta in deltas.items():
                setattr(req, name, getattr(req, name) + delta)


def _block_ids(blocks: Any) -> Any:
    return None if blocks is None else [b.block_id for b in blocks]


def snapshot(side: Side, rids: list[str]) -> dict[str, Any]:
    """What the scheduler, a connector or a test could read of a manager and
    its pool (reads only: vLLM's ``req_to_blocks`` are defaultdicts)."""
    mgr = side.manager
    coordinator = mgr.coordinator
    pool = mgr.block_pool
    state: dict[str, Any] = {
        "get_blocks": {
            rid: [_block_ids(g) for g in coordinator.get_blocks(rid)] for rid in rids
        }
    }
    for g, stm in enumerate(coordinator.single_type_managers):
        state[f"group {g} req_to_blocks"] = {
            rid: _block_ids(blocks) for rid, blocks in stm.req_to_blocks.items()
        }
        state[f"group {g} num_cached_block"] = dict(stm.num_cached_block)
        state[f"group {g} partial hits"] = sorted(getattr(stm, "_partial_hit_reqs", ()))
        state[f"group {g} new_block_ids"] = list(stm.new_block_ids)
        if getattr(stm, "mamba_cache_mode", None) == "align":
            # (the state blocks, checkpoints and partial tails it tracks)
            state[f"group {g} align tables"] = vw._align_tables([stm])
    state.update(
        (f"pool {key}", value)
        for key, value in pool_state(pool, mgr.metrics_collector, FEATURES).items()
    )
    state["usage"] = mgr.usage
    state["queued events"] = [msgspec.msgpack.encode(e) for e in pool.kv_event_queue]
    stats = mgr.prefix_cache_stats
    state["prefix cache stats"] = None if stats is None else _stats_tuple(stats)
    return state


def _differences(a: dict[str, Any], b: dict[str, Any]) -> str:
    return "\n".join(
        f"  {key}:\n    vLLM:   {a.get(key)!r}\n    kvpool: {b.get(key)!r}"
        for key in a
        if a.get(key) != b.get(key)
    )


class ManagerMachine(RuleBasedStateMachine):
    """Set by ``machine_for``: the layout (a ``LAYOUTS`` name) and prefix
    caching, fixed per machine so that every configuration gets its share of
    the examples; the kvpool cores to draw from, kvpool's manager class, the
    pool class over a core, whether ``cache_blocks`` may be given more tokens
    than the request has hashed (0.33: a group stops at the hashed tokens,
    since its scheduler calls ``cache_blocks`` after a step's output with
    placeholders or drafts, which the machine then does too), and the run's
    totals of the compiled paths' counts."""

    layout: str = "full/4"
    caching: bool = True
    cores: tuple[ModuleType, ...] = ()
    manager_class: type = VLLMKVCacheManager
    pool_class: Callable[[ModuleType], type] = staticmethod(lambda core: vllm_block_pool.BlockPool)
    cache_beyond_hashes: bool = False
    totals: collections.Counter = collections.Counter()

    def __init__(self) -> None:
        super().__init__()
        self.sides: list[Side] = []
        self.twins: list[Twin] = []
        self.prompts: list[list[int]] = []
        self.seed = 0

    # -- the two managers ---------------------------------------------------

    @initialize(data=st.data())
    def build(self, data: st.DataObject) -> None:
        draw = data.draw
        layout = self.layout
        groups, hash_block_size = LAYOUTS[layout]
        if len(groups) > 1 and draw(st.booleans(), label="mixed precision"):
            groups = (groups[0], dataclasses.replace(groups[1], dtype="bfloat16"))
        largest = max(g.block_size for g in groups)
        self.max_prompt = 6 * largest
        core = draw(st.sampled_from(self.cores), label="core")
        w = vw.Workload(
            name=layout,
            groups=groups,
            hash_block_size=hash_block_size,
            num_blocks=draw(st.sampled_from([10, 16, 24, 48]), label="num_blocks"),
            max_model_len=draw(st.sampled_from([8 * largest, 4096]), label="max_model_len"),
            token_budget=draw(st.sampled_from([16, 64, 2048]), label="max_in_flight_tokens"),
            enable_caching=self.caching,
            enable_events=draw(st.booleans(), label="KV events"),
            metrics_sample_rate=draw(st.sampled_from([None, 0.5, 1.0]), label="metrics"),
            watermark=draw(st.sampled_from([0.0, 0.0, 0.1]), label="watermark"),
            # EAGLE: the lookups drop the last hit block (a window's needs
            # one more contiguous block first).
            eagle=layout.endswith("+eagle"),
        )
        if caching_only(layout):
            # Which states the caching step keeps (0.30 on): None, every one;
            # 0, those a later request can resume at; 16, one per 16 tokens
            # as well.
            w = w.scaled(retention_interval=draw(
                st.sampled_from([None, 0, 16]), label="retention interval"))
        self.w = w
        self.hasher = vw.request_block_hasher(w)
        # A few shared prompt prefixes, up to four of the largest blocks (their
        # tokens from a seed: hypothesis draws short lists, and hits need
        # whole blocks).
        rng = random.Random(draw(st.integers(0, 1 << 16), label="prefix seed"))
        self.prefixes = [
            [rng.randrange(4) for _ in range(n)]
            for n in draw(
                st.lists(st.integers(1, 4 * largest), min_size=1, max_size=3),
                label="prefix lengths",
            )
        ]
        assert kv_cache_coordinator.BlockPool is vllm_block_pool.BlockPool
        random.seed(0)
        reference = vw.make_manager(w, VLLMKVCacheManager)
        pool_class = self.pool_class(core)
        with pool_in_vllm(pool_class):
            random.seed(0)
            candidate = vw.make_manager(w, self.manager_class)
        assert type(candidate.block_pool) is pool_class
        assert candidate.kvpool_fallback_reason is None, candidate.kvpool_fallback_reason
        self.sides = [Side("vLLM", reference), Side(f"kvpool ({core.__name__})", candidate)]
        # The scheduler's own clipping of prefill chunks with an align group.
        self.split = vw._mamba_split(w, reference)
        self.partial_hits = bool(getattr(reference.coordinator, "enable_partial_hash_hits", False))

    def teardown(self) -> None:
        if len(self.sides) == 2:
            self.totals.update(self.sides[1].manager._kvpool_plan.counts)

    # -- calling both sides -------------------------------------------------

    def both(
        self,
        op: str,
        call: Callable[[Any, Request | None], Any],
        twin: Twin | None = None,
        refused: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """``call(manager, request)`` on each side, the global RNG (vLLM's
        metrics collector samples with it) seeded the same for each; the
        outcomes (a value, or the exception type for the types in
        ``refused``) must be equal. Returns the value (a ``Refused`` for an
        exception)."""
        self.seed += 1
        outcomes = []
        for i, side in enumerate(self.sides):
            random.seed(self.seed)
            try:
                outcome = ("returned", call(side.manager, twin.reqs[i] if twin else None))
            except refused as exc:
                outcome = ("raised", type(exc).__name__)
            outcomes.append(outcome)
        if outcomes[0] != outcomes[1]:
            raise AssertionError(
                f"{op}: vLLM's manager {outcomes[0]!r}, "
                f"kvpool's {self.sides[1].label} {outcomes[1]!r}"
            )
        return outcomes[0][1] if outcomes[0][0] == "returned" else Refused(outcomes[0][1])

    def _rids(self) -> list[str]:
        return [t.rid for t in self.twins]

    @invariant()
    def same_state(self) -> None:
        if not self.sides:
            return
        rids = self._rids()
        a, b = (snapshot(side, rids) for side in self.sides)
        if a != b:
            raise AssertionError(
                f"the managers differ ({self.w.name}, {self.sides[1].label}):\n"
                + _differences(a, b)
            )
        check_invariants(self.sides[1].manager.block_pool, FEATURES)

    # -- the operations ------------------------------------------------------

    # name: (weight, its arguments' strategies, whether it applies now)
    OPS: dict[str, tuple[int, dict[str, st.SearchStrategy], Callable[[Any], Any]]] = {
        "add_request": (
            3,
            dict(
                prefix=st.integers(0, 2),
                cut=st.none() | st.integers(0, 1 << 10),  # None: the whole prefix
                suffix=st.lists(ALPHABET, max_size=24),
                repeat=st.integers(0, 4),
                lora=st.sampled_from([None, None, None, 0, 1]),
                report_full=st.booleans(),
            ),
            lambda self: len(self._live()) < MAX_LIVE,
        ),
        "admit": (
            4,
            dict(
                pick=PICK,
                lookup=st.sampled_from([True, True, True, False]),
                chunk=st.integers(0, 256),
                lookahead=FEW,
                must_fit=st.booleans(),
                has_scheduled=st.booleans(),
                delay=SOMETIMES,
                reserved=RESERVED,
            ),
            lambda self: self._live("waiting"),
        ),
        "schedule_running": (
            8,
            dict(
                pick=PICK,
                chunk=st.integers(1, 64),
                drafts=st.sampled_from([0, 0, 0, 1, 3]),
                lookahead=FEW,
                delay=SOMETIMES,
                reserved=RESERVED,
                overlap=SOMETIMES,
                as_type=st.sampled_from(["int"] * 8 + ["bool", "subclass"]),
                accepted=ACCEPTED,
                tokens=SAMPLED,
            ),
            lambda self: self._live("running"),
        ),
        "model_output": (
            2,
            dict(pick=PICK, accepted=ACCEPTED, tokens=SAMPLED),
            lambda self: any(t.steps for t in self._live("running")),
        ),
        "cache_blocks": (
            3,
            dict(
                pick=PICK,
                upto=st.none() | st.integers(0, 1 << 10),  # None: the computed tokens
                as_subclass=st.sampled_from([False] * 5 + [True]),
            ),
            # (not with a Mamba state group: its scheduler caches only from
            # allocate_slots and after a KV load, a connector's)
            lambda self: self._live("running") and not caching_only(self.layout),
        ),
        "free": (1, dict(pick=PICK), lambda self: self._live()),
        "preempt": (
            1,
            dict(pick=PICK),
            lambda self: any(not t.steps for t in self._live("running")),
        ),
        "end_of_step": (
            2,
            dict(take_events=st.booleans(), stats=st.booleans()),
            lambda self: True,
        ),
        "cache_maintenance": (
            1,
            dict(
                reset=st.sampled_from([False, False, True]),
                ids=st.sets(st.integers(0, 47), max_size=6),
            ),
            lambda self: True,
        ),
        "read_request": (1, dict(pick=PICK), lambda self: self.twins),
        "nothing_to_adopt": (1, dict(pick=PICK), lambda self: self._live()),
        "count_blocks": (
            1,
            dict(pick=PICK, ahead=st.integers(0, 96), encoder=st.booleans(), cap=st.booleans()),
            lambda self: self._live(),
        ),
    }
    # One rule, so that the weights hold (hypothesis picks among rules
    # evenly, and disables some of them per example).
    WEIGHTED = [name for name, (weight, _, _) in OPS.items() for _ in range(weight)]
    # What runs instead of an operation that does not apply now (no request
    # running, too many live, ...), so that the steps keep the workload moving.
    INSTEAD = {
        "add_request": "free",
        "admit": "add_request",
        "schedule_running": "admit",
        "model_output": "schedule_running",
        "cache_blocks": "admit",
        "preempt": "free",
        "free": "add_request",
        "read_request": "add_request",
        "nothing_to_adopt": "add_request",
        "count_blocks": "add_request",
    }

    @rule(op=st.sampled_from(WEIGHTED), data=st.data())
    def step(self, op: str, data: st.DataObject) -> None:
        tried = set()
        while not self.OPS[op][2](self):
            tried.add(op)
            op = self.INSTEAD[op]
            if op in tried:
                return
        args = self.OPS[op][1]
        getattr(self, op)(
            **{name: data.draw(strategy, label=f"{op} {name}") for name, strategy in args.items()}
        )

    # -- requests -----------------------------------------------------------

    def _live(self, state: str | None = None) -> list[Twin]:
        return [t for t in self.twins if t.state == state or (state is None and t.state != "done")]

    def _pick(self, twins: list[Twin], pick: int) -> Twin:
        return twins[pick % len(twins)]

    def add_request(self, prefix, cut, suffix, repeat, lora, report_full):
        if repeat == 0 and self.prompts:
            prompt = self.prompts[-1]  # a retry: the same prompt again
        else:
            base = self.prefixes[prefix % len(self.prefixes)]
            if cut is not None:
                base = base[: cut % (len(base) + 1)]
            prompt = (base + suffix) or [0]
        prompt = prompt[: min(self.max_prompt, self.w.max_model_len - 1)]
        self.prompts.append(prompt)
        rid = f"req-{len(self.twins)}"
        if self.partial_hits:
            # vLLM's own lookup raises IndexError with KV events on for such
            # a request's partial hash hit (0.30-0.34: the hit's events are
            # read off the hashes at the state block, which the partial
            # block has none of): not drawn.
            report_full = False
        extra = {"kv_cache_report_mode": "full"} if report_full else None
        lora_request = None if lora is None else LORAS[lora]
        reqs = [
            vw.new_request(rid, list(prompt), 1 << 20, self.hasher, lora_request, extra)
            for _ in self.sides
        ]
        self.twins.append(Twin(rid, reqs))

    def admit(self, pick, lookup, chunk, lookahead, must_fit, has_scheduled, delay, reserved):
        """A waiting (or preempted) request: the prefix-cache lookup, then
        ``allocate_slots`` with the hit, as ``Scheduler.schedule`` does.
        Chunk 0 with a hit only adopts the hit (vLLM 0.32 on; 0.30 and 0.31
        refuse it with a ``ValueError``)."""
        twin = self._pick(self._live("waiting"), pick)
        max_model_len = self.w.max_model_len
        lookahead = self._lookahead(lookahead)
        delay = delay and not caching_only(self.layout)
        encoder = self.encoder_tokens(twin)

        def call(mgr, req):
            if lookup:
                computed, hit, boundary = mgr.get_computed_blocks(req)
                req.shared_prefix_boundary = boundary
            else:
                computed, hit, boundary = None, 0, 0
            num_new = min(chunk, req.num_tokens - hit, max_model_len - 1 - hit)
            if self.split is not None and num_new > 0:
                num_new = self.split(req, num_new, hit, 0)
                if num_new <= 0:
                    return None  # the scheduler stops admitting here
            if num_new <= 0 and not hit:
                return None  # nothing to schedule
            new = mgr.allocate_slots(
                req,
                num_new,
                num_new_computed_tokens=hit,
                new_computed_blocks=computed,
                num_lookahead_tokens=lookahead,
                delay_cache_blocks=delay,
                # (the encoder input is scheduled with the chunk from token 0)
                num_encoder_tokens=encoder if req.num_computed_tokens + hit == 0 else 0,
                full_sequence_must_fit=must_fit,
                reserved_blocks=reserved,
                has_scheduled_reqs=has_scheduled,
            )
            if new is not None and hasattr(mgr, "record_prefix_cache_stats"):
                mgr.record_prefix_cache_stats(req, hit)
            return _ids(computed), hit, boundary, num_new, _ids(new)

        out = self.both(
            "get_computed_blocks + allocate_slots",
            call,
            twin,
            refused=(ValueError,) if chunk == 0 else (),
        )
        if out is None or isinstance(out, Refused) or out[4] is None:
            return
        _, hit, _, num_new, _ = out
        twin.state = "running"
        twin.set(status=RequestStatus.RUNNING, num_computed_tokens=hit + num_new)
        twin.add(num_in_flight_tokens=num_new)
        twin.steps.append((num_new, 0, hit + num_new, delay))

    def _lookahead(self, tokens: int) -> int:
        """``tokens`` drafts or lookahead tokens, no more than a Mamba state
        group holds speculative blocks for."""
        limit = speculative_blocks(self.layout)
        return tokens if limit is None else min(tokens, limit)

    def encoder_tokens(self, twin) -> int:
        """A request's encoder tokens: 1-23 by its number, for a layout with
        a cross-attention group, else none."""
        if not has_cross(self.layout):
            return 0
        return 1 + int(twin.rid.split("-")[1]) * 7 % 23

    def schedule_running(
        self, pick, chunk, drafts, lookahead, delay, reserved, overlap, as_type, accepted, tokens
    ):
        """A running request's next prefill chunk or decode token (plus draft
        tokens). Its steps in flight finish first (``model_output``) unless
        ``overlap`` (async scheduling: the computed tokens run ahead of the
        tokens)."""
        twin = self._pick(self._live("running"), pick)
        while twin.steps and not overlap:
            self._finish_step(twin, accepted, tokens)
        req = twin.ref
        computed, num_tokens = req.num_computed_tokens, req.num_tokens
        lookahead = self._lookahead(lookahead)
        delay = delay and not caching_only(self.layout)
        drafts = self._lookahead(drafts)
        if computed < num_tokens:
            num_new = min(chunk, num_tokens - computed)
            if num_new < num_tokens - computed:
                drafts = 0  # drafts follow the last prompt token
        else:
            num_new = 1  # a decode step ahead of its predecessor's output
        num_new += drafts
        num_new = min(num_new, self.w.max_model_len - 1 - computed)
        if self.split is not None and num_new > 0:
            num_new = self.split(req, num_new)
        if num_new <= 0:
            return
        drafts = min(drafts, num_new - 1)
        arg: Any = num_new
        if as_type == "bool" and num_new == 1:
            arg = True
        elif as_type == "subclass":
            arg = Count(num_new)

        def call(mgr, req):
            return _ids(
                mgr.allocate_slots(
                    req,
                    arg,
                    num_lookahead_tokens=lookahead,
                    delay_cache_blocks=delay,
                    reserved_blocks=reserved,
                )
            )

        if self.both("allocate_slots (running)", call, twin) is None:
            return
        twin.add(num_computed_tokens=num_new, num_in_flight_tokens=num_new)
        twin.steps.append((num_new, drafts, computed + num_new, delay))

    def model_output(self, pick, accepted, tokens):
        """The oldest step in flight of a request finished
        (``update_from_output``)."""
        in_flight = [t for t in self._live("running") if t.steps]
        self._finish_step(self._pick(in_flight, pick), accepted, tokens)

    def _finish_step(self, twin: Twin, accepted: int, tokens: list[int]) -> None:
        """The request's oldest step in flight finished: its tokens are no
        longer in flight, rejected drafts roll the computed tokens back (only
        for the request's latest step), a step that reached the end of the
        tokens appends the sampled ones, and a step whose caching was
        delayed (its KV was being loaded) now caches, as the scheduler does
        when a KV connector's load finishes."""
        num_new, drafts, end, delayed = twin.steps.pop(0)
        twin.add(num_in_flight_tokens=-num_new)
        if drafts and not twin.steps:
            rejected = drafts - min(accepted, drafts)
            twin.add(num_computed_tokens=-rejected)
            end -= rejected
        count = end + 1 - twin.ref.num_tokens
        if count > 0:
            for req in twin.reqs:
                req.append_output_token_ids(tokens[:count])
            if self.cache_beyond_hashes and (drafts or twin.steps):
                # vLLM 0.33's update_from_output, with output placeholders
                # (a step still in flight) or draft tokens.
                self.both(
                    "cache_blocks (update_from_output)",
                    lambda mgr, req: mgr.cache_blocks(
                        req, req.num_computed_tokens - req.num_in_flight_tokens
                    ),
                    twin,
                )
        if delayed:
            self.both(
                "cache_blocks (KV load finished)",
                lambda mgr, req: mgr.cache_blocks(req, self._cacheable(req)),
                twin,
            )

    def _cacheable(self, req: Request) -> int:
        """The computed tokens, but no more than the request's tokens before
        0.33 (whose groups stop at the hashed tokens)."""
        if self.cache_beyond_hashes:
            return req.num_computed_tokens
        return min(req.num_computed_tokens, req.num_tokens)

    def cache_blocks(self, pick, upto, as_subclass):
        """``cache_blocks(request, n)``: the computed tokens, as the scheduler
        calls it after an allocation that delayed caching, or fewer (more
        than the request's tokens only where the line stops at the hashed
        tokens)."""
        twin = self._pick(self._live("running"), pick)
        limit = self._cacheable(twin.ref)
        n: Any = limit if upto is None else upto % (limit + 1)
        if as_subclass:
            n = Count(n)
        self.both("cache_blocks", lambda mgr, req: mgr.cache_blocks(req, n), twin)

    def free(self, pick):
        """A request finishes or is aborted (waiting or running)."""
        twin = self._pick(self._live(), pick)
        self.both("free", lambda mgr, req: mgr.free(req), twin)
        twin.state = "done"
        twin.steps.clear()
        twin.set(status=RequestStatus.FINISHED_ABORTED)

    def preempt(self, pick):
        """``Scheduler._preempt_request``: the blocks freed, the request back
        to waiting with no computed tokens."""
        twin = self._pick([t for t in self._live("running") if not t.steps], pick)
        self.both("free (preemption)", lambda mgr, req: mgr.free(req), twin)
        twin.state = "waiting"
        twin.set(status=RequestStatus.PREEMPTED, num_computed_tokens=0, spec_token_ids=[])
        twin.add(num_preemptions=1)

    # -- the rest of the manager's surface -----------------------------------

    def end_of_step(self, take_events, stats):
        """The end of ``schedule()`` (the copy-on-write and new-block drains),
        the engine's ``take_events`` and ``make_prefix_cache_stats``, and the
        next step's start."""

        def call(mgr, _):
            offloads = sorted(mgr.take_boundary_state_offloads().items()) \
                if hasattr(mgr, "take_boundary_state_offloads") else []
            copies, retained = mgr.take_kv_cache_block_copies()
            if copies:
                # (the copy-on-write sources, back to the pool once copied:
                # the scheduler's, without deferred frees)
                mgr.block_pool.free_blocks(retained)
            out: list[Any] = [
                offloads,
                [(c.src_block_id, c.dst_block_id) for c in copies],
                _block_ids(retained),
                list(mgr.take_new_block_ids()),
            ]
            if take_events:
                out.append([msgspec.msgpack.encode(e) for e in mgr.take_events()])
            if stats:
                made = mgr.make_prefix_cache_stats()
                out.append(None if made is None else _stats_tuple(made))
            mgr.new_step_starts()
            return out

        self.both("end of step", call)

    def cache_maintenance(self, reset, ids):
        """``reset_prefix_cache`` (refused while blocks are in use) or
        ``evict_blocks`` (as for blocks whose KV load failed)."""
        if reset:
            self.both("reset_prefix_cache", lambda mgr, _: mgr.reset_prefix_cache())
            return
        ids = {i for i in ids if i < self.w.num_blocks}
        self.both("evict_blocks", lambda mgr, _: mgr.evict_blocks(set(ids)))

    def read_request(self, pick):
        """What the scheduler and the model runner read of a request."""
        twin = self._pick(self.twins, pick)

        def call(mgr, req):
            rid = req.request_id
            return (
                _ids(mgr.get_blocks(rid)),
                tuple(mgr.get_block_ids(rid)),
                mgr.estimate_cached_tokens(req) if hasattr(mgr, "estimate_cached_tokens") else 0,
                # (gone in 0.34: cascade attention was removed)
                tuple(mgr.get_num_common_prefix_blocks(rid))
                if hasattr(mgr, "get_num_common_prefix_blocks") else (),
            )

        self.both("get_blocks / get_block_ids / estimate_cached_tokens", call, twin)

    def count_blocks(self, pick, ahead, encoder, cap):
        """The coordinator's ``get_num_blocks_to_allocate`` asked directly,
        as the scheduler asks it for a request's remaining blocks: each
        group's count, to the block (an allocation refused or admitted
        differently shows a wrong count only at the pool's very border)."""
        twin = self._pick(self._live(), pick)
        enc = self.encoder_tokens(twin) if encoder else 0
        prefill_end = _takes_prefill_end(type(self.sides[0].manager.coordinator))
        if any(g.mamba_mode == "align" for g in mamba_groups(self.layout)):
            # The scheduler asks with the admission cap only; without it an
            # align-mode group records the count's checkpoint, past the
            # request's table, and the next caching step's assertion fails
            # in vLLM's code (vLLM 0.33's _cache_partial_tail_block).
            cap = True

        def call(mgr, req):
            computed = req.num_computed_tokens
            num_tokens = computed + ahead
            extra = {"prefill_end": max(req.num_prompt_tokens, req.num_tokens - 1)} \
                if prefill_end else {}
            return mgr.coordinator.get_num_blocks_to_allocate(
                request_id=req.request_id,
                num_tokens=num_tokens,
                new_computed_blocks=mgr.empty_kv_cache_blocks.blocks,
                num_encoder_tokens=enc,
                total_computed_tokens=computed,
                num_local_computed_tokens=computed,
                num_tokens_main_model=min(num_tokens, self.w.max_model_len),
                apply_admission_cap=cap,
                **extra,
            )

        self.both("coordinator.get_num_blocks_to_allocate", call, twin)

    def nothing_to_adopt(self, pick):
        """``allocate_slots(request, 0)`` with no computed tokens to adopt:
        vLLM raises ``ValueError``; so must kvpool, and neither changes
        anything."""
        twin = self._pick(self._live(), pick)
        rids = self._rids()
        before = [snapshot(side, rids) for side in self.sides]
        out = self.both(
            "allocate_slots(request, 0)",
            lambda mgr, req: mgr.allocate_slots(req, 0),
            twin,
            refused=(ValueError,),
        )
        assert out == Refused("ValueError"), out
        for side, was in zip(self.sides, before):
            now = snapshot(side, rids)
            assert now == was, f"a refused call changed {side.label}:\n{_differences(was, now)}"


def machine_for(
    layout: str,
    caching: bool,
    manager_class: type,
    pool_class: Callable[[ModuleType], type],
    cores: list[ModuleType],
) -> type[ManagerMachine]:
    """A ``ManagerMachine`` of ``layout`` with prefix caching on or off, for
    kvpool's ``manager_class`` over ``pool_class(core)``, ``core`` drawn from
    ``cores``, with its own totals of the compiled paths' counts."""
    return type(
        f"{manager_class.__name__}Machine",
        (ManagerMachine,),
        {
            "layout": layout,
            "caching": caching,
            "cores": tuple(cores),
            "manager_class": manager_class,
            "pool_class": staticmethod(pool_class),
            "cache_beyond_hashes": bool(getattr(manager_class, "_kvpool_cap_at_hashed", False)),
            "totals": collections.Counter(),
        },
    )


# Deliberately broken managers: the machine must fail on each (the proof that
# its comparison is not vacuous). Counted per manager, so that an example
# replays the same way.


def skips_caching(manager_class: type) -> type:
    """``manager_class`` broken in one detail: every 5th ``cache_blocks`` call
    does nothing."""

    class SkipsCaching(manager_class):  # type: ignore[misc, valid-type]
        calls = 0

        def cache_blocks(self, request, num_computed_tokens):
            self.calls += 1
            if self.calls % 5:
                super().cache_blocks(request, num_computed_tokens)

    return SkipsCaching


def delays_caching(manager_class: type) -> type:
    """``manager_class`` broken in one detail: every 3rd ``allocate_slots``
    call leaves its full blocks uncached (as if ``delay_cache_blocks``)."""

    class DelaysCaching(manager_class):  # type: ignore[misc, valid-type]
        calls = 0

        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            self.calls += 1
            if self.calls % 3 == 0:
                kwargs["delay_cache_blocks"] = True
            return super().allocate_slots(request, num_new_tokens, *args, **kwargs)

    return DelaysCaching


def forgets_running(manager_class: type) -> type:
    """``manager_class`` broken in one detail: every 4th ``allocate_slots``
    call leaves the request unmarked in each align-mode Mamba group's
    ``_allocated_block_reqs`` (a running request then taken for a new one:
    its state block and speculative blocks placed as a new request's)."""

    class ForgetsRunning(manager_class):  # type: ignore[misc, valid-type]
        calls = 0

        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            self.calls += 1
            result = super().allocate_slots(request, num_new_tokens, *args, **kwargs)
            if self.calls % 4 == 0:
                for mgr in self.coordinator.single_type_managers:
                    if getattr(mgr, "mamba_cache_mode", None) == "align":
                        mgr._allocated_block_reqs.discard(request.request_id)
            return result

    return ForgetsRunning


#: Each broken manager, and the layout its fault shows in.
BROKEN = {
    "skips-caching": (skips_caching, "full/4"),
    "delays-caching": (delays_caching, "full/4"),
    "forgets-running": (forgets_running, "full/4+mamba/8-align"),
}


def broken_machine_settings(max_examples: int) -> settings:
    """Hypothesis settings for a machine over a broken manager: generation
    only (found, not shrunk), deterministic, the first failure raised as it
    is."""
    return settings(
        settings(),
        max_examples=max_examples,
        phases=[Phase.generate],
        database=None,
        derandomize=True,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )


def unserved(machine: type[ManagerMachine]) -> list[str]:
    """What a run has not exercised yet, of what it must: the
    compiled paths served calls themselves (``fast``) and handed calls to
    vLLM's code (``base``), so both sides of each decision were compared;
    with caching they cached blocks (through vLLM's coordinator, or, for one
    full-attention group, the pool directly), adopted prefix-cache hits, and
    skipped caching where no full-attention block is larger than the hash
    block (such a group may register a partial tail on any call: vLLM's code
    decides)."""
    counts = machine.totals
    missing = [name for name in ("fast", "base") if counts[name] == 0]
    groups, hash_block_size = LAYOUTS[machine.layout]
    modes = {g.mamba_mode for g in mamba_groups(machine.layout)}
    if "align" in modes:
        # Issue 52: lookups, adoptions and caching steps in C, partial hits
        # copied on write where a state block spans hash blocks.
        wanted = ["lookups", "adopt", "mamba_cache"]
        if any(g.block_size > hash_block_size for g in mamba_groups(machine.layout)):
            wanted.append("cow")
        missing += [name for name in wanted if counts[name] == 0]
    elif "all" in modes:
        # (an admission with a hit and every lookup: vLLM's code)
        missing += [name for name in ("mamba_cache",) if counts[name] == 0]
    elif machine.caching:
        if counts["cache_calls"] + counts["cache_direct"] == 0:
            missing.append("cache_calls")
        if counts["adopt"] == 0:
            missing.append("adopt")
        if all(g.block_size == hash_block_size for g in groups if g.kind == "full"):
            if counts["cache_skips"] == 0:
                missing.append("cache_skips")
    return missing


def assert_served(machine: type[ManagerMachine]) -> None:
    """After a run: nothing ``unserved`` names is missing."""
    missing = unserved(machine)
    assert not missing, f"never exercised: {', '.join(missing)}; {machine.totals}"


def run_until_served(machine: type[ManagerMachine], examples: int, rounds: int = 5) -> None:
    """Run the machine for ``examples`` examples, then for twice as many, and
    so on up to ``rounds`` runs, until ``unserved`` names nothing; then
    ``assert_served``. Hypothesis draws partly from the constants of the
    modules imported so far (its local-constants provider reads every module
    outside site-packages, vLLM's source tree among them), so a
    deterministic run's examples change with what else the session
    imported: a fixed example count may miss a rare path in one session and
    hit it in another. Every example of every round is compared as usual.
    Five rounds, as the rarest path needs: CI's session on 0.32 and 0.34
    reached the EAGLE align layout's copy-on-write only after 15, 30 and
    60 examples had missed it."""
    for round_ in range(rounds):
        run_state_machine_as_test(
            machine, settings=settings(settings(), max_examples=examples << round_)
        )
        if not unserved(machine):
            break
    assert_served(machine)
