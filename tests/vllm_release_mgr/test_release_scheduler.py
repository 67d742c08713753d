"""vLLM's own schedulers driving vLLM's KV-cache manager against kvpool's,
for whichever release is importable (the overlay environment of
``.ci/vllm-mgr-all.sh``), above all the ``AsyncScheduler`` a GPU engine
builds by default.

The manager driver (``test_release_manager.py``) plays a scheduler's calls
itself. The async scheduler's pattern is the release's own code and changes
from release to release (output placeholders, stale outputs after a
preemption, drafts as placeholders), so here the release's ``Scheduler`` or
``AsyncScheduler`` is built by the release's own test helper
(``tests/v1/core/utils.py``'s ``create_scheduler``, from the release's
source tree) and run on a seeded workload by an engine-core loop: with the
async scheduler each step is scheduled before the previous step's output
is delivered (``EngineCore.step_with_batch_queue``), so ``allocate_slots``
counts placeholders, ``cache_blocks`` runs a step behind and a preemption
or an abort meets output in flight. Prompts share prefixes (and some repeat
whole, their outputs too), the cache is small enough to preempt, some
requests are aborted in flight, the prefix cache is reset now and then,
drafts are accepted at random, and with ``policy="priority"`` each request
has a priority.

Each workload runs twice from the same seed, stock (vLLM's manager over
vLLM's pool) and with kvpool's manager and pool put in as ``install()``
does; every scheduler output (scheduled tokens, new and cached requests'
block ids, preemptions, copies and zeroing), every engine-core output
(tokens, finish reasons, cached tokens), the prefix-cache stats and the
free-block count must be the same step by step. Two planted faults must be
caught: kvpool's manager allocating no slots for output placeholders (the
sync scheduler has none, so only the async runs can see it) and kvpool's
pool freeing in another order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import random
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kvpool.vllm as kv_vllm
from _manager_trace import free_order_broken

_SUITES = Path(__file__).resolve().parents[1] / "vllm_suites"
sys.path.insert(0, str(_SUITES))
import cpu_without_triton  # noqa: E402
import hf_hub_cache  # noqa: E402

LINE = kv_vllm.vllm_line()
if LINE.manager is None:
    pytest.skip(f"kvpool's {LINE.name} line has no KV-cache manager", allow_module_level=True)
try:
    from tests.v1.core import utils as vllm_test_utils  # the release's own helper
except ImportError as exc:  # pragma: no cover - a wheel-only tree
    pytest.skip(f"the release's tests/v1/core/utils.py is not importable ({exc})",
                allow_module_level=True)
cpu_without_triton.pytest_configure(None)  # (0.34: its CPU config check wants Triton)

from vllm.v1.core.sched import scheduler as vllm_scheduler  # noqa: E402
from vllm.v1.core import kv_cache_coordinator  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

BLOCK = 16


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    async_scheduling: bool = True
    num_requests: int = 90
    families: int = 6          # shared prefixes
    prefix_blocks: int = 4
    num_blocks: int = 400
    max_num_seqs: int = 8
    token_budget: int = 96     # chunked prefill
    max_tokens: tuple[int, int] = (2, 40)
    repeat_every: int = 5      # every 5th request repeats an earlier prompt whole
    abort_every: int = 0       # a running request aborted every N steps
    reset_every: int = 0       # reset_prefix_cache() every N steps
    spec_tokens: int = 0       # n-gram drafts, accepted at random
    policy: str = "fcfs"
    seed: int = 11


WORKLOADS = {w.name: w for w in (
    Workload("async-prefix"),
    # 32 blocks for 8 running requests of up to 10 blocks: preemptions with
    # their last step's output in flight, aborts and resets beside them.
    Workload("async-preempt", num_blocks=32, abort_every=13, reset_every=23),
    Workload("async-spec", spec_tokens=2, num_blocks=48, abort_every=17),
    Workload("async-priority", policy="priority", num_blocks=32, abort_every=19),
    # The synchronous scheduler on the same workloads (the control: the
    # placeholder fault must pass here).
    Workload("sync-preempt", async_scheduling=False, num_blocks=32, abort_every=13,
             reset_every=23),
)}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """facebook/opt-125m's published config.json in a directory of its own:
    the scheduler's ModelConfig reads only that, offline."""
    path = tmp_path_factory.mktemp("opt-125m")
    (path / "config.json").write_text(json.dumps(hf_hub_cache.OPT_125M))
    return str(path)


