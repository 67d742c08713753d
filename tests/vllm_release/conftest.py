"""Tests against one vLLM release kvpool lists (0.15.0 ... 0.34.0), whichever is importable:
each release's own pool classes, with kvpool's line for that release
(``kvpool.vllm.vllm_line``). They run in the overlay environment: the
environment of ``.ci/vllm-env.sh --vllm 0.33.0`` with the release's source
tree (``.ci/vllm-src.sh VERSION``) first on ``PYTHONPATH``, so that
``vllm.__version__`` is the release's. ``.ci/vllm-release-tests.sh`` runs
them for every release.

Nothing here is skipped quietly: without an importable vLLM, or with a vLLM
outside the listed series (but for the release the intake names,
``KVPOOL_VLLM_INTAKE``), this directory is a usage error that names what is
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
from _vllm_helpers import check_expected_release, check_strict_core

VLLM_MISSING = VLLM_PROBLEM = ""
try:
    # Not just ``import vllm``: a checkout's tests/vllm directory on sys.path
    # would satisfy that as an empty namespace package.
    import vllm.v1.core.block_pool  # noqa: F401
except ImportError as exc:
    VLLM_MISSING = VLLM_PROBLEM = f"no vLLM is importable here ({exc})"
else:
    import vllm

    from kvpool.vllm import VLLM_LINES, intake_alias

    # The oldest and newest release series kvpool lists: a release that
    # tools/intake.py --apply adds is in range without an edit here.
    _series = [tuple(int(x) for x in r.split(".")[:2]) for line in VLLM_LINES for r in line.releases]
    FIRST, LAST = min(_series), max(_series)
    _match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", vllm.__version__)
    # The release intake (tools/intake.py) runs a newer release against the
    # line it names (KVPOOL_VLLM_INTAKE), to show where the line breaks.
    _intake = intake_alias()
    if (not _match or not FIRST <= (int(_match[1]), int(_match[2])) <= LAST) and not (
        _intake and _intake[0] == vllm.__version__
    ):
        VLLM_PROBLEM = (
            f"these tests are for a vLLM release of the series {FIRST[0]}.{FIRST[1]} ... "
            f"{LAST[0]}.{LAST[1]} (kvpool.vllm.VLLM_LINES); found vLLM {vllm.__version__}"
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
        check_expected_release()
