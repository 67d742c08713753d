"""``kvpool.vllm.install()``, without ``force``, on this release: it is
accepted, and what its line says goes in -- the line's pool under the name
vLLM's coordinator builds it through, the line's ``KVCacheManager`` under the
scheduler's name (for a line that has one, with the compiled core), and
kvpool's request block hasher under the engine core's (for a hasher line,
where the engine core imports here) -- and ``uninstall()`` puts vLLM's own
back. A release CI lists must never need ``force``."""

from __future__ import annotations

import importlib
import re

import pytest
import vllm

import kvpool
from kvpool import vllm as kv_vllm
from kvpool.vllm_hasher import SUPPORTED_VLLM_LINES


def _engine_core():
    try:
        return importlib.import_module("vllm.v1.engine.core")
    except ImportError:  # an engine core that cannot import in this environment
        return None


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

    assert kv_vllm.install() is True
    try:
        assert coordinator.BlockPool is line.block_pool()
        manager = scheduler.KVCacheManager
        if line.manager is not None and kvpool.USING_EXTENSION:
            assert manager is importlib.import_module(line.manager).KVCacheManager
        else:
            assert manager is vllm_manager
        hasher_line = (int(series[1]), int(series[2])) in SUPPORTED_VLLM_LINES
        if engine_core is not None and hasattr(engine_core, "get_request_block_hasher"):
            from kvpool.vllm_hasher import get_request_block_hasher

            ours = engine_core.get_request_block_hasher is get_request_block_hasher
            assert ours == (hasher_line and kvpool.USING_EXTENSION), (vllm.__version__, ours)
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
