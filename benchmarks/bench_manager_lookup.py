"""The prefix-cache lookup (``get_computed_blocks``) of kvpool's manager
against vLLM's, on the same manager, pool and requests.

Per configuration (full attention + a sliding window, a sliding window
alone, each with and without EAGLE's dropped block; one full-attention
group for comparison; full attention beside a circular buffer): the driver's requests (shared prompt prefixes) are
admitted whole, cached and freed, so their blocks stay in the prefix cache;
then, each round, every request is looked up ``--passes`` times by kvpool's
compiled method and as often by vLLM's own
``KVCacheManager.get_computed_blocks`` on the same kvpool manager (the order
alternates by round). The two must return
the same blocks, hit length and shared-prefix boundary for every request.
Reported: microseconds a call, median [range] over the rounds, and vLLM's
time over kvpool's per round.

Run in a vLLM environment of 0.30 or later (a release's tree first on
``PYTHONPATH`` for another release)::

    python benchmarks/bench_manager_lookup.py --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests", "vllm33"), os.path.join(HERE, "..", "tests", "vllm")]


def _ids(result) -> tuple:
    blocks, hit, boundary = result
    return tuple(tuple(b.block_id for b in g) for g in blocks.blocks), hit, boundary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--passes", type=int, default=20,
                        help="lookups of every request in one timed sample")
    args = parser.parse_args()

    import vllm

    import kvpool.vllm

    kvpool.vllm.install()
    import vllm_workload33 as vw
    from vllm.v1.request import RequestStatus

    sliding = vw.Group("sliding", 16, sliding_window=128)
    configs = [
        ("full + sliding window", vw.HYBRID, {}),
        ("full + sliding window, EAGLE", vw.HYBRID, {"spec_tokens": 3, "eagle": True}),
        ("sliding window alone", vw.HYBRID, {"groups": (sliding,)}),
        ("sliding window alone, EAGLE", vw.HYBRID,
         {"groups": (sliding,), "spec_tokens": 3, "eagle": True}),
        ("full attention (the direct lookup)", vw.FULL, {}),
        # A circular buffer's group takes no part in the lookup; full
        # attention's hits are rounded down to its 64-token block.
        ("full + a circular buffer", vw.HYBRID,
         {"groups": (vw.Group("full", 16), vw.Group("ring", 64))}),
    ]
    print(f"vLLM {vllm.__version__}, {args.requests} requests looked up {args.passes} times "
          f"a round, {args.rounds} rounds, load average {os.getloadavg()[0]:.2f} at start")
    print("| configuration | hit tokens a request | vLLM's (us a call) | kvpool's (us a call) "
          "| vLLM / kvpool |\n|---|---|---|---|---|")
    for name, base, changes in configs:
        w = base.scaled(num_requests=args.requests, num_blocks=32768, metrics_sample_rate=None,
                        **changes)
        mgr = vw.make_manager(w)
        if not type(mgr).__module__.startswith("kvpool.") or mgr.kvpool_fallback_reason:
            sys.exit(f"kvpool's manager is not serving {name}: {type(mgr)}, "
                     f"{getattr(mgr, 'kvpool_fallback_reason', None)}")
        requests = vw.build_requests(w)
        for r in requests:  # admitted whole, cached, freed: the blocks stay cached
            r.status = RequestStatus.WAITING
            if mgr.allocate_slots(r, r.num_tokens) is None:
                sys.exit("the pool is too small for the requests")
            r.status = RequestStatus.RUNNING
            mgr.free(r)
            r.status = RequestStatus.WAITING
        vllms = type(mgr)._kvpool_base.get_computed_blocks
        ours = type(mgr).get_computed_blocks
        lookups_before = mgr._kvpool_plan.counts["lookups"]
        hits = 0
        for r in requests:
            want, got = _ids(vllms(mgr, r)), _ids(ours(mgr, r))
            if want != got:
                sys.exit(f"{name}: kvpool's lookup differs from vLLM's for {r.request_id}: "
                         f"{got[1:]} against {want[1:]}")
            hits += got[1]
        if mgr._kvpool_plan.counts["lookups"] == lookups_before:
            sys.exit(f"{name}: kvpool's lookup was not done in C")
        samples: dict[str, list[float]] = {"vllm": [], "kvpool": []}
        for k in range(args.rounds):
            order = [("vllm", vllms), ("kvpool", ours)]
            for label, fn in order if k % 2 == 0 else reversed(order):
                t0 = time.perf_counter()
                for _ in range(args.passes):
                    for r in requests:
                        fn(mgr, r)
                samples[label].append(
                    (time.perf_counter() - t0) / (args.passes * len(requests)) * 1e6
                )
        ratios = [a / b for a, b in zip(samples["vllm"], samples["kvpool"])]

        def cell(xs: list[float], unit: str = "") -> str:
            return f"{statistics.median(xs):.2f}{unit} [{min(xs):.2f}-{max(xs):.2f}]"

        print(f"| {name} | {hits / len(requests):.0f} | {cell(samples['vllm'])} "
              f"| {cell(samples['kvpool'])} | {cell(ratios, 'x')} |")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
