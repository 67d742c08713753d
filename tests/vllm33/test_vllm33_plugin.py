"""kvpool's ``vllm.general_plugins`` entry point under vLLM 0.33's own plugin
loader (``vllm.plugins.load_general_plugins``, which vLLM runs in its front
end, engine core and workers)."""

from __future__ import annotations

import logging
import os

import pytest
import vllm
import vllm.plugins
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_coordinator, single_type_kv_cache_manager

import kvpool
import kvpool.vllm as kv_vllm
from _vllm_helpers import kvpool_entry_point, pretend_code
VLLM_POOL = vllm_block_pool.BlockPool
# The 0.33 facade is written on another branch; until it is here, the test
# that needs it checks that the plugin gets as far as importing it.


def _load_general_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a fresh vLLM process does: the loader runs once per process, so
    reset its flag; an unset VLLM_PLUGINS lets every plugin in."""
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    vllm.plugins.load_general_plugins()


def test_installed_vllm_is_the_0_33_line() -> None:
    assert kv_vllm.check_vllm_version() == vllm.__version__
    line = kv_vllm.vllm_line()
    assert (line.name, line.module) == ("0.33", "kvpool.v0_33")


def test_loader_runs_kvpool_entry_point(monkeypatch) -> None:
    ep = kvpool_entry_point()
    assert ep.value == "kvpool.vllm:plugin"
    calls = []
    # The loader resolves the entry point by attribute at load time, so it
    # finds the spy.
    monkeypatch.setattr(kv_vllm, "plugin", lambda: calls.append("kvpool"))
    _load_general_plugins(monkeypatch)
    assert calls == ["kvpool"]


@pytest.mark.parametrize("value", [None, "", "0", "no"])
def test_plugin_does_nothing_unless_asked(value, monkeypatch) -> None:
    kvpool_entry_point()
    if value is not None:
        monkeypatch.setenv("KVPOOL_VLLM", value)
    _load_general_plugins(monkeypatch)
    assert not kv_vllm.is_installed()
    assert kv_cache_coordinator.BlockPool is VLLM_POOL


def test_plugin_installs_the_0_33_pool(monkeypatch) -> None:
    """KVPOOL_VLLM=1: the loader installs kvpool.v0_33.BlockPool, and a
    KVCacheManager built afterwards runs on it."""
    kvpool_entry_point()
    monkeypatch.setenv("KVPOOL_VLLM", "1")
    from kvpool.v0_33 import BlockPool as Facade
    from kvpool.vllm import vllm_block_pool_class

    BlockPool = vllm_block_pool_class("0.33")
    assert issubclass(BlockPool, Facade)

    _load_general_plugins(monkeypatch)
    assert kv_vllm.is_installed()
    assert kv_cache_coordinator.BlockPool is BlockPool
    assert single_type_kv_cache_manager.BlockPool is BlockPool
    assert vllm_block_pool.BlockPool is VLLM_POOL
    assert type(_small_manager().block_pool) is BlockPool


def test_plugin_auto_installs_the_0_33_pool_and_manager(monkeypatch, caplog) -> None:
    """KVPOOL_VLLM=auto on 0.33.0, a listed release: what ``1`` installs (pool
    and manager), no warning, ``auto`` exported to the processes vLLM starts."""
    from vllm.v1.core.sched import scheduler

    from kvpool.vllm import vllm_block_pool_class

    kvpool_entry_point()
    monkeypatch.setenv("KVPOOL_VLLM", "auto")
    with caplog.at_level(logging.INFO, logger="kvpool"):
        _load_general_plugins(monkeypatch)
    assert kv_vllm.is_installed()
    assert kv_cache_coordinator.BlockPool is vllm_block_pool_class("0.33")
    if kvpool.USING_EXTENSION:  # (kvpool's manager is compiled only)
        assert scheduler.KVCacheManager.__module__ == "kvpool.v0_33.kv_cache_manager"
    assert os.environ["KVPOOL_VLLM"] == "auto"
    assert not [r for r in caplog.records if r.name.startswith("kvpool") and r.levelno >= logging.WARNING]


def test_plugin_auto_on_an_unlisted_release(monkeypatch, caplog) -> None:
    """A vLLM kvpool does not know (0.33.0 pretending to be a 0.35.0 build
    whose manager differs), through
    vLLM's loader: with ``auto``, one WARNING and vLLM's own pool, manager
    and hasher; with ``1``, the error that stops vLLM's start."""
    from vllm.v1.core.sched import scheduler
    from vllm.v1.engine import core

    kvpool_entry_point()
    vllm_manager, vllm_hasher = scheduler.KVCacheManager, core.get_request_block_hasher
    pretend_code(monkeypatch, "0.35.0", changed="v1/core/kv_cache_manager.py")
    monkeypatch.setenv("KVPOOL_VLLM", "auto")
    with caplog.at_level(logging.INFO, logger="kvpool"):
        _load_general_plugins(monkeypatch)
    assert not kv_vllm.is_installed()
    assert kv_cache_coordinator.BlockPool is VLLM_POOL
    assert scheduler.KVCacheManager is vllm_manager
    assert core.get_request_block_hasher is vllm_hasher
    records = [r for r in caplog.records if r.name.startswith("kvpool")]
    assert [r.levelname for r in records] == ["WARNING"]
    assert records[0].getMessage().startswith("kvpool left out: vLLM 0.35.0 ")

    monkeypatch.setenv("KVPOOL_VLLM", "1")
    with pytest.raises(kv_vllm.UnsupportedVLLMVersionError, match="vllm/v1/core/kv_cache_manager.py differs"):
        _load_general_plugins(monkeypatch)
    assert kv_cache_coordinator.BlockPool is VLLM_POOL
    assert scheduler.KVCacheManager is vllm_manager


def _small_manager():
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16
    )
    config = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=["layer.0"], kv_cache_spec=spec)],
    )
    return KVCacheManager(
        config,
        max_model_len=1024,
        scheduler_block_size=16,
        hash_block_size=16,
        enable_caching=True,
        enable_kv_cache_events=True,
    )
