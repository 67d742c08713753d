"""``benchmarks/count_decode_instructions.py``'s child runs (the counted loop,
without valgrind): each side's calls are the steady decode the script says
they are, and a run whose calls are not refuses to count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "count_decode_instructions.py"


def _child(side: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if not SCRIPT.exists():
        pytest.skip("the benchmarks are not beside the tests")
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--child", side, "2", "--requests", "8", *extra],
        check=False, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("side", ["vllm", "kvpool", "empty"])
def test_child_counts_steady_decode(side: str) -> None:
    proc = _child(side)
    assert proc.returncode == 0, proc.stderr
    check = json.loads(proc.stdout)
    assert check["calls"] == check["no_new_block"] == 2 * 2 * 8
    if side == "kvpool":
        assert check["compiled"] == check["cache_skips"] == check["calls"]


def test_child_refuses_vllms_manager_as_kvpools() -> None:
    # KVPOOL_VLLM_MANAGER=0: vLLM's manager over kvpool's pool, not the side named.
    proc = _child("kvpool", env={"KVPOOL_VLLM_MANAGER": "0"})
    assert proc.returncode != 0
    assert "kvpool's manager is not in" in proc.stderr


def test_child_refuses_calls_that_are_not_steady_decode() -> None:
    # A prompt of two full blocks: each request's first decode call takes a
    # new block.
    for side in ("vllm", "kvpool"):
        proc = _child(side, "--prompt", "32")
        assert proc.returncode != 0
        assert "8 of 32 calls allocated a block: not a steady decode" in proc.stderr
