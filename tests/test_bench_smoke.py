"""Smoke run of the benchmark script (``python -m kvpool.bench``), so that it
cannot break unnoticed. Tiny sizes, one round; it checks that every operation
produced a result for every core, never how fast anything is."""

from __future__ import annotations

import importlib.util
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
            op = bench._BY_ID[op_id]
            if op.scale is None:  # the same workload in every mode: judged
                assert row["ok"] in (True, False) and row["not_judged"] is None, row
            else:  # --smoke sizes are never the targets' sizes
                assert row["ok"] is None and row["not_judged"], row

    for key in cores:
        assert result["extra"]["trace_replay"][key]["blocks_allocated"] > 0


def _settings(mode: str, **sizes: int) -> bench.Settings:
    return bench.Settings(**{**bench.Settings.for_mode(mode).__dict__, **sizes})


def _cells(pure: float, compiled: float) -> dict[str, bench.Cell]:
    return {"pure": bench.Cell([pure, pure]), "compiled": bench.Cell([compiled, compiled])}


def test_size_dependent_rows_declare_their_scale() -> None:
    # A row whose workload depends on a mode's sizes: the fresh-interpreter
    # rows (pool size) and the trace rows (trace length). Each must say the
    # size its target is stated for, and the full run must measure at it.
    full = bench.Settings.for_mode("full")
    for op in bench.OPERATIONS:
        sized = op.in_subprocess or op.id.startswith("trace")
        assert (op.scale is not None) == sized, op.id
        if op.scale is not None:
            assert op.scale.holds_for(full), op.id


@pytest.mark.parametrize("line", ["0.15", "0.33"])
@pytest.mark.parametrize("mode", ["quick", "smoke"])
def test_size_dependent_row_not_judged_at_another_size(line: str, mode: str) -> None:
    # A figure that misses every target (pure 1, compiled 1000: ratio 0.001,
    # 1000 B/block) must not be judged at --quick/--smoke sizes, and must be
    # judged (and miss) at the size its target is stated for.
    monkey_line, bench._line = bench._line, line
    try:
        for op in bench.OPERATIONS:
            if op.target_for(line) is None:
                continue
            small = bench._row(op, _cells(1.0, 1000.0), bench.Settings.for_mode(mode))
            full = bench._row(op, _cells(1.0, 1000.0), bench.Settings.for_mode("full"))
            assert full["ok"] is False and full["not_judged"] is None, op.id
            if op.scale is None:
                assert small["ok"] is False, op.id
            else:
                assert small["ok"] is None, op.id
                assert small["not_judged"] == f"target at {op.scale.text}", op.id
            summary = bench.target_summary([small])
            assert (op.id in summary["not_judged"]) == (op.scale is not None), op.id
            assert (op.id in summary["missed"]) == (op.scale is None), op.id
    finally:
        bench._line = monkey_line


def test_gc_row_at_quick_size_is_not_judged() -> None:
    # The report that started this: --quick measured gc.collect() at 200,000
    # blocks, where an idle collection dominates, and printed MISS against a
    # target stated for 1,000,000.
    op = bench._BY_ID["gc_collect"]
    quick = bench.Settings.for_mode("quick")
    assert quick.subprocess_blocks != bench.AT_1M_BLOCKS.value
    row = bench._row(op, _cells(20.0, 6.0), quick)
    assert row["ok"] is None and row["not_judged"] == "target at 1M blocks"
    at_1m = bench._row(op, _cells(20.0, 6.0), _settings("quick", subprocess_blocks=1_000_000))
    assert at_1m["ok"] is False  # 3.3x < 15x: judged once measured at 1M blocks


def test_table_says_a_row_is_not_judged() -> None:
    # The printed table and its summary line, from a real (tiny) run of the
    # gc.collect() row and one row judged in every mode.
    result = bench.run(bench.Settings.for_mode("smoke"), only=["gc_collect", "queue_remove_append"])
    table = bench.format_table(result)
    [gc_line] = [x for x in table.splitlines() if x.startswith("| gc.collect() with")]
    assert "n/a (target at 1M blocks)" in gc_line and "MISS" not in gc_line
    assert result["targets"]["not_judged"] == ["gc_collect"]
    [summary] = [x for x in table.splitlines() if x.startswith("Targets:")]
    assert summary.endswith("1 not judged, measured at another size than their target "
                            "is stated for: gc_collect."), summary


