"""The manager differential test for whichever vLLM release is importable
(``test_release_manager.py``). It runs in the *overlay environment*: the
cached vLLM 0.33.0 test environment with the release's own Python tree
(``.ci/vllm-src.sh VERSION``) first on ``PYTHONPATH``;
``.ci/vllm-mgr-all.sh`` runs it so for each release. Anywhere vLLM's
KV-cache manager is not importable the directory is skipped, with the
reason in pytest's summary; ``KVPOOL_VLLM_STRICT=1`` turns that skip, and a
release without a kvpool line, into failures.
"""

from __future__ import annotations

import logging
import os
import sys

import pytest
from _vllm_helpers import STRICT, check_expected_release, check_strict_core
from _vllm_helpers import no_leftover_install as no_leftover_install  # autouse

# The scheduler differential (test_release_scheduler.py) builds vLLM
# configs, which infer a device: this machine's CPU (set before vLLM loads
# its platform).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# The two manager drivers, importable by module name (as in their own
# directories).
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _driver_dir in ("vllm33", "vllm"):
    _path = os.path.join(_TESTS, _driver_dir)
    if _path not in sys.path:
        sys.path.insert(0, _path)

try:
    # Not just ``import vllm``: a checkout's tests/vllm directory on sys.path
    # would satisfy that as an empty namespace package.
    import vllm.v1.core.kv_cache_manager  # noqa: F401
except ImportError as exc:
    VLLM_MISSING = (
        f"vLLM is not importable here ({exc}); these tests run in the overlay "
        f"environment (see .ci/vllm-mgr-all.sh)"
    )
else:
    VLLM_MISSING = ""


class _SkippedModule(pytest.Module):
    """Stands in for a test module when vLLM is missing: collecting it is a
    skip with the reason (the module, which imports vLLM, is never
    imported)."""

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
    check_expected_release()


@pytest.fixture(autouse=True)
def _quiet_pools() -> None:
    # Refused busy resets log a warning per call on both pools.
    for name in ("vllm.v1.core.block_pool", "kvpool"):
        logging.getLogger(name).setLevel(logging.ERROR)
