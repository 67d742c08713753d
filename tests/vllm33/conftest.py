"""Tests against a real vLLM 0.33.x (its own pure-Python pool, hasher and
plugin loader). They run in the environment that ``.ci/vllm-env.sh --vllm
0.33.0`` builds (``.ci/vllm-tests.sh`` does both), or in any environment
with vLLM 0.33.0 installed (CPU build) and kvpool importable (installed, or
on PYTHONPATH with its compiled core built in place).

Nothing here is skipped quietly: run without an importable vLLM 0.33.x, this
directory is a usage error that names what is missing, unless
``KVPOOL_SKIP_VLLM=1`` (then every module is a skip with that reason, listed
in pytest's summary). Another vLLM release is always an error. A plain
``pytest tests`` does not recurse into this directory (``norecursedirs`` in
pyproject.toml): name it to run it.

``KVPOOL_VLLM_STRICT=1`` (set by ``.ci/vllm-tests.sh``): kvpool's compiled
core must be the one loaded.
"""

from __future__ import annotations

import os

import pytest
from _vllm_helpers import check_strict_core
from _vllm_helpers import no_leftover_install as no_leftover_install  # autouse

LINE = "0.33."

VLLM_MISSING = VLLM_PROBLEM = ""
try:
    # Not just ``import vllm``: a checkout's tests/vllm directory on sys.path
    # would satisfy that as an empty namespace package.
    import vllm.v1.core.kv_cache_manager  # noqa: F401
except ImportError as exc:
    VLLM_MISSING = VLLM_PROBLEM = f"vLLM {LINE}x is not importable here ({exc})"
else:
    import vllm

    if not vllm.__version__.startswith(LINE):
        VLLM_PROBLEM = f"these tests are for vLLM {LINE}x; found vLLM {vllm.__version__}"

# Only a missing vLLM may be skipped (a machine that cannot hold it); a wrong
# one is a broken environment.
SKIP = bool(VLLM_MISSING) and os.environ.get("KVPOOL_SKIP_VLLM") == "1"
HOW = "build the environment with .ci/vllm-env.sh --vllm 0.33.0 (see .ci/vllm-tests.sh)"


def pytest_configure(config: pytest.Config) -> None:
    # pytest_configure also runs for a conftest found during collection, so
    # this fires however the directory was reached.
    if VLLM_PROBLEM and not SKIP:
        raise pytest.UsageError(
            f"tests/vllm33: {VLLM_PROBLEM}; {HOW}, or set KVPOOL_SKIP_VLLM=1 "
            f"to skip these tests where vLLM cannot be installed"
        )


class _SkippedModule(pytest.Module):
    """Stands in for a test module when KVPOOL_SKIP_VLLM=1 allowed the skip:
    collecting it is a skip with the reason (the module, which imports vLLM,
    is never imported)."""

    def collect(self):
        pytest.skip(f"KVPOOL_SKIP_VLLM=1: {VLLM_PROBLEM}")


def pytest_pycollect_makemodule(module_path, parent):
    if SKIP:
        return _SkippedModule.from_parent(parent, path=module_path)
    return None


def pytest_report_header(config: pytest.Config) -> list[str]:
    if VLLM_PROBLEM:
        return [f"tests/vllm33 SKIPPED (KVPOOL_SKIP_VLLM=1): {VLLM_PROBLEM}"]
    header = [f"vllm {vllm.__version__} ({os.path.dirname(vllm.__file__)})"]
    try:
        import kvpool
    except ImportError as exc:  # the tests that need it will say so too
        return [*header, f"kvpool is not importable: {exc}"]
    return [
        *header,
        (
            f"kvpool {kvpool.__version__} ({os.path.dirname(kvpool.__file__)}), "
            f"core: {'compiled' if kvpool.USING_EXTENSION else 'pure-Python'}"
        ),
    ]


def pytest_sessionstart(session: pytest.Session) -> None:
    if not VLLM_PROBLEM:
        check_strict_core()
