"""``python -m kvpool.vllm``, the report of what kvpool would put into the
vLLM installed here, without vLLM: with none importable (a clear message,
exit 1), and with a stand-in ``vllm`` package of a listed release (exit 0)
and of an unlisted one (exit 2), under the switches that change the verdict.
The release suites (``tests/vllm_release/test_install_release.py``) check
the same report against what ``install()`` does in each real release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvpool
from kvpool.vllm import VLLM_LINES
from kvpool.vllm.digests import MIRRORED
from kvpool.vllm.__main__ import NO_VLLM, OK, REFUSED

_SWITCHES = ("KVPOOL_VLLM", "KVPOOL_VLLM_MANAGER", "KVPOOL_VLLM_HASHER", "KVPOOL_VLLM_INTAKE")


def _stub_code(path: str, release: str) -> str:
    return f"# vllm/{path} of the stand-in for vLLM {release}\n"


def _kvpool_knowing_the_stand_ins(root: Path) -> Path:
    """A copy of the kvpool under test whose digest table holds, for every
    listed release, the stand-in's files of that release (``_stub_code``):
    the code check is the real one, over files the test wrote."""
    import hashlib
    import shutil

    copy = root / "kvpool-copy"
    if not copy.exists():
        shutil.copytree(Path(kvpool.__file__).parent, copy / "kvpool",
                        ignore=shutil.ignore_patterns("__pycache__"))
        rows = {release: tuple(hashlib.sha256(_stub_code(p, release).encode()).hexdigest()
                               for p, _ in MIRRORED)
                for line in VLLM_LINES for release in line.releases}
        (copy / "kvpool" / "vllm" / "_release_digests.py").write_text(
            f"RELEASE_DIGESTS = {rows!r}\n")
    return copy


def run(tmp_path: Path, version: str | None, *args: str, code: str | None = "",
        patched: str | None = None, **env: str):
    """``python -m kvpool.vllm ARGS`` from ``tmp_path``, with a stand-in vLLM
    of ``version`` first on the path (None: a ``vllm`` that fails to import,
    as where vLLM is absent). The stand-in's mirrored files are the
    stand-in code of release ``code`` (default: ``version`` less any local
    tag; None: no mirrored files), ``patched`` (a MIRRORED path) edited."""
    stub = tmp_path / "stub"
    (stub / "vllm").mkdir(parents=True, exist_ok=True)
    body = (f"__version__ = {version!r}\n" if version is not None
            else "raise ModuleNotFoundError(\"No module named 'vllm'\", name='vllm')\n")
    (stub / "vllm" / "__init__.py").write_text(body)
    if code == "" and version is not None:
        code = version.split("+")[0]
    if code:
        for path, _ in MIRRORED:
            f = stub / "vllm" / path
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(_stub_code(path, code) + ("# a local patch\n" if path == patched else ""))
    environ = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
    environ["PYTHONPATH"] = os.pathsep.join(
        [str(stub), str(_kvpool_knowing_the_stand_ins(tmp_path)), environ.get("PYTHONPATH", "")])
    environ.update(env)
    return subprocess.run([sys.executable, "-m", "kvpool.vllm", *args], cwd=tmp_path,
                          env=environ, capture_output=True, text=True, timeout=120, check=False)


def test_no_vllm_is_a_message_not_a_traceback(tmp_path):
    result = run(tmp_path, None)
    assert result.returncode == NO_VLLM, result
    assert "vLLM: not found" in result.stdout and "pip install 'kvpool[vllm]'" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_listed_release(tmp_path):
    newest = VLLM_LINES[-1]
    result = run(tmp_path, newest.releases[-1] + "+cpu")
    assert result.returncode == OK, result
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert f"line {newest.name} ({newest.module})" in out
    assert f"pool     kvpool's  {newest.module}.BlockPool" in out
    compiled = kvpool.USING_EXTENSION
    assert ("manager  kvpool's  " in out) == compiled, out
    assert ("hasher   kvpool's  " in out) == compiled, out
    assert "KVPOOL_VLLM=unset: the vLLM plugin does nothing" in out


def test_a_line_without_a_manager(tmp_path):
    result = run(tmp_path, "0.29.0", "--json")
    assert result.returncode == OK, result
    report = json.loads(result.stdout)
    assert report["line"]["name"] == "0.29"
    assert report["manager"] == {
        "kvpool": False,
        "what": "kvpool has no KV-cache manager for the 0.29 line: vLLM keeps its own",
    }
    assert report["hasher"]["kvpool"] == kvpool.USING_EXTENSION


@pytest.mark.parametrize("switch, part", [("KVPOOL_VLLM_MANAGER", "manager"),
                                          ("KVPOOL_VLLM_HASHER", "hasher")])
def test_a_switch_that_keeps_vllms(tmp_path, switch, part):
    result = run(tmp_path, "0.34.0", "--json", **{switch: "off"})
    assert result.returncode == OK, result
    report = json.loads(result.stdout)
    assert report[part] == {"kvpool": False, "what": f"{switch}=off: vLLM keeps its own "
                            + ("KV-cache manager" if part == "manager" else "request block hasher")}
    assert report["pool"]["kvpool"]
    shown = {s["name"]: s for s in report["switches"]}
    assert shown[switch]["value"] == "off"


def test_an_unlisted_release_is_refused(tmp_path):
    result = run(tmp_path, "0.35.0", KVPOOL_VLLM="auto")
    assert result.returncode == REFUSED, result
    out = result.stdout
    assert "not the code of a release kvpool lists" in out and "refused: install() raises" in out
    assert f"the {VLLM_LINES[-1].name} line's classes" in out
    assert "KVPOOL_VLLM='auto': the vLLM plugin installs kvpool where the code is a listed release's" in out
    assert "install() puts in" not in out


def test_the_intake_alias_is_followed(tmp_path):
    result = run(tmp_path, "0.35.0", "--json", KVPOOL_VLLM_INTAKE="0.35.0=0.33.0")
    assert result.returncode == OK, result
    assert json.loads(result.stdout)["line"]["name"] == "0.33"
    result = run(tmp_path, "0.35.0", KVPOOL_VLLM_INTAKE="0.35.0")
    assert result.returncode == REFUSED and "expected VERSION=LISTED" in result.stdout


def test_vllm_version_option_imports_no_vllm(tmp_path):
    result = run(tmp_path, None, "--vllm-version", "0.20.1", "--json")
    assert result.returncode == OK, result
    report = json.loads(result.stdout)
    assert report["vllm"] == "0.20.1" and report["line"]["name"] == "0.20"
    assert report["vllm_path"] is None


# The package's layering: each module loads only the ones below it, so no
# import runs in a circle (kvpool.vllm.releases: none; the intake loads it
# on its own).
LAYERS = {
    "kvpool.vllm.releases": set(),
    "kvpool.vllm.events": set(),
    "kvpool.vllm._rebind": set(),
    "kvpool.vllm.logs": set(),
    "kvpool.vllm.digests": set(),
    "kvpool.vllm.proven": set(),
    "kvpool.vllm.manager": {"kvpool.vllm._rebind"},
    "kvpool.vllm.hasher": {"kvpool.vllm._rebind", "kvpool.vllm.releases"},
    "kvpool.vllm.installer": {"kvpool.vllm._rebind", "kvpool.vllm.releases",
                              "kvpool.vllm.hasher", "kvpool.vllm.manager",
                              "kvpool.vllm.logs", "kvpool.vllm.digests"},
}


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_each_module_loads_only_the_layers_below(module):
    code = (
        "import importlib, sys, types\n"
        # An empty kvpool.vllm package object: its __init__ would load all.
        "import kvpool\n"
        "pkg = types.ModuleType('kvpool.vllm'); pkg.__path__ = [kvpool.__path__[0] + '/vllm']\n"
        "sys.modules['kvpool.vllm'] = pkg\n"
        f"importlib.import_module({module!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith('kvpool.vllm.')))\n"
        "print('vllm' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert set(eval(out[0])) - {module} == LAYERS[module]  # (our own output)
    assert out[1] == "False", "importing it imported vLLM"


def test_the_old_hasher_path_is_the_new_module(tmp_path):
    """``kvpool.vllm_hasher`` (named in earlier docs) still imports, warns,
    and is ``kvpool.vllm.hasher`` itself."""
    code = ("import warnings; warnings.simplefilter('error')\n"
            "try:\n    import kvpool.vllm_hasher\nexcept DeprecationWarning as w:\n"
            "    print('warned:', w)\n"
            "warnings.simplefilter('ignore')\n"
            "import kvpool.vllm_hasher as old, kvpool.vllm.hasher as new\n"
            "print(old is new, old.install_hasher is new.install_hasher)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    assert "warned: kvpool.vllm_hasher is kvpool.vllm.hasher now" in out
    assert out.strip().endswith("True True")


def test_the_refusal_is_named_where_users_import_it():
    """A traceback names ``kvpool.vllm.UnsupportedVLLMVersionError``, the
    name users catch (the engine tests read it from vLLM's stderr)."""
    import pickle
    import traceback

    from kvpool.vllm import UnsupportedVLLMVersionError, vllm_line

    with pytest.raises(UnsupportedVLLMVersionError) as caught:
        vllm_line("0.99.0")
    shown = traceback.format_exception_only(caught.value)[0]
    assert shown.startswith("kvpool.vllm.UnsupportedVLLMVersionError: "), shown
    assert type(pickle.loads(pickle.dumps(caught.value))) is UnsupportedVLLMVersionError


def test_the_code_decides_not_the_version(tmp_path):
    """A nightly whose mirrored files are a listed release's gets that
    release's line; a build labelled as a listed release whose files differ
    is refused, the differing file named."""
    newest = VLLM_LINES[-1]
    release = newest.releases[-1]
    result = run(tmp_path, "0.99.1.dev12+gabc", "--json", code=release)
    assert result.returncode == OK, result
    report = json.loads(result.stdout)
    assert report["line"]["name"] == newest.name
    assert report["code"] == f"the code of vLLM {release}"
    result = run(tmp_path, release + "+corp", patched="v1/core/block_pool.py")
    assert result.returncode == REFUSED, result
    out = result.stdout
    assert f"vllm/v1/core/block_pool.py differs from vLLM {release}'s" in out, out
    assert "install() puts in" not in out and "Traceback" not in result.stderr


def test_a_proven_build_is_reported_and_a_broken_record_refuses(tmp_path, monkeypatch):
    """A patched build the user proved is reported as that, exit 0; with
    its record edited it is refused, the record named, no traceback."""
    from kvpool.vllm import digests, proven

    release = VLLM_LINES[-1].releases[-1]
    record = tmp_path / "proven.json"
    first = run(tmp_path, release + "+corp", patched="v1/core/block_pool.py", KVPOOL_PROVEN=str(record))
    assert first.returncode == REFUSED and "python -m kvpool.vllm --prove" in first.stdout, first
    monkeypatch.setenv(proven.ENV_VAR, str(record))
    proven.record(digests.file_digests(tmp_path / "stub" / "vllm"), vllm=release + "+corp",
                  line=VLLM_LINES[-1].name, nearest=release, suites={})
    result = run(tmp_path, release + "+corp", "--json", patched="v1/core/block_pool.py",
                 KVPOOL_PROVEN=str(record))
    assert result.returncode == OK, result
    report = json.loads(result.stdout)
    assert report["code"].startswith("a build proven by the user on "), report["code"]
    assert report["line"]["name"] == VLLM_LINES[-1].name and report["pool"]["kvpool"]
    record.write_text(record.read_text().replace(release + "+corp", release + "+corq"))
    result = run(tmp_path, release + "+corp", patched="v1/core/block_pool.py",
                 KVPOOL_PROVEN=str(record))
    assert result.returncode == REFUSED, result
    assert f"{record}: entry 0 was changed after --prove wrote it" in result.stdout
    assert "Traceback" not in result.stderr
