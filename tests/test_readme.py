"""The README's usage example runs as written (against the core in use); in a
source checkout, its release table is the generated one, it claims only what
the CI scripts run, and every link of the README and docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
from _helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RELEASE_TABLE = ROOT / "tools" / "release_table.py"
# The release wheels' tests run from a copy of tests/ and README.md only
# (pyproject.toml's test-sources): the checks that need the rest of the
# source tree run in the checkout (CI's `pytest tests`).
needs_checkout = pytest.mark.skipif(
    not RELEASE_TABLE.exists() or not (ROOT / "docs").is_dir(),
    reason="needs the source checkout (tools/, docs/, .ci/), not only the test sources",
)


def test_readme_usage_example_runs():
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "from kvpool import BlockPool" in b)
    namespace: dict = {}
    exec(compile(example, str(README), "exec"), namespace)
    assert namespace["hit"] == namespace["blocks"]
    assert [type(e).__name__ for e in namespace["events"]] == ["BlockStored"]


def _release_table() -> ModuleType:
    """tools/release_table.py, imported once (tools/ is not a package)."""
    return load_script(RELEASE_TABLE, "_kvpool_release_table")


@needs_checkout
def test_readme_release_table_is_the_generated_one():
    release_table = _release_table()
    text = README.read_text(encoding="utf-8")
    assert release_table.readme_table(text) == release_table.table(), (
        "README.md's release table is stale: python tools/release_table.py --write")


@needs_checkout
def test_release_table_has_a_row_per_release_and_follows_install():
    from kvpool.vllm import VLLM_LINES, UnsupportedVLLMVersionError, vllm_line

    release_table = _release_table()
    rows = release_table.rows()
    releases = [row[0] for row in rows]
    # One row per pinned release (a release pinned before its line exists,
    # as 0.34.0 is for the intake, gets a "refused" row).
    assert releases == release_table.releases() and releases[0] == "0.15.0"
    assert len(releases) >= 28
    assert len(set(releases)) == len(releases)
    for release, line_text, tested, _ in rows:
        try:
            line = vllm_line(release)
        except UnsupportedVLLMVersionError:
            assert line_text.startswith("refused") and tested == "—", release
        else:
            assert line_text.startswith(f"{line.name} (`{line.module}`)"), release
            # The lines with a KV-cache manager name it (what install() puts in).
            assert (f"manager `{line.manager}`" in line_text) == bool(line.manager), release
    # Every release a line lists has its row, under that line.
    line_of = {release: line_text for release, line_text, *_ in rows}
    for line in VLLM_LINES:
        for release in line.releases:
            assert line_of[release].startswith(f"{line.name} "), (line.name, release)
    # Every listed release is run by some suite in every CI run, not only in
    # the full run.
    assert all(gate != "—" for _, text, gate, _ in rows if not text.startswith("refused")), rows


@needs_checkout
def test_release_table_claims_only_what_ci_runs():
    # Each suite's script runs in CI (.ci/run calls it, directly or through
    # .ci/vllm-tests.sh), and a release a script is said to run by name is
    # named in it; "all" and "newest" the scripts compute from VLLM_LINES.
    # .ci/run passes each script the releases of its mode through
    # `release_table.py --releases SCRIPT`, and a gate's releases are a
    # subset of the full run's (suite_releases raises otherwise).
    release_table = _release_table()
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "tools/release_table.py --releases" in run
    for entry in release_table.TESTED:
        script = (ROOT / entry.script).read_text(encoding="utf-8")
        assert f"releases {entry.script})" in run, entry.script
        assert release_table.suite_releases(entry, False), entry.suite
        if entry.releases in ("all", "newest"):
            assert "VLLM_LINES" in script, entry.script
        else:
            for release in entry.releases:
                assert re.search(rf"(?<![\d.]){re.escape(release)}(?![\d.])", script), (
                    entry.script, release)


@needs_checkout
def test_vllm_extra_admits_every_listed_release():
    # ``pip install 'kvpool[vllm]'`` (what the refusal message tells a user
    # to run) must accept every release a line lists and refuse the
    # releases around them, so that pip never picks a vLLM kvpool refuses.
    tomllib = pytest.importorskip("tomllib")
    specifiers = pytest.importorskip("packaging.specifiers")
    version = pytest.importorskip("packaging.version")
    from kvpool.vllm import VLLM_LINES

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    [requirement] = pyproject["project"]["optional-dependencies"]["vllm"]
    assert requirement.startswith("vllm")
    spec = specifiers.SpecifierSet(requirement[len("vllm"):])
    listed = [release for line in VLLM_LINES for release in line.releases]
    refused = [release for release in listed if not spec.contains(version.Version(release))]
    assert not refused, f"the vllm extra ({requirement}) refuses listed releases {refused}"
    for outside in ("0.14.1", "0.34.0.post1", "0.34.1", "0.35.0"):
        assert not spec.contains(version.Version(outside)), (requirement, outside)


def _anchors(markdown: str) -> set[str]:
    # GitHub's heading anchors: lower case, punctuation but '-' and '_'
    # dropped, spaces to '-'.
    out = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


@needs_checkout
def test_readme_and_docs_links_resolve():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        text = re.sub(r"```.*?```|<!--.*?-->", "", text, flags=re.S)  # code, comments
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), (page.name, target)
            if anchor and linked.suffix == ".md":
                assert anchor in _anchors(linked.read_text(encoding="utf-8")), (page.name, target)