def _engine_bench():
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_vllm_engine.py"
    if not script.exists():
        pytest.skip("the benchmarks are not beside the tests (a wheel's test run)")
    spec = importlib.util.spec_from_file_location("bench_vllm_engine", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_engine_bench_call_sites(tmp_path: Path) -> None:
    """``bench_vllm_engine.py --sample``'s call sites: the calls into the
    manager in vLLM's ``v1/core/sched``, at the method name's line and the
    call's first line; other calls are not sites."""
    sched = tmp_path / "v1" / "core" / "sched"
    sched.mkdir(parents=True)
    (sched / "scheduler.py").write_text(
        "def schedule(self, req, blocks):\n"                                   # 1
        "    new = self.kv_cache_manager.allocate_slots(\n"                   # 2
        "        req, 1)\n"                                                    # 3
        "    ids = blocks[req].get_block_ids(allow_none=True)\n"               # 4
        "    x = (self.kv_cache_manager.coordinator\n"                        # 5
        "         .get_num_blocks_to_allocate(req))\n"                        # 6
        "    self.requests.pop(req)\n"                                         # 7
        "    return self.kv_cache_manager.usage\n")                           # 8
    sites = _engine_bench().manager_call_sites(str(tmp_path))
    rel = "v1/core/sched/scheduler.py"
    assert sites == {(rel, 2): "allocate_slots", (rel, 4): "get_block_ids",
                     (rel, 5): "get_num_blocks_to_allocate",
                     (rel, 6): "get_num_blocks_to_allocate"}


def test_engine_bench_sample_shares() -> None:
    """``bench_vllm_engine.py --sample``'s count of a py-spy raw file: only
    samples inside the generate loop count; a sample is the manager's when a
    frame below the loop is in vLLM's manager modules or kvpool's Python
    (never its request hasher), or when its innermost frame stands at a call
    site (a compiled method running); the entry is the outermost manager
    frame, or the call site's method."""
    engine_bench = _engine_bench()
    kvdir = engine_bench.KVPOOL_DIR
    llm = "/env/lib/python3.11/site-packages/vllm/entrypoints/llm.py"
    sched_file = "/env/site-packages/vllm/v1/core/sched/scheduler.py"
    sched = f"Scheduler.schedule ({sched_file}:300)"
    loop = f"main (/w/engine_run.py:419);LLM.generate ({llm}:400);LLMEngine.step (/env/vllm/v1/engine/llm_engine.py:10)"
    sites = {("v1/core/sched/scheduler.py", 778): "allocate_slots",
             ("v1/core/sched/scheduler.py", 1735): "get_block_ids"}
    raw = "\n".join([
        # compiled calls: the scheduler's frame at a call site
        f"{loop};Scheduler.schedule ({sched_file}:778) 7",
        f"{loop};Scheduler.schedule ({sched_file}:1735) 1",
        # kvpool's Python side, then vLLM's pool under it: one entry, the outer
        f"{loop};{sched};KVCacheManager33.take_events ({kvdir}vllm/manager.py:50);"
        f"take_events (/env/vllm/v1/core/block_pool.py:9) 2",
        # vLLM's own manager (the stock side), entered from a call site
        f"{loop};Scheduler.schedule ({sched_file}:778);KVCacheManager.allocate_slots (/env/vllm/v1/core/kv_cache_manager.py:250) 5",
        # kvpool's request hasher is not the manager
        f"{loop};append_output_token_ids (/env/vllm/v1/request.py:5);"
        f"hash_block ({kvdir}vllm/hasher.py:40) 3",
        # a call site's line in another file, or deeper than the innermost frame
        f"{loop};update ({sched_file.replace('scheduler', 'output')}:778) 4",
        f"{loop};Scheduler.schedule ({sched_file}:778);__len__ (/env/vllm/v1/request.py:1) 6",
        # the scheduler and the model: in the loop, not the manager
        f"{loop};{sched} 11",
        f"{loop};forward (/env/torch/nn/modules/module.py:1) 20",
        # outside the generate loop (start-up, another thread): not counted
        "main (/w/engine_run.py:380);__init__ (/env/vllm/v1/core/kv_cache_manager.py:60) 40",
        "run (/w/engine_run.py:72);recv (/env/zmq/sugar/socket.py:1) 9",
        "",
    ])
    got = engine_bench.sample_shares(raw, sites)
    assert got == {"loop": 59, "manager": 15,
                   "entries": {"allocate_slots": 12, "take_events": 2, "get_block_ids": 1}}
    # the pooled share over runs, with the binomial's 95% interval
    assert engine_bench.pooled([15, 5], [59, 41]) == "20.00% [12.16-27.84] (20 of 100)"
