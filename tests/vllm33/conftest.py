"""Tests against vLLM 0.33.0's own pure-Python pool. They run in an
environment with vLLM 0.33.0 installed (CPU build; no GPU needed) and kvpool
importable (installed, or on PYTHONPATH with its compiled core built in
place). Anywhere vLLM 0.33.x is not importable the test modules skip themselves
with the reason in pytest's summary;
``KVPOOL_VLLM_STRICT=1`` turns that skip into a failure.

kvpool itself is never skipped: a missing ``kvpool.v0_33`` or compiled core
fails the tests that need it.
"""

from __future__ import annotations

import os

import pytest

try:
    # Not just ``import vllm``: a checkout's tests/vllm directory on sys.path
    # would satisfy that as an empty namespace package.
    import vllm.v1.core.block_pool  # noqa: F401
    from vllm import __version__ as VLLM_VERSION
except ImportError as exc:
    VLLM_MISSING = f"vLLM 0.33.x is not importable here ({exc})"
else:
    VLLM_MISSING = (
        "" if VLLM_VERSION.startswith("0.33.") else f"vLLM {VLLM_VERSION} is not 0.33.x"
    )

STRICT = os.environ.get("KVPOOL_VLLM_STRICT") == "1"


def pytest_report_header(config: pytest.Config) -> list[str]:
    if VLLM_MISSING:
        return [VLLM_MISSING]
    import vllm

    import kvpool

    return [
        f"vllm {vllm.__version__} ({os.path.dirname(vllm.__file__)})",
        f"kvpool {kvpool.__version__} ({os.path.dirname(kvpool.__file__)})",
    ]


def pytest_sessionstart(session: pytest.Session) -> None:
    if VLLM_MISSING and STRICT:
        raise pytest.UsageError(f"KVPOOL_VLLM_STRICT=1 but {VLLM_MISSING}")
