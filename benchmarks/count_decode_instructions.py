"""Instructions a steady decode ``allocate_slots`` costs, counted by callgrind.

The engine calls ``KVCacheManager.allocate_slots`` once per running request
per step, and almost every call is a decode step that needs no new block and
fills none. Timings of that call in an engine are noisy and mostly the call
itself (``docs/real-engine.md``); instruction counts are exact. This script
counts, for the same calls:

- ``vllm``: vLLM's manager over vLLM's pool;
- ``kvpool``: kvpool's manager over kvpool's pool (``kvpool.vllm.install()``);
- ``empty``: kvpool's manager whose ``allocate_slots`` is a Python method
  of two parameters that returns at once -- the least a manager written in
  Python pays for being called, before it does anything.

Each side runs in its own process under ``valgrind --tool=callgrind``
(``PYTHONHASHSEED=0``), which counts only inside the counted loop: the loop
is called through ``operator.call`` and callgrind collects only inside
that C function (``--toggle-collect=_operator_call``), so the vLLM import
and the setup, whose counts vary from run to run by millions, count
nothing. A call's cost is the loop's count over its calls: the call with
its share of the loop (a ``for`` over the requests and the method call, as
in the scheduler). The child checks that every counted call was the case
named (kvpool: served by the compiled path, no new block, nothing cached;
vLLM: no new block) and fails otherwise.

Run it in the environment ``.ci/vllm-env.sh`` builds (vLLM 0.26 or newer,
kvpool importable: installed, or this checkout on ``PYTHONPATH``)::

    .ci/vllm-env.sh --vllm 0.33.0 /tmp/vllm-venv
    PYTHONPATH=. /tmp/vllm-venv/bin/python benchmarks/count_decode_instructions.py

Where the instructions inside kvpool's call go::

    valgrind --tool=callgrind --collect-atstart=no \\
        --toggle-collect='__pyx_pw_6kvpool_9_allocate_*allocate_slots' \\
        python benchmarks/count_decode_instructions.py --child kvpool 100
    callgrind_annotate --inclusive=yes --tree=calling callgrind.out.<pid>
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
SIDES = ("vllm", "kvpool", "empty")


def child(side: str, rounds: int, requests: int, prompt: int, eagle: int = 0) -> None:
    sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "vllm"))
    sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "vllm33"))
    import kvpool.vllm as kv

    if side != "vllm":
        os.environ["KVPOOL_VLLM"] = "1"
        kv.install()
    import vllm_workload33 as vw

    # EAGLE: the manager built with use_eagle, each step the token and the
    # ``eagle`` drafts scheduled with as many lookahead slots (as the
    # scheduler calls it).
    w = vw.Workload("decode", enable_events=False, spec_tokens=eagle, eagle=eagle > 0)
    mgr = vw.make_manager(w)
    if side != "vllm" and getattr(mgr, "_kvpool_plan", None) is None:
        sys.exit(f"kvpool's manager is not in: {type(mgr).__module__}, "
                 f"{getattr(mgr, 'kvpool_fallback_reason', None)!r}")
    hasher = vw.request_block_hasher(w)
    reqs = []
    for i in range(requests):
        # One full block and a partial one: a decode token needs no new block.
        r = vw.new_request(f"req-{i}", list(range(i * 10_000, i * 10_000 + prompt)), 64, hasher)
        mgr.get_computed_blocks(r)
        if mgr.allocate_slots(r, prompt) is None:
            sys.exit("the pool is too small for the prefill")
        r.num_computed_tokens = prompt
        r.append_output_token_ids(1)
        reqs.append(r)
    empty = mgr.empty_kv_cache_blocks
    if side == "empty":
        # The least a Python method the loop calls can be.
        def allocate_slots(self, request, num_new_tokens, num_lookahead_tokens=0):
            return empty
        type(mgr).allocate_slots = allocate_slots
    plan = getattr(mgr, "_kvpool_plan", None)
    before = plan.counts if plan is not None else None
    alloc = mgr.allocate_slots
    def loop() -> int:
        n = 0
        for _ in range(rounds):
            for r in reqs:
                if alloc(r, 1) is empty:  # no new block
                    n += 1
        return n

    if eagle:
        def loop() -> int:  # noqa: F811 - the EAGLE step instead
            n = 0
            for _ in range(rounds):
                for r in reqs:
                    if alloc(r, 1 + eagle, num_lookahead_tokens=eagle) is empty:
                        n += 1
            return n

    # Warm up, then the counted loop: the one run through operator.call.
    served = loop() + operator.call(loop)
    calls = 2 * rounds * requests
    check = {"side": side, "calls": calls, "no_new_block": served}
    if served != calls:
        sys.exit(f"{calls - served} of {calls} calls allocated a block: not a steady decode")
    if plan is not None and side == "kvpool":
        after = plan.counts
        fast = after["fast"] - before["fast"]
        skips = after["cache_skips"] - before["cache_skips"]
        check.update(compiled=fast, cache_skips=skips)
        if fast != calls or skips != calls:
            sys.exit(f"not every call took the compiled decode path: {check}")
    print(json.dumps(check))


def count(side: str, rounds: int, args: argparse.Namespace, valgrind: str, tmp: str) -> float:
    """Instructions a call of ``side``'s counted loop (``rounds`` steps)."""
    out = os.path.join(tmp, f"{side}.out")
    cmd = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}",
           "--collect-atstart=no", "--toggle-collect=_operator_call",
           sys.executable, os.path.abspath(__file__), "--child", side, str(rounds),
           "--requests", str(args.requests), "--prompt", str(args.prompt),
           "--eagle", str(args.eagle)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{side} failed:\n{proc.stderr[-3000:]}")
    check = json.loads(proc.stdout)
    with open(out) as f:
        for line in f:
            m = re.match(r"(?:summary|totals): (\d+)", line)
            if m:
                if int(m.group(1)) == 0:
                    sys.exit("callgrind counted nothing inside operator.call: this Python's "
                             "symbols do not name _operator_call")
                # Half the calls were the warm-up, outside the count.
                return int(m.group(1)) / (check["calls"] / 2)
    sys.exit(f"no total in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "ROUNDS"), help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=64, help="running requests (64)")
    parser.add_argument("--prompt", type=int, default=24,
                        help="prompt tokens: a full block and a partial one (24)")
    parser.add_argument("--rounds", type=int, default=100,
                        help="steps over every request in the counted loop (100)")
    parser.add_argument("--sides", default=",".join(SIDES), help="which of vllm,kvpool,empty")
    parser.add_argument("--eagle", type=int, default=0, metavar="K",
                        help="an EAGLE decode step: K drafts and K lookahead slots (0: none)")
    args = parser.parse_args()
    if args.child:
        side, rounds = args.child
        if side not in SIDES:
            sys.exit(f"unknown side {side!r}: one of {', '.join(SIDES)}")
        if args.eagle and args.prompt % 16 + 1 + 2 * args.eagle > 16:
            sys.exit("--eagle: the prompt's partial block must hold the step's tokens and "
                     "lookahead (prompt % 16 + 1 + 2K <= 16)")
        child(side, int(rounds), args.requests, args.prompt, args.eagle)
        return
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    if args.rounds < 1:
        sys.exit("--rounds: at least 1")
    sides = [s for s in args.sides.split(",") if s]
    print(f"[count] {', '.join(sides)}: {args.rounds} rounds each under callgrind, "
          f"side by side (counts do not depend on load) ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        futures = {side: ex.submit(count, side, args.rounds, args, valgrind, tmp)
                   for side in sides}
        per_call = {side: f.result() for side, f in futures.items()}
    import vllm

    step = f"EAGLE ({args.eagle} drafts, lookahead {args.eagle}) " if args.eagle else ""
    print(f"steady {step}decode allocate_slots, vLLM {vllm.__version__}, {args.requests} requests x "
          f"{args.rounds} steps, instructions a call (callgrind; the loop's share included)")
    print("| side | instructions a call | vs vLLM |")
    print("|---|---|---|")
    for side in sides:
        ratio = f"{per_call['vllm'] / per_call[side]:.1f}x" if "vllm" in per_call else "-"
        print(f"| {side} | {per_call[side]:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