def _accepted(fn: Any, **kwargs: Any) -> dict[str, Any]:
    """The keyword arguments ``fn`` takes, of ``kwargs``."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def _make_scheduler(w: Workload, model: str):
    kwargs = dict(
        model=model, max_num_seqs=w.max_num_seqs, max_num_batched_tokens=w.token_budget,
        enable_prefix_caching=True, num_blocks=w.num_blocks, block_size=BLOCK,
        max_model_len=1024, skip_tokenizer_init=True, async_scheduling=w.async_scheduling,
        scheduling_policy=w.policy,
        num_speculative_tokens=w.spec_tokens or None,
        # (the drafter the async scheduler takes, as vLLM's own async tests)
        speculative_method="ngram_gpu" if w.spec_tokens and w.async_scheduling else None)
    taken = _accepted(vllm_test_utils.create_scheduler, **kwargs)
    if w.policy != "fcfs" and "scheduling_policy" not in taken:
        pytest.skip(f"this release's create_scheduler has no scheduling_policy")
    return vllm_test_utils.create_scheduler(**taken)


def _requests(w: Workload) -> list[Request]:
    rng = random.Random(w.seed)
    # (create_requests sets up the block hasher's seed hash; its requests'
    # sampling parameters are the tests' own, EOS ignored)
    [template] = vllm_test_utils.create_requests(1, ignore_eos=True, max_tokens=8,
                                                 block_size=BLOCK)
    from vllm.utils.hashing import sha256  # noqa: F401 (the helper's hash)
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    hasher = get_request_block_hasher(BLOCK, _helper_hash())
    prefixes = [[rng.randrange(3, 30000) for _ in range(w.prefix_blocks * BLOCK)]
                for _ in range(w.families)]
    prompts: list[list[int]] = []
    out = []
    for i in range(w.num_requests):
        if w.repeat_every and i % w.repeat_every == w.repeat_every - 1 and prompts:
            prompt = list(prompts[rng.randrange(len(prompts))])
        else:
            tail = [rng.randrange(3, 30000) for _ in range(rng.randrange(1, 3 * BLOCK))]
            prompt = prefixes[i % w.families][: rng.randrange(1, w.prefix_blocks + 1) * BLOCK] + tail
        prompts.append(prompt)
        params = template.sampling_params.clone()
        params.max_tokens = rng.randrange(*w.max_tokens)
        kwargs = dict(request_id=f"r{i}", prompt_token_ids=prompt, sampling_params=params,
                      pooling_params=None, block_hasher=hasher,
                      priority=rng.randrange(4) if w.policy == "priority" else 0)
        out.append(Request(**_accepted(Request.__init__, **kwargs)))
    return out


def _helper_hash():
    """The hash function the release's test helper hashes blocks with."""
    source = inspect.getsource(vllm_test_utils.create_requests)
    return vllm_test_utils.sha256 if "sha256" in source else None


def _token(request: Request, position: int) -> int:
    """The "model": the next token a function of the prompt and the
    position, so that repeated prompts generate the same output."""
    return (hash((tuple(request.prompt_token_ids[-4:]), len(request.prompt_token_ids),
                  position)) % 29000) + 3


