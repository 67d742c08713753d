"""``python -m kvpool.vllm --prove`` on builds kvpool has never seen, made
from the release under test: a link tree of its ``vllm`` package with one
mirrored file edited, first on ``PYTHONPATH`` of a fresh interpreter, and a
record of proven builds of the test's own (``KVPOOL_PROVEN``).

- A harmless edit (a comment) is refused by the report and by
  ``install()``, proven, then accepted with the line it was proven against,
  the log saying so; one byte more and it is refused again.
- A behavioural edit of vLLM's pool (frees in another order) or of its
  manager (one block more counted for a running request) is refused and
  fails ``--prove``, which names the first difference and records nothing.

Each ``--prove`` runs every suite, so this runs on one release: the newest
listed (``KVPOOL_PROVE_BUILD=1`` runs it on any release).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import vllm

from kvpool.vllm import VLLM_LINES

NEWEST = VLLM_LINES[-1].releases[-1]
if vllm.__version__ != NEWEST and os.environ.get("KVPOOL_PROVE_BUILD") != "1":
    pytest.skip(f"--prove on edited builds runs on vLLM {NEWEST} (KVPOOL_PROVE_BUILD=1: here)",
                allow_module_level=True)

PACKAGE = Path(vllm.__file__).parent
POOL = "v1/core/block_pool.py"
MANAGERS = "v1/core/single_type_kv_cache_manager.py"


class Build:
    """The release's vllm package as links, with files edited, and a fresh
    interpreter to run kvpool in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.record = root.parent / "proven.json"
        import shutil

        shutil.copytree(PACKAGE, root / "vllm", symlinks=False, copy_function=os.symlink,
                        ignore=shutil.ignore_patterns("__pycache__"))

    def edit(self, path: str, old: str, new: str) -> None:
        f = self.root / "vllm" / path
        text = f.read_text()
        if old not in text:
            raise AssertionError(f"vllm/{path} of {vllm.__version__} has no {old!r}")
        f.unlink()  # the link, not the release's file
        f.write_text(text.replace(old, new, 1))

    def run(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        parent = str(PACKAGE.parent)
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != parent]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self.root), *rest]),
                   KVPOOL_PROVEN=str(self.record))
        for name in ("KVPOOL_VLLM", "KVPOOL_VLLM_INTAKE", "KVPOOL_VLLM_EXPECT"):
            env.pop(name, None)
        return subprocess.run([sys.executable, *args], env=env, cwd=self.root.parent,
                              capture_output=True, text=True, timeout=timeout)

    def report(self) -> subprocess.CompletedProcess:
        return self.run("-m", "kvpool.vllm")

    def prove(self) -> subprocess.CompletedProcess:
        return self.run("-m", "kvpool.vllm", "--prove")

    def install(self) -> subprocess.CompletedProcess:
        # (kvpool's log line, caught by a handler of kvpool's own logger)
        return self.run("-c", "import logging, sys; h = logging.StreamHandler(sys.stdout); "
                              "logging.getLogger('kvpool').addHandler(h); "
                              "logging.getLogger('kvpool').setLevel(logging.INFO); "
                              "import vllm.v1.core.block_pool, kvpool.vllm as k; k.install(); "
                              "print('installed:', k.is_installed())")


@pytest.fixture
def build(tmp_path: Path) -> Build:
    return Build(tmp_path / "site")


def _out(p: subprocess.CompletedProcess) -> str:
    return p.stdout + p.stderr


def test_a_harmless_edit_is_refused_then_proven_and_accepted(build: Build) -> None:
    build.edit(POOL, "\nclass ", "\n# A local note of a patched build.\n\nclass ")
    report = build.report()
    assert report.returncode == 2, _out(report)
    assert f"vllm/{POOL} differs from vLLM {vllm.__version__}'s" in report.stdout
    refused = build.install()
    assert refused.returncode != 0 and "UnsupportedVLLMVersionError" in refused.stderr, _out(refused)
    assert "python -m kvpool.vllm --prove" in refused.stderr

    proof = build.prove()
    assert proof.returncode == 0, _out(proof)
    for suite in ("pool traces", "manager driver", "hasher check"):
        assert f"{suite}:" in proof.stdout, proof.stdout
    assert "Recorded in" in proof.stdout
    entry, = json.loads(build.record.read_text())["builds"]
    assert entry["vllm"] == vllm.__version__ and entry["nearest"] == vllm.__version__

    report = build.report()
    assert report.returncode == 0, _out(report)
    assert "its code (the files kvpool mirrors): a build proven by the user on" in report.stdout
    accepted = build.install()
    assert accepted.returncode == 0 and "installed: True" in accepted.stdout, _out(accepted)
    assert "a build proven by the user on" in _out(accepted)

    # One byte more: another build.
    build.edit(POOL, "# A local note", "# A local note.")
    assert build.report().returncode == 2
    assert build.install().returncode != 0


@pytest.mark.parametrize("what, path, old, new, suite", [
    ("a pool that frees in reverse", POOL,
     "for block in ordered_blocks:", "for block in list(ordered_blocks)[::-1]:", "pool traces"),
    ("a manager that counts one block more for a running request", MANAGERS,
     "return max(num_required_blocks - num_req_blocks, 0)",
     "return max(num_required_blocks - num_req_blocks + 1, 0)", "manager driver"),
], ids=["pool", "manager"])
def test_a_behavioural_edit_is_refused_and_fails_the_proof(build: Build, what: str, path: str,
                                                            old: str, new: str, suite: str) -> None:
    build.edit(path, old, new)
    assert build.report().returncode == 2
    proof = build.prove()
    assert proof.returncode == 3, _out(proof)
    assert f"{suite}: " in proof.stdout and " FAILED" in proof.stdout, proof.stdout
    assert "kvpool differs from this vLLM" in proof.stdout, proof.stdout
    assert "nothing recorded" in proof.stdout
    assert not build.record.exists()
    assert build.install().returncode != 0
