"""``kvpool.vllm``: install/uninstall, the context manager, the
``vllm.general_plugins`` entry point and the version check, against a real
vLLM 0.15.x."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
import vllm
import vllm.plugins
import vllm_workload as vw
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_coordinator, single_type_kv_cache_manager

import kvpool
import kvpool.vllm as kv_vllm

STRICT = os.environ.get("KVPOOL_VLLM_STRICT") == "1"
SMALL = vw.FULL.scaled(num_requests=20, num_blocks=64)
VLLM_POOL = vllm_block_pool.BlockPool


def manager_pool_type() -> type:
    return type(vw.make_manager(SMALL).block_pool)


def test_vllm_is_the_supported_line() -> None:
    assert vllm.__version__.startswith("0.15.")
    assert kv_vllm.check_vllm_version() == vllm.__version__


def test_install_uninstall_roundtrip() -> None:
    assert manager_pool_type() is VLLM_POOL
    assert not kv_vllm.is_installed()

    assert kv_vllm.install() is True
    assert kv_vllm.is_installed()
    # Exported for the engine processes vLLM may spawn.
    assert os.environ["KVPOOL_VLLM"] == "1"
    assert kv_cache_coordinator.BlockPool is kvpool.BlockPool
    assert single_type_kv_cache_manager.BlockPool is kvpool.BlockPool
    # vLLM's own class stays importable where it is defined.
    assert vllm_block_pool.BlockPool is VLLM_POOL
    mgr = vw.make_manager(SMALL)
    assert type(mgr.block_pool) is kvpool.BlockPool
    assert type(mgr.block_pool.null_block) is kvpool.KVCacheBlock

    assert kv_vllm.install() is False  # idempotent
    assert kv_cache_coordinator.BlockPool is kvpool.BlockPool

    assert kv_vllm.uninstall() is True
    assert "KVPOOL_VLLM" not in os.environ
    assert kv_cache_coordinator.BlockPool is VLLM_POOL
    assert single_type_kv_cache_manager.BlockPool is VLLM_POOL
    assert kv_vllm.uninstall() is False
    assert manager_pool_type() is VLLM_POOL
    # A manager built while installed keeps its pool.
    assert type(mgr.block_pool) is kvpool.BlockPool


def test_context_manager_nests() -> None:
    with kv_vllm.enabled():
        assert manager_pool_type() is kvpool.BlockPool
        with kv_vllm.enabled():
            assert manager_pool_type() is kvpool.BlockPool
        # The inner block did not install, so it must not uninstall.
        assert manager_pool_type() is kvpool.BlockPool
    assert manager_pool_type() is VLLM_POOL


def test_context_manager_restores_on_error() -> None:
    with pytest.raises(KeyError), kv_vllm.enabled():
        raise KeyError("boom")
    assert manager_pool_type() is VLLM_POOL


@pytest.mark.parametrize("version", ["0.14.1", "0.16.0", "1.15.0", "0.1.5", "garbage"])
def test_version_refused(version: str, monkeypatch) -> None:
    with pytest.raises(kv_vllm.UnsupportedVLLMVersionError) as info:
        kv_vllm.check_vllm_version(version)
    assert f"found vLLM {version}" in str(info.value)
    assert "0.15.x" in str(info.value)

    monkeypatch.setattr(vllm, "__version__", version)
    with pytest.raises(
        kv_vllm.UnsupportedVLLMVersionError, match=f"found vLLM {version}"
    ):
        kv_vllm.install()
    assert not kv_vllm.is_installed()
    assert kv_cache_coordinator.BlockPool is VLLM_POOL
    with pytest.raises(kv_vllm.UnsupportedVLLMVersionError), kv_vllm.enabled():
        pass
    monkeypatch.setenv("KVPOOL_VLLM", "1")
    with pytest.raises(kv_vllm.UnsupportedVLLMVersionError):
        kv_vllm.plugin()
    assert kv_cache_coordinator.BlockPool is VLLM_POOL

    # force=True (KVPOOL_VLLM=force for the plugin) is the documented escape
    # hatch; it is exported as such to child processes.
    assert kv_vllm.install(force=True) is True
    assert manager_pool_type() is kvpool.BlockPool
    assert os.environ["KVPOOL_VLLM"] == "force"
    assert kv_vllm.uninstall() is True
    assert os.environ["KVPOOL_VLLM"] == "1"  # what the test had set
    monkeypatch.setenv("KVPOOL_VLLM", "force")
    kv_vllm.plugin()
    assert manager_pool_type() is kvpool.BlockPool


@pytest.mark.parametrize(
    "version", ["0.15.0", "0.15.1", "0.15.2rc1", "0.15.1+cu129", "0.15.3.dev7"]
)
def test_version_accepted(version: str) -> None:
    assert kv_vllm.check_vllm_version(version) == version


@pytest.mark.parametrize("value", [None, "", "0", "no"])
def test_plugin_does_nothing_unless_asked(value, monkeypatch) -> None:
    if value is None:
        monkeypatch.delenv("KVPOOL_VLLM", raising=False)
    else:
        monkeypatch.setenv("KVPOOL_VLLM", value)
    kv_vllm.plugin()
    assert not kv_vllm.is_installed()
    assert manager_pool_type() is VLLM_POOL


def _kvpool_entry_point():
    for ep in importlib.metadata.entry_points(group="vllm.general_plugins"):
        if ep.name == "kvpool":
            return ep
    if STRICT:
        pytest.fail("kvpool's vllm.general_plugins entry point is not installed")
    pytest.skip(
        "kvpool is not pip-installed here (no vllm.general_plugins entry point)"
    )


def test_entry_point_declared() -> None:
    ep = _kvpool_entry_point()
    assert ep.value == "kvpool.vllm:plugin"
    assert ep.load() is kv_vllm.plugin


def test_plugin_via_vllm_loader(monkeypatch) -> None:
    """vLLM's own loader (as its engine and workers call it) installs kvpool
    when KVPOOL_VLLM=1."""
    _kvpool_entry_point()
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setenv("KVPOOL_VLLM", "1")
    vllm.plugins.load_general_plugins()
    assert kv_vllm.is_installed()
    assert manager_pool_type() is kvpool.BlockPool


def _pool_module_in_child(env: dict[str, str]) -> str:
    """The module of the pool a manager gets in a new interpreter that loads
    vLLM's general plugins, as an engine-core process does at start."""
    script = textwrap.dedent(
        """
        import vllm.plugins
        import vllm_workload as vw
        vllm.plugins.load_general_plugins()
        pool = vw.make_manager(vw.FULL.scaled(num_blocks=64)).block_pool
        print(type(pool).__module__)
        """
    )
    env = dict(env, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    env.pop("VLLM_PLUGINS", None)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_plugin_in_fresh_process() -> None:
    """End to end: only the environment variable differs between the runs."""
    _kvpool_entry_point()
    assert _pool_module_in_child(dict(os.environ, KVPOOL_VLLM="1")) == "kvpool"
    assert (
        _pool_module_in_child(dict(os.environ, KVPOOL_VLLM="0"))
        == "vllm.v1.core.block_pool"
    )


def test_install_reaches_spawned_processes() -> None:
    """A process started (e.g. spawned by vLLM) while install() is in effect
    installs kvpool too, through the exported KVPOOL_VLLM and the plugin."""
    _kvpool_entry_point()
    with kv_vllm.enabled():
        assert _pool_module_in_child(dict(os.environ)) == "kvpool"
    assert _pool_module_in_child(dict(os.environ)) == "vllm.v1.core.block_pool"


def test_import_kvpool_does_not_import_vllm() -> None:
    """vLLM is not a dependency: neither ``import kvpool`` nor
    ``import kvpool.vllm`` loads it (only install() does)."""
    code = (
        "import sys, kvpool, kvpool.vllm; "
        "assert not [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')], "
        "sorted(m for m in sys.modules if m.startswith('vllm'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
