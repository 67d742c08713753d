"""Smoke run of the benchmark script (``python -m kvpool.bench``), so that it
cannot break unnoticed. Tiny sizes, one round; it checks that every operation
produced a result for every core, never how fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvpool
from kvpool import bench


@pytest.mark.parametrize("line", ["0.15", "0.33"])
def test_bench_script_smoke(no_c_extensions: bool, line: str) -> None:
    # Run the kvpool under test (installed or in place): ``-m`` puts the
    # working directory first on sys.path, so start from the package's parent.
    pkg_parent = Path(kvpool.__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "kvpool.bench", "--quick", "--smoke", "--json", "--line", line],
        capture_output=True, text=True, cwd=pkg_parent, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[kvpool.bench]" in proc.stderr  # progress goes to stderr
    result = json.loads(proc.stdout)
    assert result["line"] == line

    cores = ["pure"] if no_c_extensions else ["pure", "compiled"]
    for key in cores:
        assert result["cores"][key]["available"], result["cores"][key]["error"]
    assert result["errors"] == []
    assert result["settings"]["rounds"] == 1

    rows = {row["id"]: row for row in result["operations"]}
    assert set(rows) == {op.id for op in bench.OPERATIONS}
    for op_id, row in rows.items():
        for key in cores:
            median = row[key]["median"]
            if op_id == "memory_rss":  # resident-set growth may round to 0
                assert median is None or median >= 0, (op_id, key, median)
            else:
                assert median is not None and median > 0, (op_id, key, median)
        if row["target"] is not None and not no_c_extensions:
            assert row["ok"] in (True, False)  # judged, whatever the verdict

    for key in cores:
        assert result["extra"]["trace_replay"][key]["blocks_allocated"] > 0
