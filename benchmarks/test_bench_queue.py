"""FreeKVCacheBlockQueue: the headline pair (popleft_n + append_n, remove +
append) and append_n alone. One call of a benchmarked function moves 256
blocks (256 remove+append pairs for remove/append)."""

from __future__ import annotations

import pytest

from kvpool import bench


@pytest.mark.benchmark(group="queue: popleft_n(256) + append_n, pool's queue")
def test_popleft_n_append_n(benchmark, core, BlockPool):
    benchmark(bench.QueuePopleftAppend(core, BlockPool).step)


@pytest.mark.benchmark(group="queue: popleft_n(256) + append_n, standalone queue")
def test_popleft_n_append_n_standalone(benchmark, core, BlockPool):
    benchmark(bench.QueuePopleftAppend(core, BlockPool, standalone=True).step)


@pytest.mark.benchmark(group="queue: append_n(256)")
def test_append_n(benchmark, core, BlockPool):
    w = bench.QueueAppendN(core, BlockPool)
    # The blocks are popped in the untimed setup of every round.
    benchmark.pedantic(w.step, setup=lambda: ((w.prepare(),), {}), rounds=2000,
                       warmup_rounds=100)


@pytest.mark.benchmark(group="queue: 256 x (remove(b) + append(b))")
def test_remove_append(benchmark, core, BlockPool):
    benchmark(bench.QueueRemoveAppend(core, BlockPool).step)
