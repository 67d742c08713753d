"""Tests against a real vLLM 0.15.x. They run in the environment that
``.ci/vllm-env.sh`` builds (``.ci/vllm-tests.sh`` does both); anywhere vLLM's
KV-cache manager is not importable the whole directory is skipped, with the
reason in pytest's summary.

``KVPOOL_VLLM_STRICT=1`` (set by ``.ci/vllm-tests.sh``) turns what would be a
skip or a quiet fallback into a failure: the compiled core must be loaded and
kvpool's ``vllm.general_plugins`` entry point must be installed.
"""

from __future__ import annotations

import logging
import os

import pytest
from _vllm_helpers import STRICT, check_strict_core
from _vllm_helpers import no_leftover_install as no_leftover_install  # autouse

try:
    # Not just ``import vllm``: a checkout's tests/vllm directory on sys.path
    # would satisfy that as an empty namespace package.
    import vllm.v1.core.kv_cache_manager  # noqa: F401
except ImportError as exc:
    VLLM_MISSING = (
        f"vLLM 0.15.x is not importable here ({exc}); these tests run in the "
        f"environment built by .ci/vllm-env.sh (see .ci/vllm-tests.sh)"
    )
else:
    VLLM_MISSING = ""


class _SkippedModule(pytest.Module):
    """Stands in for a test module of this directory when vLLM is missing:
    collecting it is a skip with the reason (the module itself, which
    imports vLLM, is never imported)."""

    def collect(self):
        pytest.skip(VLLM_MISSING)


def pytest_pycollect_makemodule(module_path, parent):
    if VLLM_MISSING:
        return _SkippedModule.from_parent(parent, path=module_path)
    return None


def pytest_report_header(config: pytest.Config) -> list[str]:
    if VLLM_MISSING:
        return [VLLM_MISSING]
    import vllm

    import kvpool

    return [
        f"vllm {vllm.__version__} ({os.path.dirname(vllm.__file__)})",
        (
            f"kvpool {kvpool.__version__} ({os.path.dirname(kvpool.__file__)}), "
            f"core: {'compiled' if kvpool.USING_EXTENSION else 'pure-Python'}"
        ),
    ]


def pytest_sessionstart(session: pytest.Session) -> None:
    if VLLM_MISSING:
        if STRICT:
            raise pytest.UsageError(f"KVPOOL_VLLM_STRICT=1 but {VLLM_MISSING}")
        return
    check_strict_core()


@pytest.fixture(autouse=True)
def _quiet_pools() -> None:
    # Refused busy resets log a warning per call on both pools; keep the
    # output readable.
    for name in ("vllm.v1.core.block_pool", "kvpool.block_pool"):
        logging.getLogger(name).setLevel(logging.ERROR)
