"""Tests against one vLLM release kvpool lists (0.15.0 ... 0.34.0), whichever is importable:
each release's own pool classes, with kvpool's line for that release
(``kvpool.vllm.vllm_line``). They run in the overlay environment: the
environment of ``.ci/vllm-env.sh --vllm 0.33.0`` with the release's source
tree (``.ci/vllm-src.sh VERSION``) first on ``PYTHONPATH``, so that
``vllm.__version__`` is the release's. ``.ci/vllm-release-tests.sh`` runs
them for every release.

Nothing here is skipped quietly: without an importable vLLM, or with a vLLM
outside the listed series, this directory is a usage error that names what is
wrong, unless vLLM is missing and ``KVPOOL_SKIP_VLLM=1`` (then every module
is a skip with that reason, listed in pytest's summary). A plain ``pytest
tests`` does not recurse into this directory (``norecursedirs`` in
pyproject.toml): name it to run it.

``KVPOOL_VLLM_STRICT=1`` (set by the CI script): kvpool's compiled core must
be the one loaded.
"""

from __future__ import annotations

import os
import re

import pytest
from _vllm_helpers import check_strict_core

def _series(release: str) -> tuple[int, int]:
    major, minor = release.split(".")[:2]
    return int(major), int(minor)


def _listed_range() -> tuple[tuple[int, int], tuple[int, int], str]:
    # The series kvpool lists (kvpool.vllm.VLLM_LINES, the one registry).
    from kvpool.vllm import VLLM_LINES

    first, last = VLLM_LINES[0].releases[0], VLLM_LINES[-1].releases[-1]
    return _series(first), _series(last), f"{first} ... {last}"


FIRST, LAST, RANGE = _listed_range()

VLLM_MISSING = VLLM_PROBLEM = ""
try:
    # Not just ``import vllm``: a checkout's tests/vllm directory on sys.path
    # would satisfy that as an empty namespace package.
    import vllm.v1.core.block_pool  # noqa: F401
except ImportError as exc:
    VLLM_MISSING = VLLM_PROBLEM = f"no vLLM is importable here ({exc})"
else:
    import vllm

    _match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", vllm.__version__)
    if not _match or not FIRST <= (int(_match[1]), int(_match[2])) <= LAST:
        VLLM_PROBLEM = (
            f"these tests are for a vLLM release {RANGE}; found vLLM {vllm.__version__}"
        )

SKIP = bool(VLLM_MISSING) and os.environ.get("KVPOOL_SKIP_VLLM") == "1"
HOW = (
    "run them with .ci/vllm-release-tests.sh, or in the environment of .ci/vllm-env.sh "
    "--vllm 0.33.0 with $(.ci/vllm-src.sh VERSION) first on PYTHONPATH"
)


def pytest_configure(config: pytest.Config) -> None:
    if VLLM_PROBLEM and not SKIP:
        raise pytest.UsageError(
            f"tests/vllm_release: {VLLM_PROBLEM}; {HOW}, or set KVPOOL_SKIP_VLLM=1 "
            f"to skip these tests where vLLM cannot be installed"
        )


class _SkippedModule(pytest.Module):
    """Stands in for a test module when KVPOOL_SKIP_VLLM=1 allowed the skip."""

    def collect(self):
        pytest.skip(f"KVPOOL_SKIP_VLLM=1: {VLLM_PROBLEM}")


def pytest_pycollect_makemodule(module_path, parent):
    if SKIP:
        return _SkippedModule.from_parent(parent, path=module_path)
    return None


def pytest_report_header(config: pytest.Config) -> list[str]:
    if VLLM_PROBLEM:
        return [f"tests/vllm_release SKIPPED (KVPOOL_SKIP_VLLM=1): {VLLM_PROBLEM}"]
    return [f"vllm {vllm.__version__} ({os.path.dirname(vllm.__file__)})"]


def pytest_sessionstart(session: pytest.Session) -> None:
    if not VLLM_PROBLEM:
        check_strict_core()
