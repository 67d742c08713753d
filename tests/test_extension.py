"""Which core is loaded, and the test harness's own rule: a missing compiled
core fails its tests unless ``--no-c-extensions`` is given."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvpool

TESTS_DIR = Path(__file__).resolve().parent
PACKAGE_ROOT = str(Path(kvpool.__file__).resolve().parent.parent)


def subprocess_env(**overrides: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def test_using_extension_by_default(no_c_extensions):
    """CI relies on this: a normal install runs on the compiled core."""
    if os.environ.get("KVPOOL_NO_EXTENSIONS"):
        assert kvpool.USING_EXTENSION is False
        assert kvpool.CORE is importlib.import_module("kvpool._core_py")
    elif no_c_extensions:
        pytest.skip("--no-c-extensions: the compiled core is not required")
    else:
        assert kvpool.USING_EXTENSION is True
        assert kvpool.CORE is importlib.import_module("kvpool._core")
    assert kvpool.KVCacheBlock is kvpool.CORE.KVCacheBlock


def core_chosen(**env: str | None) -> str:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import kvpool; print(kvpool.USING_EXTENSION, kvpool.CORE.__name__)",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(**env),
        cwd=TESTS_DIR,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("value", ["1", "0", "yes"])
def test_env_var_selects_pure_python(value):
    # Any non-empty value, even "0", turns the extension off (as frozenlist).
    assert core_chosen(KVPOOL_NO_EXTENSIONS=value) == "False kvpool._core_py"


@pytest.mark.parametrize("value", [None, ""])
def test_env_var_unset_or_empty_selects_compiled(value, no_c_extensions):
    if no_c_extensions:
        pytest.skip("--no-c-extensions: the compiled core is not required")
    assert core_chosen(KVPOOL_NO_EXTENSIONS=value) == "True kvpool._core"


def test_both_cores_same_interface(all_cores):
    public = {
        "KVCacheBlock": {
            "block_id",
            "ref_cnt",
            "is_null",
            "block_hash",
            "_block_hash",
            "reset_hash",
            "prev_free_block",
            "next_free_block",
        },
        "FreeKVCacheBlockQueue": {
            "num_free_blocks",
            "popleft",
            "popleft_n",
            "remove",
            "append",
            "append_n",
            "get_all_free_blocks",
            "fake_free_list_head",
            "fake_free_list_tail",
        },
        "BlockHashToBlockMap": {"get_one_block", "insert", "pop", "__len__"},
        "PoolCore": {
            "num_gpu_blocks",
            "blocks",
            "free_block_queue",
            "cached_block_hash_to_block",
            "null_block",
            "get_cached_block",
            "find_longest_cache_hit",
            "free_blocks",
            "get_num_free_blocks",
            "get_usage",
            "_allocate",
            "_evict_block",
            "_evict_block_ids",
            "_touch",
            "_cache_blocks",
            "_reset_cache",
        },
    }
    for core in all_cores:
        for cls_name, members in public.items():
            cls = getattr(core, cls_name)
            missing = {m for m in members if not hasattr(cls, m)}
            assert not missing, f"{core.__name__}.{cls_name} lacks {sorted(missing)}"


# ---------------------------------------------------------------------------
# The harness itself (conftest.py), run on a throwaway test directory.

INNER_TEST = """
import sys

if {hide}:
    sys.modules["kvpool._core"] = None  # as if the extension were not built

def test_core(core, BlockPool):
    assert BlockPool(2, True, 16).get_num_free_blocks() == 1
"""


def run_inner_pytest(
    tmp_path: Path, hide_extension: bool, *args: str
) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "_helpers.py"):
        shutil.copy(TESTS_DIR / name, tmp_path / name)
    (tmp_path / "test_inner.py").write_text(INNER_TEST.format(hide=hide_extension))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rA",
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(KVPOOL_HYPOTHESIS_PROFILE="ci"),
        cwd=tmp_path,
        timeout=120,
    )


def test_missing_extension_fails_not_skips(tmp_path):
    proc = run_inner_pytest(tmp_path, hide_extension=True)
    out = proc.stdout
    assert proc.returncode != 0, out
    assert "test_core[c-extension]" in out and "cannot import kvpool._core" in out, out
    assert "skipped" not in out.lower(), out
    assert "PASSED test_inner.py::test_core[pure-python]" in out, out


def test_no_c_extensions_deselects(tmp_path):
    proc = run_inner_pytest(tmp_path, True, "--no-c-extensions")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 deselected" in proc.stdout, proc.stdout
    assert "c-extension" not in proc.stdout.replace("--no-c-extensions", "")


def test_ids_name_the_core(tmp_path, no_c_extensions):
    if no_c_extensions:
        pytest.skip("--no-c-extensions: the compiled core is not required")
    proc = run_inner_pytest(tmp_path, False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED test_inner.py::test_core[c-extension]" in proc.stdout
    assert "PASSED test_inner.py::test_core[pure-python]" in proc.stdout
