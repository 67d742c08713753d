"""kvpool.vllm.proven: the record of builds a user proved, and how
``code_line`` (so ``install()`` and the plugin) uses it. No vLLM is needed:
the installed code is given as digests. A record that is unreadable, not
JSON, of another format or edited after ``--prove`` wrote it refuses the
build with a message that says how to mend it, never a traceback."""

from __future__ import annotations

import json

import pytest

import kvpool
from kvpool.vllm import digests, proven, releases
from kvpool.vllm._release_digests import RELEASE_DIGESTS

PATHS = [path for path, _ in digests.MIRRORED]
#: vLLM 0.34.0's code with one byte more in the pool file: a local build.
CODE = dict(zip(PATHS, RELEASE_DIGESTS["0.34.0"]), **{"v1/core/block_pool.py": "ab" * 32})


@pytest.fixture(autouse=True)
def _record(tmp_path, monkeypatch):
    monkeypatch.setenv(proven.ENV_VAR, str(tmp_path / "proven.json"))
    monkeypatch.delenv(releases.INTAKE_VAR, raising=False)
    return tmp_path / "proven.json"


def _prove(code=CODE, line="0.34"):
    return proven.record(code, vllm="0.34.1.dev3+gabc", line=line, nearest="0.34.0",
                         suites={"pool traces": "69 cases passed"})


def test_the_record_path(monkeypatch, tmp_path):
    monkeypatch.delenv(proven.ENV_VAR)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert proven.record_path() == tmp_path / "cfg" / "kvpool" / "proven.json"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert proven.record_path() == tmp_path / "home" / ".config" / "kvpool" / "proven.json"


def test_an_unproven_build_is_refused_and_told_how_to_prove_it():
    with pytest.raises(releases.UnsupportedVLLMVersionError) as err:
        digests.code_line("0.34.1.dev3+gabc", digests=CODE)
    assert "vllm/v1/core/block_pool.py differs from vLLM 0.34.0's" in str(err.value)
    assert "python -m kvpool.vllm --prove" in str(err.value)


def test_a_proven_build_gets_its_line_and_only_it(_record):
    path = _prove()
    assert path == _record
    line, why = digests.code_line("0.34.1.dev3+gabc", digests=CODE)
    assert line.name == "0.34"
    assert why.startswith("a build proven by the user on ") and str(path) in why
    # Proving again replaces the entry; another build is another entry.
    other = dict(CODE, **{"utils/hashing.py": "cd" * 32})
    _prove()
    _prove(other)
    assert len(json.loads(path.read_text())["builds"]) == 2
    # One byte more in a mirrored file: another build, refused.
    changed = dict(CODE, **{"v1/core/kv_cache_manager.py": "ef" * 32})
    with pytest.raises(releases.UnsupportedVLLMVersionError):
        digests.code_line("0.34.1.dev3+gabc", digests=changed)


def test_a_listed_release_never_reads_the_record(_record):
    _record.write_text("not json")
    line, why = digests.code_line("0.34.0", digests=dict(zip(PATHS, RELEASE_DIGESTS["0.34.0"])))
    assert line.name == "0.34" and why == "the code of vLLM 0.34.0"


def test_another_kvpool_proves_again(monkeypatch):
    _prove()
    monkeypatch.setattr(kvpool, "__version__", kvpool.__version__ + ".post1")
    with pytest.raises(releases.UnsupportedVLLMVersionError, match="proven with kvpool"):
        digests.code_line("0.34.1.dev3+gabc", digests=CODE)


def test_a_line_kvpool_no_longer_has_proves_again():
    _prove(line="0.99")
    with pytest.raises(releases.UnsupportedVLLMVersionError, match="the 0.99 line, which this"):
        digests.code_line("0.34.1.dev3+gabc", digests=CODE)


def _tamper_field(path):
    data = json.loads(path.read_text())
    data["builds"][0]["line"] = "0.31"
    path.write_text(json.dumps(data))


def _tamper_digest(path):
    path.write_text(path.read_text().replace("abab", "abac", 1))


BROKEN_RECORDS = {
    "an edited line": (_tamper_field, "entry 0 was changed after --prove wrote it"),
    "an edited digest": (_tamper_digest, "entry 0 was changed after --prove wrote it"),
    "a truncated file": (lambda p: p.write_text(p.read_text()[:40]), "is not JSON"),
    "not UTF-8": (lambda p: p.write_bytes(b"\xff\xfe\x00"), "cannot be read"),
    "a directory": (lambda p: (p.unlink(), p.mkdir()), "cannot be read"),
    "another format": (lambda p: p.write_text('{"format": 2, "builds": []}'), "format 1"),
    "a list": (lambda p: p.write_text("[]"), "format 1"),
    "an entry without digests": (
        lambda p: p.write_text(json.dumps({"format": 1, "builds": [
            {"checksum": proven._checksum({})}]})), "has no digests"),
}


@pytest.mark.parametrize("breakage", list(BROKEN_RECORDS))
def test_a_broken_record_refuses_with_a_clear_message(_record, breakage):
    _prove()
    damage, said = BROKEN_RECORDS[breakage]
    damage(_record)
    with pytest.raises(proven.RecordError, match=said):
        proven.find(CODE)
    with pytest.raises(releases.UnsupportedVLLMVersionError) as err:
        digests.code_line("0.34.1.dev3+gabc", digests=CODE)
    assert said in str(err.value) and str(_record) in str(err.value)
    assert "--prove again" in str(err.value)
    assert said in err.value.code
    # --prove does not write over a record it cannot read.
    with pytest.raises(proven.RecordError):
        _prove()


def test_the_record_is_written_atomically(_record, monkeypatch):
    _prove()
    before = _record.read_bytes()

    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(proven.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        _prove(dict(CODE, **{"utils/hashing.py": "cd" * 32}))
    assert _record.read_bytes() == before
    assert [p.name for p in _record.parent.iterdir()] == ["proven.json"]
