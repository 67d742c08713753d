"""The release intake's pure parts (tools/intake.py): the file, API and call
comparisons on synthetic source trees, the verdict, the ``--apply`` edits on
copies, and the ``KVPOOL_VLLM_INTAKE`` hook the suites read. No vLLM, no
network: the fetch and the suites run only in the real intake
(docs/intake.md)."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

import pytest
from _helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
INTAKE = ROOT / "tools" / "intake.py"
needs_checkout = pytest.mark.skipif(
    not INTAKE.exists(), reason="needs the source checkout (tools/), not only the test sources")
pytestmark = needs_checkout


@pytest.fixture(scope="module")
def intake():  # noqa: ANN201
    return load_script(INTAKE, "_kvpool_intake")


OLD = textwrap.dedent('''\
    """A pool module."""
    from dataclasses import dataclass

    NONE_HASH = b""


    @dataclass
    class Block:
        block_id: int
        _hash: bytes | None = None

        @property
        def ref(self) -> int:
            return 0

        def _evict(self, n: int) -> None:
            pass


    class Pool:
        def __init__(self, n: int, caching: bool) -> None:
            self.n = n

        def free(self, blocks: list[Block]) -> None:
            pass

        def gone(self) -> None:
            pass


    def helper(x):  # a comment
        return x


    def _private(y):
        return y
''')

NEW = textwrap.dedent('''\
    """A pool module."""
    from dataclasses import dataclass

    NONE_HASH = b""


    @dataclass(slots=True)
    class Block:
        block_id: int
        _hash: bytes | int | None = None

        @property
        def ref(self) -> int:
            return 0

        @ref.setter
        def ref(self, value: int) -> None:
            pass

        def _evict(self, n: int) -> None:
            pass


    class Pool:
        def __init__(self, n: int, caching: bool) -> None:
            self.n = n

        def free(self, blocks: list[Block], prepend: bool = False) -> None:
            pass

        def clear(self) -> None:
            pass


    def helper(x):
        return x


    def _private(y, z):
        return y
''')


def test_api_diff_finds_every_kind_of_change(intake):
    diff = {(kind, name): (old, new) for kind, name, old, new in intake.api_diff(OLD, NEW)}
    assert set(diff) == {
        ("changed", "Block"),         # @dataclass -> @dataclass(slots=True)
        ("changed", "Block._hash"),   # a field's annotation
        ("changed", "Block.ref"),     # a setter added to the property
        ("changed", "Pool.free"),     # a parameter added
        ("removed", "Pool.gone"),
        ("added", "Pool.clear"),
    }, diff
    assert diff[("changed", "Pool.free")] == (
        "def free(self, blocks: list[Block]) -> None",
        "def free(self, blocks: list[Block], prepend: bool=False) -> None")
    assert diff[("changed", "Block")] == ("@dataclass class Block()",
                                          "@dataclass(slots=True) class Block()")


def test_api_of_keeps_private_methods_but_not_private_module_names(intake):
    api = intake.api_of(OLD)
    assert "Block._evict" in api and "Pool.__init__" in api  # other vLLM code calls them
    assert "_private" not in api and "helper" in api and "NONE_HASH" in api


def test_compare_file(intake):
    assert intake.compare_file(OLD, OLD) == ("identical", "")
    reflowed = OLD.replace("def helper(x):  # a comment", "def helper(x):\n    # moved")
    status, detail = intake.compare_file(OLD, reflowed)
    assert status == "formatting" and "same ast" in detail
    status, detail = intake.compare_file(OLD, NEW)
    assert status == "changed" and detail.startswith("-") and "+" in detail
    assert intake.compare_file(OLD, None)[0] == "missing"
    assert intake.compare_file(None, NEW)[0] == "new"
    assert intake.compare_file(None, None)[0] == "absent"


def test_a_changed_docstring_is_a_change(intake):
    # Docstrings are part of the ast: only comments and layout are free.
    assert intake.compare_file(OLD, OLD.replace("A pool module.", "A pool."))[0] == "changed"


CALLER = textwrap.dedent('''\
    def build(config):
        x = 1  # unrelated
        return KVCacheManager(config, max_len=4, caching=True)
''')


def test_compare_call(intake):
    other = CALLER.replace("x = 1", "x = 2; y = 3")
    assert intake.compare_call(CALLER, other, "KVCacheManager")[0] == "identical"
    reflowed = CALLER.replace("(config, max_len=4, caching=True)",
                              "(\n        config,\n        max_len=4,\n        caching=True,\n    )")
    assert intake.compare_call(CALLER, reflowed, "KVCacheManager")[0] == "formatting"
    status, detail = intake.compare_call(
        CALLER, CALLER.replace("caching=True", "caching=True, lookahead=2"), "KVCacheManager")
    assert status == "changed" and "lookahead=2" in detail and "was:" in detail
    assert intake.compare_call(CALLER, CALLER.replace("KVCacheManager", "Other"),
                               "KVCacheManager")[0] == "missing"
    assert intake.compare_call(CALLER, None, "KVCacheManager")[0] == "missing"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_diff_trees_on_synthetic_trees(intake, tmp_path):
    m = intake.Mirrored
    mirrored = (m("pkg/pool.py", "the pool", api=True), m("pkg/same.py", "same"),
                m("pkg/gone.py", "gone"), m("pkg/sched.py", "builds it", call="KVCacheManager"))
    old = _tree(tmp_path / "old", {"pkg/pool.py": OLD, "pkg/same.py": "x = 1\n",
                                   "pkg/gone.py": "y = 2\n", "pkg/sched.py": CALLER})
    new = _tree(tmp_path / "new", {"pkg/pool.py": NEW, "pkg/same.py": "x = 1\n",
                                   "pkg/sched.py": CALLER.replace("x = 1", "x = 5")})
    results = {r.mirrored.path: r for r in intake.diff_trees(old, new, mirrored)}
    assert [results[p].status for p in ("pkg/pool.py", "pkg/same.py", "pkg/gone.py",
                                        "pkg/sched.py")] == ["changed", "identical",
                                                             "missing", "changed"]
    assert len(results["pkg/pool.py"].api) == 6
    # The scheduler file changed, its call did not: only the call counts.
    assert results["pkg/sched.py"].call == "identical"
    assert [p for p, r in results.items() if r.blocks()] == ["pkg/pool.py", "pkg/gone.py"]


def test_mirrored_covers_the_pool_modules_and_both_call_sites(intake):
    by_path = {m.path: m for m in intake.MIRRORED}
    assert len(by_path) == len(intake.MIRRORED)
    for module in ("block_pool", "kv_cache_utils", "kv_cache_metrics", "kv_cache_manager",
                   "kv_cache_coordinator", "single_type_kv_cache_manager"):
        assert by_path[f"vllm/v1/core/{module}.py"].api
    assert by_path["vllm/distributed/kv_events.py"].api
    assert by_path["vllm/v1/engine/core.py"].call == "get_request_block_hasher"
    assert by_path["vllm/v1/core/sched/scheduler.py"].call == "KVCacheManager"


def test_mirrored_is_the_list_whose_digests_install_checks(intake):
    from kvpool.vllm import digests

    assert [m.path for m in intake.MIRRORED] == [f"vllm/{p}" for p, _ in digests.MIRRORED]


def test_apply_writes_the_new_releases_digests(tmp_path, monkeypatch):
    """``--apply`` adds the release's row to ``_release_digests.py``, from the
    tree the intake diffed, in the listed order, the other rows unchanged."""
    from kvpool.vllm import digests

    tool = load_script(ROOT / "tools" / "release_digests.py", "_kvpool_release_digests_tool")
    out = tmp_path / "_release_digests.py"
    out.write_text(tool.OUT.read_text())
    monkeypatch.setattr(tool, "OUT", out)
    before = tool.read_rows()
    monkeypatch.setattr(tool, "listed_releases", lambda: [*before, "0.99.0"])
    tree = tmp_path / "src"
    for path, _ in digests.MIRRORED:
        (tree / "vllm" / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / "vllm" / path).write_text(f"# {path} of 0.99.0\n")
    tool.add_release("0.99.0", tree)
    after = tool.read_rows()
    assert list(after) == [*before, "0.99.0"]
    assert {r: after[r] for r in before} == before
    assert after["0.99.0"] == [digests.file_digests(tree / "vllm")[p] for p, _ in digests.MIRRORED]
    assert "tree)" in INTAKE.read_text() and "add_release(version, tree)" in INTAKE.read_text()


def _results(intake, **status):
    """One FileResult per mirrored file, identical unless named."""
    out = []
    for m in intake.MIRRORED:
        r = intake.FileResult(m, status.get(m.path, "identical"))
        if m.call:
            r.call = status.get(m.call, "identical")
        out.append(r)
    return out


PASSED = {"traces": "passed", "manager": "passed", "own": "passed"}


def test_verdict_add_it_only_when_everything_is_clean(intake):
    v = intake.verdict("0.20.1", "0.20.0", "0.20", _results(intake), PASSED)
    assert v.add and v.text == ["verdict: vLLM 0.20.1 is identical to line 0.20 (0.20.0): add it"]
    formatting = _results(intake, **{"vllm/v1/core/block_pool.py": "formatting",
                                     "KVCacheManager": "formatting"})
    assert intake.verdict("0.20.1", "0.20.0", "0.20", formatting, PASSED).add


@pytest.mark.parametrize("broken", [
    {"vllm/v1/core/block_pool.py": "changed"},
    {"vllm/distributed/kv_events.py": "missing"},
    {"vllm/utils/hashing.py": "new"},
    {"KVCacheManager": "changed"},
    {"get_request_block_hasher": "missing"},
])
def test_verdict_refuses_a_changed_file_or_call(intake, broken):
    v = intake.verdict("0.34.0", "0.33.0", "0.33", _results(intake, **broken), PASSED)
    assert not v.add and "a new line must cover" in v.text[0]
    (name,) = broken
    assert any(name in line for line in v.text[1:]), v.text


@pytest.mark.parametrize("suite", ["traces", "manager", "own"])
@pytest.mark.parametrize("result", ["FAILED (exit 1)", "not run (--skip-tests)"])
def test_verdict_refuses_a_suite_that_failed_or_did_not_run(intake, suite, result):
    v = intake.verdict("0.20.1", "0.20.0", "0.20", _results(intake), {**PASSED, suite: result})
    assert not v.add
    assert v.text[1:] == [f"  - {intake.SUITES[suite][0]}: {result}"]
    v = intake.verdict("0.20.1", "0.20.0", "0.20", _results(intake),
                       {k: r for k, r in PASSED.items() if k != suite})
    assert not v.add and v.text[1:] == [f"  - {intake.SUITES[suite][0]}: not run"]


def test_verdict_lists_the_api_changes(intake):
    files = _results(intake, **{"vllm/v1/core/block_pool.py": "changed"})
    files[0].api = intake.api_diff(OLD, NEW)
    text = intake.verdict("0.34.0", "0.33.0", "0.33", files, PASSED).text
    assert "      API added: Pool.clear: def clear(self) -> None" in text
    assert "      API removed: Pool.gone: def gone(self) -> None" in text


def test_nearest_listed(intake):
    listed = {"0.20.0": "0.20", "0.20.1": "0.20", "0.21.0": "0.20", "0.33.0": "0.33"}
    assert intake.nearest_listed("0.34.0", listed) == "0.33.0"
    assert intake.nearest_listed("0.20.2", listed) == "0.20.1"
    assert intake.nearest_listed("0.20.10", listed) == "0.20.1"  # numbers, not text
    with pytest.raises(ValueError, match="no listed release is older"):
        intake.nearest_listed("0.19.0", listed)
    with pytest.raises(ValueError, match="not a vLLM release number"):
        intake.nearest_listed("0.34", listed)


def test_add_release_edits_only_that_lines_tuple(intake):
    source = (ROOT / "kvpool" / "vllm" / "releases.py").read_text()
    edited = intake.add_release(source, "0.33", "0.34.0")
    changed = [d for d in difflib.ndiff(source.splitlines(), edited.splitlines())
               if d.startswith(("-", "+"))]
    assert len(changed) == 2 and '("0.33.0", "0.34.0")' in changed[1], changed
    # In order, within a tuple of several.
    edited = intake.add_release(source, "0.20", "0.20.3")
    assert '("0.20.0", "0.20.1", "0.20.2", "0.20.3", "0.21.0")' in edited


def test_add_release_result_is_the_registry(intake, tmp_path):
    copy = tmp_path / "vllm_copy.py"
    copy.write_text(intake.add_release((ROOT / "kvpool" / "vllm" / "releases.py").read_text(), "0.33", "0.34.0"))
    module = load_script(copy, "_kvpool_intake_applied")
    assert module.vllm_line("0.34.0").name == "0.33"
    assert module.vllm_line("0.33.0").name == "0.33"


def test_add_release_refuses(intake):
    source = (ROOT / "kvpool" / "vllm" / "releases.py").read_text()
    with pytest.raises(ValueError, match="already a release of line 0.20"):
        intake.add_release(source, "0.20", "0.20.1")
    with pytest.raises(ValueError, match="not one"):
        intake.add_release(source, "0.99", "0.99.0")


def test_extend_exceptions(intake):
    text = ("# comment 0.16.0..0.33.0\n"
            "0.16.0..0.33.0 a::b -- says -- why\n"
            "0.25.0..0.33.0 c::d -- says -- why\n"
            "0.20.0 e::f -- says -- why\n"
            "0.16.0..0.19.1 g::h -- says -- why\n")
    assert intake.extend_exceptions(text, "0.33.0", "0.34.0") == (
        "# comment 0.16.0..0.33.0\n"
        "0.16.0..0.34.0 a::b -- says -- why\n"
        "0.25.0..0.34.0 c::d -- says -- why\n"
        "0.20.0 e::f -- says -- why\n"
        "0.16.0..0.19.1 g::h -- says -- why\n")
    # A release inside a range is covered already; a single release grows one.
    assert intake.extend_exceptions(text, "0.20.0", "0.20.1") == text.replace(
        "0.20.0 e::f", "0.20.0..0.20.1 e::f")


def test_the_intake_hook_gives_the_release_the_listed_line(monkeypatch):
    from kvpool.vllm import INTAKE_VAR, UnsupportedVLLMVersionError, vllm_line

    with pytest.raises(UnsupportedVLLMVersionError):
        vllm_line("0.35.0")
    monkeypatch.setenv(INTAKE_VAR, "0.35.0=0.34.0")
    assert vllm_line("0.35.0").name == "0.34"
    with pytest.raises(UnsupportedVLLMVersionError):  # only the release named
        vllm_line("0.36.0")
    monkeypatch.setenv(INTAKE_VAR, "0.21.0=0.19.1")
    assert vllm_line("0.21.0").name == "0.19"  # --against: a line the release is not in
    for bad in ("0.35.0", "0.35.0=0.35.0", "x=0.34.0"):
        monkeypatch.setenv(INTAKE_VAR, bad)
        with pytest.raises(ValueError, match="VERSION=LISTED"):
            vllm_line("0.35.0")


def test_compare_holds_the_release_to_the_listed_releases_exceptions(monkeypatch):
    compare = load_script(ROOT / "tests" / "vllm_suites" / "compare.py", "_kvpool_compare")
    assert compare.exceptions("0.35.0") == {}
    before = compare.exceptions("0.16.0")
    monkeypatch.setenv("KVPOOL_VLLM_INTAKE", "0.35.0=0.34.0")
    assert compare.exceptions("0.35.0") == compare.exceptions("0.34.0") != {}
    assert compare.exceptions("0.16.0") == before  # only the release named


def test_behaviour_counts_what_fails_with_kvpool_only(intake):
    output = [
        "   [own 529s]    exception: t::a  -- free-list links are read-only",
        "   [own 529s]    exception: t::c  -- NOT LISTED; with kvpool: AttributeError: x",
        "   [own 529s]    exception: t::b  -- NOT LISTED; with kvpool: TypeError: weak",
        "   [own 529s]    exception: t::d  -- NOT LISTED; with kvpool: TypeError: weak",
    ]
    # Most frequent first, whatever came first.
    assert intake.behaviour(output) == ["2 test(s) fail with kvpool only: TypeError: weak",
                                        "1 test(s) fail with kvpool only: AttributeError: x"]
    assert intake.behaviour(output[:1]) == []


def test_verdict_lists_what_a_failing_suite_found(intake):
    found = {"own": ["2 test(s) fail with kvpool only: TypeError: weak"],
             "traces": ["never shown: the suite passed"]}
    v = intake.verdict("0.34.0", "0.33.0", "0.33", _results(intake),
                       {**PASSED, "own": "FAILED (exit 1)"}, found)
    assert v.text[1:] == ["  - vLLM's own tests: FAILED (exit 1)",
                          "      2 test(s) fail with kvpool only: TypeError: weak"]
