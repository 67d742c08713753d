"""kvpool.vllm.digests: the installed vLLM judged by its code. No vLLM is
needed: vLLM trees are made in tmp_path from a release table of the test's
own, and the shipped table (``_release_digests``) is checked for its shape."""

from __future__ import annotations

import hashlib
import re

import pytest

from kvpool.vllm import digests, releases
from kvpool.vllm._release_digests import RELEASE_DIGESTS

PATHS = [path for path, _ in digests.MIRRORED]


def make_tree(root, tag: str):
    """A vllm package directory whose mirrored files read ``tag``."""
    for path in PATHS:
        f = root / "vllm" / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"# {path} of {tag}\n")
    return root / "vllm"


def known_of(**trees) -> dict[str, dict[str, str]]:
    return {release: digests.file_digests(tree) for release, tree in trees.items()}


def test_every_listed_release_has_its_digests():
    listed = [r for line in releases.VLLM_LINES for r in line.releases]
    assert list(RELEASE_DIGESTS) == listed
    for release, row in RELEASE_DIGESTS.items():
        assert len(row) == len(PATHS), release
        assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in row), release


def test_releases_sharing_code_share_a_line():
    """Two listed releases with the same mirrored files must be in one line:
    the code decides the line."""
    by_code: dict[tuple[str, ...], set[str]] = {}
    for release, row in RELEASE_DIGESTS.items():
        by_code.setdefault(row, set()).add(releases.vllm_line(release).name)
    assert all(len(names) == 1 for names in by_code.values()), by_code


def test_file_digests_hash_the_bytes(tmp_path):
    tree = make_tree(tmp_path, "a")
    got = digests.file_digests(tree)
    assert got["v1/core/block_pool.py"] == hashlib.sha256(
        b"# v1/core/block_pool.py of a\n").hexdigest()
    (tree / "utils" / "hashing.py").unlink()
    assert digests.file_digests(tree)["utils/hashing.py"] == digests.MISSING


def test_identify_names_the_release_and_the_differing_files(tmp_path):
    known = known_of(**{"0.1.0": make_tree(tmp_path / "a", "a"),
                        "0.2.0": make_tree(tmp_path / "b", "b")})
    assert digests.identify(known["0.1.0"], known).release == "0.1.0"
    patched = dict(known["0.2.0"], **{"v1/core/block_pool.py": "0" * 64})
    verdict = digests.identify(patched, known)
    assert verdict.release is None and verdict.nearest == "0.2.0"
    assert verdict.differing == ("v1/core/block_pool.py",)
    assert "vllm/v1/core/block_pool.py differs from vLLM 0.2.0's" in verdict.describe()
    # One byte is enough.
    tree = make_tree(tmp_path / "c", "b")
    f = tree / "v1" / "core" / "sched" / "scheduler.py"
    f.write_bytes(f.read_bytes() + b" ")
    assert digests.identify(digests.file_digests(tree), known).differing == (
        "v1/core/sched/scheduler.py",)


def test_the_code_decides_not_the_version(monkeypatch):
    """A build whose files are a listed release's gets that line whatever
    its version says; other files are refused with the files named, or
    forced onto the version's nearest older line."""
    release = "0.32.0"
    code = dict(zip(PATHS, RELEASE_DIGESTS[release]))
    for version in ("0.32.0", "0.32.0+cpu", "0.33.1.dev12+gabc", "0.35.0rc1"):
        line, why = digests.code_line(version, digests=code)
        assert line.name == "0.32" and why == "the code of vLLM 0.32.0"
    patched = dict(code, **{"v1/core/kv_cache_manager.py": "f" * 64})
    with pytest.raises(releases.UnsupportedVLLMVersionError,
                       match=r"vllm/v1/core/kv_cache_manager.py differs from vLLM 0.32.0's"):
        digests.code_line("0.32.0+corp", digests=patched)
    line, why = digests.code_line("0.32.0+corp", digests=patched, force=True)
    assert line.name == "0.32" and why.startswith("forced: ")


def test_a_release_taken_out_of_the_lines_is_refused_by_its_code_too(monkeypatch):
    code = dict(zip(PATHS, RELEASE_DIGESTS["0.34.0"]))
    kept = tuple(line for line in releases.VLLM_LINES if "0.34.0" not in line.releases)
    monkeypatch.setattr(releases, "VLLM_LINES", kept)
    with pytest.raises(releases.UnsupportedVLLMVersionError):
        digests.code_line("0.34.0", digests=code)


def test_the_intake_alias_skips_the_code_check(monkeypatch):
    monkeypatch.setenv(releases.INTAKE_VAR, "0.35.0=0.34.0")
    line, why = digests.code_line("0.35.0", digests={p: "0" * 64 for p in PATHS})
    assert line.name == releases.vllm_line("0.34.0").name and "intake" in why
