"""The once-per-request methods kvpool's manager inherits from vLLM's, timed.

kvpool's ``KVCacheManager`` compiles what the scheduler calls for every
request on every step; a few connector-facing methods it leaves to vLLM's
code over the same tables, because the scheduler calls them once per
request (docs/manager.md, "Scope and fallbacks"). This times them per call
beside the compiled ``get_blocks`` and ``free`` on kvpool's manager: 64
requests of the driver's full-attention workload admitted whole, then each
method called once per request; median [range] over the rounds.

Run in a vLLM environment of 0.30 or later (a release's tree first on
``PYTHONPATH`` for another release)::

    python benchmarks/bench_manager_request_methods.py --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests", "vllm33"), os.path.join(HERE, "..", "tests", "vllm")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args()

    import vllm

    import kvpool.vllm

    kvpool.vllm.install()
    import vllm_workload33 as vw
    from vllm.v1.request import RequestStatus

    w = vw.FULL.scaled(num_requests=args.requests, num_blocks=16384)
    mgr = vw.make_manager(w)
    if not type(mgr).__module__.startswith("kvpool.") or mgr.kvpool_fallback_reason:
        sys.exit(f"kvpool's manager is not serving: {type(mgr)}, "
                 f"{getattr(mgr, 'kvpool_fallback_reason', None)}")
    requests = vw.build_requests(w)
    blocks = []

    def admit() -> None:
        for r in requests:
            r.num_computed_tokens = 0
            r.status = RequestStatus.WAITING
            if mgr.allocate_slots(r, r.num_tokens) is None:
                sys.exit("the pool is too small for the requests")
            r.status = RequestStatus.RUNNING
        blocks.append(sum(len(mgr.get_block_ids(r.request_id)[0]) for r in requests))

    def pop_and_free(r) -> None:
        mgr.block_pool.free_blocks(mgr.pop_blocks_for_free(r))

    methods = [
        ("free (compiled)", mgr.free),
        ("get_blocks (compiled)", lambda r: mgr.get_blocks(r.request_id)),
        ("get_block_ids_for_computed_tokens (vLLM's)",
         lambda r: mgr.get_block_ids_for_computed_tokens(r.request_id, r.num_tokens)),
        ("pop_blocks_for_free, then the pool's free_blocks (vLLM's)", pop_and_free),
    ]
    print(f"vLLM {vllm.__version__}, kvpool's manager {type(mgr).__module__}, "
          f"{args.requests} requests, {args.rounds} rounds, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print("| method | us a call |\n|---|---|")
    for name, fn in methods:
        samples = []
        for _ in range(args.rounds):
            admit()
            t0 = time.perf_counter()
            for r in requests:
                fn(r)
            samples.append((time.perf_counter() - t0) / len(requests) * 1e6)
            for r in requests:
                mgr.free(r)  # (nothing left after free / pop_blocks_for_free)
        print(f"| {name} | {statistics.median(samples):.2f} "
              f"[{min(samples):.2f}-{max(samples):.2f}] |")
    print(f"blocks a request: {blocks[0] / len(requests):.1f}; "
          f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
