"""Test configuration: every behaviour test runs against both cores.

As in aio-libs' multidict, the session fixture ``core`` is parametrized over
the compiled core (id ``c-extension``) and its pure-Python twin (id
``pure-python``); the tests never know which one they hold. The compiled core
is *required*: if it cannot be imported its tests fail, they are never
skipped, so a broken build cannot pass CI unnoticed. ``--no-c-extensions``
deselects them (for a pure-Python run).

Hypothesis profiles: ``default`` (``KVPOOL_HYPOTHESIS_EXAMPLES`` examples,
200 unless set) and ``ci`` (the same, derandomized so a CI run is
reproducible), chosen with ``KVPOOL_HYPOTHESIS_PROFILE`` or, when that is
unset, ``ci`` whenever the environment variable ``CI`` is set. Neither has a
deadline: the tests never time anything.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

from _helpers import block_pool_class

C_EXT_MARK = pytest.mark.c_extension

HYPOTHESIS_EXAMPLES = int(os.environ.get("KVPOOL_HYPOTHESIS_EXAMPLES", "200"))

_hypothesis_common = dict(
    max_examples=HYPOTHESIS_EXAMPLES,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("default", **_hypothesis_common)
settings.register_profile(
    "ci", derandomize=True, database=None, print_blob=True, **_hypothesis_common
)
settings.load_profile(
    os.environ.get("KVPOOL_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default")
)


@dataclass(frozen=True)
class CoreImplementation:
    """One core variant: its module name and the id shown in test names."""

    module_name: str
    id: str

    def load(self) -> ModuleType:
        return importlib.import_module(self.module_name)


C_EXTENSION = CoreImplementation("kvpool._core", "c-extension")
PURE_PYTHON = CoreImplementation("kvpool._core_py", "pure-python")
ALL_IMPLEMENTATIONS = (C_EXTENSION, PURE_PYTHON)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-c-extensions",
        action="store_true",
        default=False,
        help="Deselect the tests of the compiled core (kvpool._core); "
        "without this option they fail when it cannot be imported.",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "c_extension: a test of the compiled core, deselected by --no-c-extensions"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--no-c-extensions"):
        return
    selected, deselected = [], []
    for item in items:
        (deselected if item.get_closest_marker("c_extension") else selected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def selected_implementations(config: pytest.Config) -> tuple[CoreImplementation, ...]:
    if config.getoption("--no-c-extensions"):
        return (PURE_PYTHON,)
    return ALL_IMPLEMENTATIONS


def load_core(impl: CoreImplementation) -> ModuleType:
    """Import a core; a compiled core that cannot be imported is a failure."""
    try:
        return impl.load()
    except ImportError as exc:
        pytest.fail(
            f"cannot import {impl.module_name} ({exc}). Build it with "
            "`python setup.py build_ext --inplace`, or run with --no-c-extensions "
            "to test the pure-Python core alone.",
            pytrace=False,
        )


@pytest.fixture(
    scope="session",
    params=[
        pytest.param(C_EXTENSION, id=C_EXTENSION.id, marks=C_EXT_MARK),
        pytest.param(PURE_PYTHON, id=PURE_PYTHON.id),
    ],
)
def core(request: pytest.FixtureRequest) -> ModuleType:
    return load_core(request.param)


@pytest.fixture(scope="session")
def all_cores(request: pytest.FixtureRequest) -> list[ModuleType]:
    """Every selected core at once, for differential tests (compiled first)."""
    return [load_core(impl) for impl in selected_implementations(request.config)]


@pytest.fixture(scope="session")
def BlockPool(core: ModuleType) -> type:
    return block_pool_class(core)


@pytest.fixture(scope="session")
def KVCacheBlock(core: ModuleType) -> type:
    return core.KVCacheBlock


@pytest.fixture(scope="session")
def FreeKVCacheBlockQueue(core: ModuleType) -> type:
    return core.FreeKVCacheBlockQueue


@pytest.fixture(scope="session")
def BlockHashToBlockMap(core: ModuleType) -> type:
    return core.BlockHashToBlockMap


@pytest.fixture
def no_c_extensions(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--no-c-extensions"))
