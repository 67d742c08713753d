"""``kvpool.vllm.install()``, without ``force``, on this release: it is
accepted, and what its line says goes in -- the line's pool under the name
vLLM's coordinator builds it through, the line's ``KVCacheManager`` under the
scheduler's name (for a line that has one, with the compiled core), and
kvpool's request block hasher under the engine core's (every line:
``VLLMLine.hasher``; where the engine core imports here) -- and ``uninstall()`` puts vLLM's own
back. A release CI lists must never need ``force``."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys

import pytest
import vllm

import kvpool
from kvpool import vllm as kv_vllm
from kvpool.vllm.__main__ import report


def _engine_core():
    try:
        return importlib.import_module("vllm.v1.engine.core")
    except ImportError:  # an engine core that cannot import in this environment
        return None


def test_the_installed_code_is_this_releases():
    """The release's mirrored files are the ones kvpool recorded for it
    (``_release_digests``, from its sdist), so install() accepts its code."""
    from kvpool.vllm import digests, intake_alias
    from kvpool.vllm._release_digests import RELEASE_DIGESTS

    if intake_alias() is not None:
        pytest.skip("the release intake: a release kvpool has no digests of yet")
    got = digests.installed_digests()
    assert tuple(got[p] for p, _ in digests.MIRRORED) == RELEASE_DIGESTS[vllm.__version__]
    assert digests.identify(got).release in kv_vllm.vllm_line(vllm.__version__).releases


def test_install_puts_in_what_the_line_says(monkeypatch):
    # (KVPOOL_VLLM_INTAKE is left as it is: the intake runs this test too)
    for name in ("KVPOOL_VLLM", "KVPOOL_VLLM_MANAGER", "KVPOOL_VLLM_HASHER"):
        monkeypatch.delenv(name, raising=False)
    line = kv_vllm.vllm_line()  # raises for a release kvpool does not list
    series = re.match(r"(\d+)\.(\d+)", vllm.__version__)
    if (int(series[1]), int(series[2])) >= (0, 30):
        assert line.manager is not None, f"the {line.name} line lost its KVCacheManager"
    coordinator = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    scheduler = importlib.import_module("vllm.v1.core.sched.scheduler")
    engine_core = _engine_core()
    vllm_pool, vllm_manager = coordinator.BlockPool, scheduler.KVCacheManager
    vllm_hasher = getattr(engine_core, "get_request_block_hasher", None)
    said = report()  # python -m kvpool.vllm's verdict, checked against what goes in
    assert said["status"] == "listed" and said["line"]["name"] == line.name, said
    assert said["pool"]["kvpool"]

    assert kv_vllm.install() is True
    try:
        assert coordinator.BlockPool is line.block_pool()
        manager = scheduler.KVCacheManager
        if line.manager is not None and kvpool.USING_EXTENSION:
            assert manager is importlib.import_module(line.manager).KVCacheManager
        else:
            assert manager is vllm_manager
        assert said["manager"]["kvpool"] == (manager is not vllm_manager), said["manager"]
        if engine_core is not None and hasattr(engine_core, "get_request_block_hasher"):
            from kvpool.vllm.hasher import get_request_block_hasher

            ours = engine_core.get_request_block_hasher is get_request_block_hasher
            assert ours == (line.hasher and kvpool.USING_EXTENSION), (vllm.__version__, ours)
            assert said["hasher"]["kvpool"] == ours, said["hasher"]
    finally:
        assert kv_vllm.uninstall() is True
    assert coordinator.BlockPool is vllm_pool
    assert scheduler.KVCacheManager is vllm_manager
    if vllm_hasher is not None:
        assert engine_core.get_request_block_hasher is vllm_hasher


def test_the_release_is_listed():
    if not any(vllm.__version__ in line.releases for line in kv_vllm.VLLM_LINES):
        pytest.skip(f"vLLM {vllm.__version__} runs here as another release's (the intake)")
    assert kv_vllm.check_vllm_version() == vllm.__version__


def test_python_m_kvpool_vllm_says_listed(tmp_path):
    """The command a user runs: exit 0 and this release's line, from vLLM
    imported (not asked about)."""
    result = subprocess.run([sys.executable, "-m", "kvpool.vllm", "--json"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, (result.stdout, result.stderr[-2000:])
    said = json.loads(result.stdout)
    assert said["vllm"] == vllm.__version__ and said["vllm_path"]
    assert said["line"]["name"] == kv_vllm.vllm_line().name


def test_python_m_kvpool_vllm_refuses_an_unlisted_release(tmp_path):
    """The same command on this vLLM made unlisted (the engine tests'
    ``sitecustomize`` takes the release out of the registry at start-up, as
    for one published after kvpool): exit 2, the release named, nothing
    installed."""
    import os
    from pathlib import Path

    unlisted = Path(__file__).resolve().parent.parent / "engine" / "unlisted_release"
    env = dict(os.environ, KVPOOL_ENGINE_UNLISTED=vllm.__version__,
               PYTHONPATH=os.pathsep.join([str(unlisted), os.environ.get("PYTHONPATH", "")]))
    env.pop("KVPOOL_VLLM_INTAKE", None)
    result = subprocess.run([sys.executable, "-m", "kvpool.vllm", "--json"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 2, (result.stdout, result.stderr[-2000:])
    said = json.loads(result.stdout)
    assert said["status"] == "refused" and said["vllm"] == vllm.__version__
    assert f"vLLM {vllm.__version__} here is not the code of a release kvpool lists" in said["refused"]
    assert said["pool"] is None and said["manager"] is None and said["hasher"] is None
