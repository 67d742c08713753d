"""A pytest plugin for vLLM's own tests on this machine, loaded in the stock
and the kvpool run alike (``.ci/vllm-own-tests.sh``): from 0.34, vLLM's CPU
platform refuses to build any ``VllmConfig`` on an x86 CPU without Triton's
CPU backend (``CpuPlatform.check_and_update_config``: "vLLM on x86 CPUs
requires Triton (triton-cpu)"), which the package index does not have. The
scheduler-side tests build configs and schedulers, never a kernel, so the
check is answered as if Triton were there: ``vllm.triton_utils.HAS_TRITON``
(the name the check imports when it runs) is set True when it is False, and
the header says so. Only where that check refuses (0.34 on: 0.33 warns, and
another of its paths reads the name); nothing else changes.
"""

from __future__ import annotations

import inspect

import pytest

_SET: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    try:
        import vllm.triton_utils as triton_utils
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:
        return
    # Only where the check refuses (0.34 on; 0.33 warns): elsewhere the name
    # may steer other choices, and nothing needs it set.
    try:
        check = inspect.getsource(CpuPlatform.check_and_update_config)
    except (OSError, TypeError):
        return
    if "requires Triton" in check and getattr(triton_utils, "HAS_TRITON", True) is False:
        triton_utils.HAS_TRITON = True
        _SET.append("vllm.triton_utils.HAS_TRITON")


def pytest_report_header(config: pytest.Config) -> str:
    if _SET:
        return f"cpu_without_triton: {', '.join(_SET)} set True (no triton-cpu here)"
    return "cpu_without_triton: nothing changed"