def _plain(value: Any) -> Any:
    """``value`` as JSON-comparable data (dataclasses by field; objects
    without a plain form by type name)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in ("sampling_params", "pooling_params", "mm_features",
                                  "prompt_token_ids", "prompt_embeds", "lora_request")}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__name__


SCHEDULE_FIELDS = ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                   "scheduled_spec_decode_tokens", "num_common_prefix_blocks",
                   "finished_req_ids", "preempted_req_ids", "new_block_ids_to_zero",
                   "kv_cache_block_copies", "num_spec_tokens_to_schedule")


def _schedule_record(out: Any) -> dict:
    return {name: _plain(getattr(out, name)) for name in SCHEDULE_FIELDS if hasattr(out, name)}


def _output_record(outputs: dict) -> list:
    records = []
    for client, engine_outputs in sorted(outputs.items()):
        for o in engine_outputs.outputs:
            records.append([client, o.request_id, list(o.new_token_ids),
                            _plain(o.finish_reason), getattr(o, "num_cached_tokens", None)])
    return records


def _model_output(scheduler: Any, out: Any, rng: random.Random) -> ModelRunnerOutput:
    """Each scheduled request's sampled tokens: none for a prefill chunk
    that ends inside the prompt; else the accepted drafts (a random prefix
    of those scheduled) and the bonus token."""
    req_ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        req = scheduler.requests.get(rid)
        if req is None or req.num_computed_tokens < req.num_prompt_tokens:
            sampled.append([])
            continue
        drafts = len(out.scheduled_spec_decode_tokens.get(rid, ()))
        accepted = 0
        while accepted < drafts and rng.random() < 0.6:
            accepted += 1
        start = req.num_output_tokens + getattr(req, "num_output_placeholders", 0)
        sampled.append([_token(req, start + k) for k in range(accepted + 1)])
    fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    kwargs = dict(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                  sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                  pooler_output=[])
    return ModelRunnerOutput(**{k: v for k, v in kwargs.items() if k in fields})


def run(w: Workload, model: str) -> list:
    """The engine-core loop over ``w``: the trace of every step."""
    scheduler = _make_scheduler(w, model)
    requests = deque(_requests(w))
    rng = random.Random(w.seed + 1)
    trace: list = [["manager", type(scheduler.kv_cache_manager).__module__,
                    type(scheduler).__name__]]
    in_flight: deque = deque()
    step = 0
    while requests or scheduler.has_requests() or in_flight:
        step += 1
        if step > 20000:
            raise AssertionError(f"{w.name}: no progress after 20,000 steps")
        for _ in range(min(2, len(requests))):
            scheduler.add_request(requests.popleft())
        out = scheduler.schedule()
        trace.append(["schedule", step, _schedule_record(out)])
        # The model "runs" this step; its output arrives after the next
        # schedule() with the async scheduler, at once with the sync one.
        in_flight.append((out, _model_output(scheduler, out, rng)))
        if w.abort_every and step % w.abort_every == 0 and scheduler.running:
            victim = scheduler.running[rng.randrange(len(scheduler.running))].request_id
            scheduler.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
            trace.append(["abort", step, victim])
        depth = 1 if w.async_scheduling and (requests or scheduler.has_requests()) else 0
        while len(in_flight) > depth:
            done, model_out = in_flight.popleft()
            outputs = scheduler.update_from_output(done, model_out)
            trace.append(["update", step, _output_record(outputs)])
        if w.reset_every and step % w.reset_every == 0:
            # Every other reset also preempts the running requests (the
            # RLHF weight update's), with their output in flight.
            running = (step // w.reset_every) % 2 == 0
            ok = scheduler.reset_prefix_cache(
                **_accepted(scheduler.reset_prefix_cache, reset_running_requests=running))
            trace.append(["reset", step, ok])
        stats = scheduler.kv_cache_manager.make_prefix_cache_stats()
        trace.append(["state", step, scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
                      _plain(stats)])
    return trace


@contextlib.contextmanager
def _kvpool_in(manager_class: type | None = None, pool_class: type | None = None) -> Iterator[None]:
    """kvpool's pool and manager in, as ``install()`` puts them; optionally
    a planted subclass of either in their place."""
    with kv_vllm.enabled():
        saved = vllm_scheduler.KVCacheManager, kv_cache_coordinator.BlockPool
        if manager_class is not None:
            vllm_scheduler.KVCacheManager = manager_class
        if pool_class is not None:
            kv_cache_coordinator.BlockPool = pool_class
        try:
            yield
        finally:
            vllm_scheduler.KVCacheManager, kv_cache_coordinator.BlockPool = saved


def first_difference(want: list, got: list) -> str | None:
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b and i:  # (entry 0 names the manager: it differs by design)
            return f"step entry {i}:\n vLLM:   {json.dumps(a)[:1500]}\n kvpool: {json.dumps(b)[:1500]}"
    if len(want) != len(got):
        return f"traces of {len(want)} and {len(got)} entries"
    return None


_stock: dict[str, list] = {}


def stock_run(w: Workload, model: str) -> list:
    if w.name not in _stock:
        _stock[w.name] = run(w, model)
        assert _stock[w.name][0][1].startswith("vllm."), _stock[w.name][0]
    return _stock[w.name]


def _counts(trace: list) -> dict:
    kinds = {"preempted": 0, "hits": 0, "drafts": 0, "aborts": 0, "resets": 0}
    for entry in trace[1:]:
        if entry[0] == "schedule":
            # (a new request's computed tokens: its prefix-cache hit)
            kinds["hits"] += sum(r["num_computed_tokens"] for r in entry[2]["scheduled_new_reqs"])
            kinds["preempted"] += len(entry[2].get("preempted_req_ids") or ())
            kinds["drafts"] += sum(len(v) for v in entry[2]["scheduled_spec_decode_tokens"].values())
        elif entry[0] == "abort":
            kinds["aborts"] += 1
        elif entry[0] == "reset":
            kinds["resets"] += entry[2]
    return kinds


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_scheduler_with_kvpool_against_vllm(name: str, model_dir: str) -> None:
    w = WORKLOADS[name]
    want = stock_run(w, model_dir)
    with _kvpool_in():
        got = run(w, model_dir)
    assert got[0][1].startswith("kvpool."), got[0]
    assert got[0][2] == want[0][2] == ("AsyncScheduler" if w.async_scheduling else "Scheduler")
    difference = first_difference(want, got)
    assert difference is None, f"{name}: {difference}"
    counts = _counts(want)
    print(f"{name}: {len(want)} entries, {counts}")
    # The workload does what it is for.
    if "preempt" in name or "priority" in name:
        assert counts["preempted"] > 0, counts
    if w.abort_every:
        assert counts["aborts"] > 0, counts
    if w.spec_tokens:
        assert counts["drafts"] > 0, counts
    assert counts["hits"] > 0, counts


def _drops_placeholder_slots(base: type) -> type:
    """kvpool's manager allocating no slots for a request's output
    placeholders (``num_new_tokens`` less them, at least one): under the
    async scheduler a decode step's drafts get no slots; the synchronous
    scheduler has no placeholders, so there it changes nothing."""

    class DropsPlaceholderSlots(base):  # type: ignore[misc, valid-type]
        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            placeholders = getattr(request, "num_output_placeholders", 0)
            return super().allocate_slots(
                request, max(1, num_new_tokens - placeholders), *args, **kwargs)

    return DropsPlaceholderSlots


@pytest.mark.parametrize("name, caught", [("async-spec", True), ("sync-preempt", False)])
def test_a_placeholder_miscount_is_caught(name: str, caught: bool, model_dir: str) -> None:
    """The planted manager is a mismatch under the async scheduler, and
    exact under the sync one: the catch is the async pattern's."""
    w = WORKLOADS[name]
    want = stock_run(w, model_dir)
    with _kvpool_in():
        planted = _drops_placeholder_slots(vllm_scheduler.KVCacheManager)
    with _kvpool_in(manager_class=planted):
        got = run(w, model_dir)
    difference = first_difference(want, got)
    print(f"{name}: {difference}")
    assert (difference is not None) is caught, difference


def test_a_broken_pool_is_caught_by_the_schedulers(model_dir: str) -> None:
    w = WORKLOADS["async-preempt"]
    want = stock_run(w, model_dir)
    with _kvpool_in():
        broken = free_order_broken(kv_cache_coordinator.BlockPool)
    with _kvpool_in(pool_class=broken):
        got = run(w, model_dir)
    assert first_difference(want, got) is not None
