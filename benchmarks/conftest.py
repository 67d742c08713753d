"""pytest-benchmark configuration: every benchmark runs on both cores.

As in ``tests/``, the session fixture ``core`` is parametrized over the
compiled core (id ``c-extension``) and its pure-Python twin (id
``pure-python``); each benchmark sets a ``group`` so that the two runs of an
operation sit side by side in pytest-benchmark's report. Unlike the tests, a
compiled core that is not built is skipped here: benchmarks never gate CI.

The workloads are the ones ``python -m kvpool.bench`` times (``kvpool.bench``),
so the two harnesses measure the same thing. Run with
``pytest benchmarks/ --benchmark-only``; the project's ``testpaths`` keep this
directory out of the normal test run.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from kvpool import bench

# Test ids as in tests/conftest.py -> kvpool.bench core keys.
CORE_IDS = {"c-extension": "compiled", "pure-python": "pure"}


@pytest.fixture(scope="session", params=list(CORE_IDS))
def core_and_pool(request: pytest.FixtureRequest) -> tuple[ModuleType, type]:
    try:
        return bench.load_core(CORE_IDS[request.param])
    except ImportError as exc:
        pytest.skip(f"{bench.CORES[CORE_IDS[request.param]][1]} is not importable: {exc}")


@pytest.fixture(scope="session")
def core(core_and_pool: tuple[ModuleType, type]) -> ModuleType:
    return core_and_pool[0]


@pytest.fixture(scope="session")
def BlockPool(core_and_pool: tuple[ModuleType, type]) -> type:
    return core_and_pool[1]


@pytest.fixture(scope="session")
def trace_cfg() -> bench.TraceConfig:
    return bench.TraceConfig(num_requests=500)


@pytest.fixture(scope="session")
def trace(trace_cfg: bench.TraceConfig) -> list[bench.TraceRequest]:
    return bench.make_trace(trace_cfg)
