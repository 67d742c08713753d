"""Start one engine run (``engine_run.py``) in a process of its own and read
its result: shared by the engine tests and the engine benchmarks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent


class EngineRunFailed(RuntimeError):
    """The engine process exited with an error (its output is in the message)."""


def engine_env(*, kvpool: bool, kv_cache_gib: int = 1, **extra: str) -> dict[str, str]:
    """This process's environment without any ``KVPOOL_`` setting, offline, with
    ``KVPOOL_VLLM=1`` if ``kvpool`` (the plugin path) and ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib), PYTHONHASHSEED="0")
    if kvpool:
        env["KVPOOL_VLLM"] = "1"
    env.update(extra)
    return env


def command(model_dir: Path, scenario: dict, work: Path) -> tuple[list[str], Path]:
    """Write ``scenario`` into ``work`` and return the command that runs it and
    the path its result will be written to."""
    work.mkdir(parents=True, exist_ok=True)
    scenario_file = work / "scenario.json"
    scenario_file.write_text(json.dumps(scenario))
    out = work / "out.json"
    return [sys.executable, str(HERE / "engine_run.py"), str(model_dir), str(scenario_file),
            str(out)], out


def run(model_dir: Path, scenario: dict, work: Path, env: dict[str, str], *,
        stream: bool = False, timeout: float | None = 1800,
        wrap: Sequence[str] = ()) -> dict:
    """Run ``engine_run.py`` on ``scenario`` in ``work`` and return its JSON result
    (with ``profile``: the path of its cProfile dump, if it wrote one). With
    ``stream`` its standard output (the waves' progress) goes to this one's;
    ``wrap`` is a command the run is started under (a sampling profiler)."""
    argv, out = command(model_dir, scenario, work)
    argv = [*wrap, *argv]
    with open(work / "stderr.txt", "w") as err:
        proc = subprocess.run(
            argv, env=env, cwd=work, stdout=None if stream else subprocess.PIPE, stderr=err,
            text=True, timeout=timeout)
    if proc.returncode != 0:
        raise EngineRunFailed(f"engine run failed (exit {proc.returncode}):\n"
                              f"{(proc.stdout or '')[-3000:]}\n"
                              f"{(work / 'stderr.txt').read_text()[-6000:]}")
    result = json.loads(out.read_text())
    profile = out.with_suffix(".prof")
    result["profile"] = str(profile) if profile.exists() else None
    return result
