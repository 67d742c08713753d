"""Trace replay: a scheduler's block bookkeeping over 500 requests sharing
prompt prefixes, on a 4096-block pool (see ``kvpool.bench.make_trace``). One
call replays the whole trace on a fresh pool, built in the untimed setup."""

from __future__ import annotations

import pytest

from kvpool import bench


@pytest.mark.parametrize("bulk", [False, True], ids=["per-block-lookup", "bulk-lookup"])
def test_trace_replay(benchmark, core, BlockPool, trace, trace_cfg, bulk):
    w = bench.TraceReplay(core, BlockPool, trace, trace_cfg, bulk=bulk)
    benchmark.group = "trace replay, " + ("bulk lookup" if bulk else "per-block lookup")
    benchmark.pedantic(w.step, setup=lambda: ((w.new_pool(),), {}), rounds=20,
                       warmup_rounds=1)
