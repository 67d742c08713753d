#!/usr/bin/env python3
"""The release intake: is a new vLLM release a release of a line kvpool has?

    tools/intake.py VERSION [--against RELEASE] [--pin-new] [--skip-tests | --run-tests]
                    [--suites traces,manager,own] [--apply]

One command per new vLLM release (docs/intake.md), so that the next release
costs hours, not days:

1. fetch: the release's source tree through the pinned-fetch machinery
   (``.ci/vllm-src.sh``, ``.ci/pypi-fetch.py``); a release with no pin is
   refused unless ``--pin-new``, which records its sha256 in
   ``tests/vllm_suites/SHA256SUMS`` (said loudly: commit it);
2. diff: every file kvpool mirrors or patches (``MIRRORED``) against the
   nearest listed release (the newest release of ``kvpool.vllm.VLLM_LINES``
   older than VERSION, or ``--against``): identical, comments/formatting only
   (the same ``ast``), changed, missing; the API of the pool and manager
   modules (classes, their bases and decorators, functions, methods and their
   signatures, class fields: added, removed, changed), read with ``ast``, no
   vLLM imported; and for the two call sites, only the call's text;
3. tests: the release's pool differential traces, the manager driver and
   vLLM's own tests of that release, with the nearest release's line forced
   in (``KVPOOL_VLLM_INTAKE=VERSION=RELEASE``, read by ``kvpool.vllm.vllm_line``
   and the suites), by default only when the diff found nothing
   (``--run-tests``: anyway, to see what fails);
4. verdict: "identical to line X (RELEASE): add it" only when every mirrored
   file is identical or differs in comments/formatting only, both calls are
   unchanged, and every suite ran and passed; else "not proven", with the
   list of what a new line must cover. Exit status 0 only for "add it".
   ``--apply`` (with "add it" only) adds the release to the line's
   ``releases`` in ``kvpool/vllm/releases.py``, extends the exceptions of vLLM's own
   tests that hold for RELEASE to it, and rewrites the README's table.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "tests" / "vllm_suites" / "SHA256SUMS"
EXCEPTIONS = ROOT / "tests" / "vllm_suites" / "exceptions.txt"
LINES_SOURCE = ROOT / "kvpool" / "vllm" / "releases.py"


@dataclass(frozen=True)
class Mirrored:
    """A file of vLLM's tree that kvpool mirrors or patches."""

    #: Its path inside the release's tree.
    path: str
    #: What kvpool does with it (said in the report).
    why: str
    #: Whether its API (classes, functions, methods, fields) is compared.
    api: bool = False
    #: For a file kvpool only calls into from one place: the callee whose
    #: calls are compared, instead of the whole file (which changes in every
    #: release for reasons of its own).
    call: str | None = None


def _load_module(name: str, path: Path):  # noqa: ANN202
    """A file of the checkout loaded on its own, once, as module ``name``:
    the intake runs without kvpool's dependencies (the package's
    ``__init__`` imports msgspec and the core), so what it loads needs only
    the standard library."""
    import importlib.util

    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise RuntimeError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module


#: The files kvpool only calls into from one place, with the callee whose
#: calls are compared (the rest of such a file changes in every release for
#: reasons of its own); every other mirrored file has its API compared.
_CALL_SITES = {"v1/engine/core.py": "get_request_block_hasher",
               "v1/core/sched/scheduler.py": "KVCacheManager"}

#: Every vLLM file kvpool mirrors or patches (``kvpool.vllm.digests.MIRRORED``,
#: the one list: its digests decide where ``install()`` goes). A line's facade
#: is exact against these files; a release whose copies of them are the same
#: as a listed release's is a release of that line, once the suites agree.
MIRRORED: tuple[Mirrored, ...] = tuple(
    Mirrored(f"vllm/{path}", why, api=path not in _CALL_SITES, call=_CALL_SITES.get(path))
    for path, why in _load_module("_kvpool_digests", ROOT / "kvpool" / "vllm" / "digests.py").MIRRORED
)


# ---------------------------------------------------------------- releases

def version_key(release: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+\.\d+\.\d+", release):
        raise ValueError(f"not a vLLM release number: {release!r} (expected e.g. 0.34.1)")
    return tuple(int(x) for x in release.split("."))


def nearest_listed(version: str, listed: dict[str, str]) -> str:
    """The newest release of ``listed`` (release -> line name) older than
    ``version``: the one whose line the new release would join."""
    older = [r for r in listed if version_key(r) < version_key(version)]
    if not older:
        raise ValueError(f"no listed release is older than {version}")
    return max(older, key=version_key)


def _lines_module():  # noqa: ANN202
    """The checkout's ``kvpool/vllm/releases.py``, loaded on its own."""
    return _load_module("_kvpool_intake_lines", LINES_SOURCE)


def _listed() -> dict[str, str]:
    """Every listed release -> its line's name (``kvpool.vllm.VLLM_LINES``)."""
    lines = _lines_module().VLLM_LINES
    return {release: line.name for line in lines for release in line.releases}


# -------------------------------------------------------------- file diffs

@dataclass
class FileResult:
    """What the intake found for one mirrored file."""

    mirrored: Mirrored
    #: identical | formatting (comments/whitespace only: the same ast) |
    #: changed | missing (in the release) | new (only in the release) | absent (in neither)
    status: str
    detail: str = ""
    api: list[tuple[str, str, str, str]] = field(default_factory=list)
    #: For a call site: identical | formatting | changed | missing.
    call: str = ""
    call_detail: str = ""

    def blocks(self) -> bool:
        """Whether this file keeps the release from joining the line."""
        if self.mirrored.call:
            return self.call not in ("identical", "formatting")
        return self.status not in ("identical", "formatting", "absent")


def _same_ast(old: str, new: str) -> bool:
    try:
        return ast.dump(ast.parse(old)) == ast.dump(ast.parse(new))
    except SyntaxError:
        return False


def changed_lines(old: str, new: str) -> tuple[int, int]:
    """(lines removed, lines added) between two texts."""
    removed = added = 0
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
        if line.startswith("-") and not line.startswith("---"):
            removed += 1
        elif line.startswith("+") and not line.startswith("+++"):
            added += 1
    return removed, added


def compare_file(old: str | None, new: str | None) -> tuple[str, str]:
    """(status, detail) of a file in the nearest release (``old``) and in the
    new one (``new``); None: the file is not in that tree."""
    if old is None and new is None:
        return "absent", "in neither release"
    if new is None:
        return "missing", "gone from the release"
    if old is None:
        return "new", "not in the nearest release"
    if old == new:
        return "identical", ""
    removed, added = changed_lines(old, new)
    if _same_ast(old, new):
        return "formatting", f"comments/formatting only (-{removed} +{added} lines, same ast)"
    return "changed", f"-{removed} +{added} lines"


# ---------------------------------------------------------------- the API

def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    decorators = "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)
    kind = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"{decorators}{kind} {node.name}({ast.unparse(node.args)}){returns}"


def _class_header(node: ast.ClassDef) -> str:
    decorators = "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)
    bases = [ast.unparse(b) for b in node.bases] + [ast.unparse(k) for k in node.keywords]
    return f"{decorators}class {node.name}({', '.join(bases)})"


def api_of(source: str) -> dict[str, str]:
    """A module's API: qualified name -> its text, for the public top-level
    classes, functions and names, and every method (private ones too: other
    vLLM code calls the pool's ``_maybe_evict_cached_block``) and annotated
    field of those classes (the events' fields are their wire format)."""
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not node.name.startswith("_"):
                out[node.name] = _signature(node)
        elif isinstance(node, ast.ClassDef):
            if node.name.startswith("_"):
                continue
            out[node.name] = _class_header(node)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    # Several definitions (a property's getter and setter):
                    # one entry, every signature.
                    name = f"{node.name}.{item.name}"
                    out[name] = f"{out[name]}; {_signature(item)}" if name in out else _signature(item)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    value = f" = {ast.unparse(item.value)}" if item.value is not None else ""
                    out[f"{node.name}.{item.target.id}"] = (
                        f"{item.target.id}: {ast.unparse(item.annotation)}{value}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and not target.id.startswith("_"):
                    out[target.id] = ast.unparse(node)
    return out


def api_diff(old: str, new: str) -> list[tuple[str, str, str, str]]:
    """(added | removed | changed, name, old text, new text) between the APIs
    of two versions of a module, sorted by name."""
    before, after = api_of(old), api_of(new)
    diff = []
    for name in sorted(before.keys() | after.keys()):
        if name not in after:
            diff.append(("removed", name, before[name], ""))
        elif name not in before:
            diff.append(("added", name, "", after[name]))
        elif before[name] != after[name]:
            diff.append(("changed", name, before[name], after[name]))
    return diff


# ----------------------------------------------------------- call sites

def calls(source: str, callee: str) -> list[ast.Call]:
    """Every call of ``callee`` (a name, or an attribute of that name) in
    ``source``, in order."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name == callee:
                found.append(node)
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def compare_call(old: str | None, new: str | None, callee: str) -> tuple[str, str]:
    """(identical | formatting | changed | missing, detail) of the calls of
    ``callee`` in two versions of a file."""
    if old is None or new is None:
        return "missing", "the file is missing"
    before, after = calls(old, callee), calls(new, callee)
    if not before or not after:
        return "missing", f"no call of {callee} in the {'nearest release' if not before else 'release'}"
    old_text = [ast.get_source_segment(old, c) for c in before]
    new_text = [ast.get_source_segment(new, c) for c in after]
    shown = "; ".join(f"line {c.lineno}" for c in after)
    if old_text == new_text:
        return "identical", f"{len(after)} call(s), {shown}"
    if [ast.dump(c) for c in before] == [ast.dump(c) for c in after]:
        return "formatting", f"{len(after)} call(s), {shown}: formatting only"
    return "changed", "\n".join(
        ["was:"] + [f"    {t}" for t in old_text] + ["now:"] + [f"    {t}" for t in new_text])


def diff_trees(old_root: Path, new_root: Path,
               mirrored: tuple[Mirrored, ...] = MIRRORED) -> list[FileResult]:
    """Every mirrored file of the nearest release's tree (``old_root``)
    against the new release's (``new_root``)."""
    results = []
    for m in mirrored:
        paths = (old_root / m.path, new_root / m.path)
        old, new = (p.read_text(encoding="utf-8") if p.is_file() else None for p in paths)
        status, detail = compare_file(old, new)
        result = FileResult(m, status, detail)
        if m.api and old is not None and new is not None and status == "changed":
            result.api = api_diff(old, new)
        if m.call:
            result.call, result.call_detail = compare_call(old, new, m.call)
        results.append(result)
    return results


# ----------------------------------------------------------------- verdict

#: The suites of the test stage: name -> the script that runs it for one
#: release (with the release as its argument).
SUITES = {
    "traces": ("pool differential traces", ".ci/vllm-release-tests.sh"),
    "manager": ("manager driver", ".ci/vllm-mgr-all.sh"),
    "own": ("vLLM's own tests", ".ci/vllm-own-all.sh"),
}


@dataclass
class Verdict:
    add: bool
    text: list[str]


def verdict(version: str, against: str, line: str, files: list[FileResult],
            tests: dict[str, str], found: dict[str, list[str]] | None = None) -> Verdict:
    """The intake's decision. ``tests``: suite key -> passed | FAILED | not
    run (with why); ``found``: suite key -> what its run said went wrong
    (``behaviour``), listed under a suite that did not pass. "Add it" only
    when no mirrored file blocks and every suite of ``SUITES`` passed;
    everything else is listed."""
    must = []
    for f in files:
        if not f.blocks():
            continue
        if f.mirrored.call:
            must.append(f"{f.mirrored.path}: the call of {f.mirrored.call} {f.call} "
                        f"({f.mirrored.why})")
            continue
        must.append(f"{f.mirrored.path} {f.status}: {f.detail} ({f.mirrored.why})")
        for kind, name, old, new in f.api:
            shown = {"added": new, "removed": old}.get(kind, f"{old}  ->  {new}")
            must.append(f"    API {kind}: {name}: {_short(shown)}")
        if f.status == "changed" and not f.api:
            must.append("    API unchanged: behaviour only (the suites show where)")
    for key, (name, _) in SUITES.items():
        result = tests.get(key, "not run")
        if result != "passed":
            must.append(f"{name}: {result}")
            must += [f"    {text}" for text in (found or {}).get(key, [])]
    if must:
        return Verdict(False, [f"verdict: vLLM {version} is not proven to be a release of line "
                               f"{line} ({against}): a new line must cover:"]
                       + [f"      {m.strip()}" if m.startswith(" ") else f"  - {m}"
                          for m in must])
    return Verdict(True, [f"verdict: vLLM {version} is identical to line {line} ({against}): "
                          f"add it"])


def _short(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


# ------------------------------------------------------------------- apply

def add_release(source: str, line: str, release: str) -> str:
    """``kvpool/vllm/releases.py``'s text with ``release`` added, in order, to the
    ``releases`` of the ``VLLMLine`` named ``line``; only that tuple's text
    changes."""
    pattern = re.compile(r'(VLLMLine\(\s*"' + re.escape(line) + r'",\s*)\(([^()]*)\)')
    found = list(pattern.finditer(source))
    if len(found) != 1:
        raise ValueError(f"kvpool/vllm/releases.py has {len(found)} VLLMLine({line!r}, ...) entries, not one")
    match = found[0]
    releases = re.findall(r'"([^"]+)"', match[2])
    if release in releases:
        raise ValueError(f"{release} is already a release of line {line}")
    releases = sorted([*releases, release], key=version_key)
    text = ", ".join(f'"{r}"' for r in releases)
    return source[: match.start(2)] + text + source[match.end(2):]


def extend_exceptions(text: str, against: str, release: str) -> str:
    """exceptions.txt's text with every entry that covers ``against``
    extended to ``release``: the intake ran vLLM's own tests of ``release``
    against ``against``'s exceptions and found each still failing for its
    listed reason (compare.py fails the run otherwise)."""
    out = []
    for raw in text.splitlines(keepends=True):
        line = raw.strip()
        if line and not line.startswith("#"):
            releases, rest = line.split(maxsplit=1)
            first, _, last = releases.partition("..")
            last = last or first
            covers = version_key(first) <= version_key(against) <= version_key(last)
            if covers and version_key(last) < version_key(release):
                raw = raw.replace(releases, f"{first}..{release}", 1)
        out.append(raw)
    return "".join(out)


def apply(version: str, against: str, line: str, tree: Path) -> list[str]:
    """Add ``version`` (its source tree: ``tree``) to ``line`` for good; what
    was done, one a line.
    Nothing is edited unless the README's table can be rewritten after: that
    imports kvpool (its dependencies), which the diff and the suites do not
    need from this interpreter."""
    probe = subprocess.run([sys.executable, "-c", "import kvpool.vllm"], cwd=ROOT,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(
            f"--apply rewrites the README's table with tools/release_table.py, which imports "
            f"kvpool; {sys.executable} cannot ({probe.stderr.strip().splitlines()[-1]}): run "
            f"the intake with an interpreter where kvpool imports (pip install -e .)")
    done = []
    source = LINES_SOURCE.read_text(encoding="utf-8")
    LINES_SOURCE.write_text(add_release(source, line, version), encoding="utf-8")
    done.append(f"kvpool/vllm/releases.py: {version} added to line {line}")
    old = EXCEPTIONS.read_text(encoding="utf-8")
    new = extend_exceptions(old, against, version)
    if new != old:
        EXCEPTIONS.write_text(new, encoding="utf-8")
        done.append(f"tests/vllm_suites/exceptions.txt: {against}'s exceptions extended to {version}")
    subprocess.run([sys.executable, str(ROOT / "tools" / "release_table.py"), "--write"],
                   check=True, cwd=ROOT)
    done.append("README.md: the release table rewritten (tools/release_table.py --write)")
    digests = _load_module("_kvpool_release_digests", ROOT / "tools" / "release_digests.py")
    digests.add_release(version, tree)
    done.append(f"kvpool/vllm/_release_digests.py: the digests of vLLM {version}'s mirrored "
                f"files (install() accepts its code)")
    done.append(f"the pin of vLLM {version}'s sdist stays in tests/vllm_suites/SHA256SUMS")
    return done


# ---------------------------------------------------------- fetch and run

def pinned(version: str) -> bool:
    return re.search(rf"\bvllm-{re.escape(version)}(\.tar\.gz|-)", PINS.read_text()) is not None


def fetch(version: str, pin_new: bool) -> Path:
    """The release's tree (``.ci/vllm-src.sh``); with ``pin_new`` a release
    with no pin gets one first (``.ci/pypi-fetch.py --pin-new``)."""
    if not pinned(version):
        if not pin_new:
            raise RuntimeError(
                f"vLLM {version} has no pin in {PINS.relative_to(ROOT)}: give --pin-new to "
                f"record the sha256 the index gives for its sdist (then review and commit it)")
        subprocess.run([sys.executable, str(ROOT / ".ci" / "pypi-fetch.py"), "--pin-new",
                        f"vllm=={version}", "sdist"], check=True, stdout=subprocess.DEVNULL)
        print(f"!!!!! NEW PIN: vLLM {version}'s sdist is now pinned in "
              f"{PINS.relative_to(ROOT)}; check it and commit it !!!!!", flush=True)
    done = subprocess.run(["bash", str(ROOT / ".ci" / "vllm-src.sh"), version, sys.executable],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"no source tree for vLLM {version}: {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


def behaviour(output: list[str]) -> list[str]:
    """What a suite's output says went wrong, most frequent first: the
    failure of each test lost with kvpool that is no listed exception
    (``compare.py``'s ``NOT LISTED; with kvpool: ...``), counted by message."""
    counts: dict[str, int] = {}
    for text in output:
        _, hit, said = text.partition("NOT LISTED; with kvpool: ")
        if hit:
            counts[said.strip()] = counts.get(said.strip(), 0) + 1
    return [f"{n} test(s) fail with kvpool only: {_short(said)}"
            for said, n in sorted(counts.items(), key=lambda item: -item[1])]


def run_suite(key: str, version: str, env: dict[str, str]) -> tuple[str, str, list[str],
                                                                     list[str]]:
    """Run one suite's script for ``version``, its output shown as it comes
    (each line prefixed with the suite and the seconds so far); (passed |
    FAILED (exit N), the same with the time taken, the script's summary
    lines, what went wrong: ``behaviour`` or, without that, the summary)."""
    name, script = SUITES[key]
    started = time.monotonic()
    print(f"== tests: {name} ({script} {version})", flush=True)
    proc = subprocess.Popen(["bash", str(ROOT / script), version], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # type: ignore[union-attr]
        line = line.rstrip("\n")
        lines.append(line)
        print(f"   [{key} {time.monotonic() - started:5.0f}s] {line}", flush=True)
    rc = proc.wait()
    last = max((i for i, text in enumerate(lines) if text.startswith("== ")), default=-1)
    summary = [text.strip() for text in lines[last + 1:] if text.startswith("   ")]
    result = "passed" if rc == 0 else f"FAILED (exit {rc})"
    wrong = behaviour(lines) or [_short(text, 400) for text in summary]
    return result, f"{result}, {time.monotonic() - started:.0f}s", summary, wrong


def build_wheel(tmp: Path) -> Path:
    """One kvpool wheel of this checkout for every suite (each would build its own)."""
    print("== kvpool wheel of this checkout, for the suites", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "-q",
                    "--no-deps", "-w", str(tmp), str(ROOT)], check=True)
    return next(tmp.glob("kvpool-*.whl"))


# -------------------------------------------------------------------- main

def report_files(files: list[FileResult]) -> None:
    print("== diff: every file kvpool mirrors or patches")
    for f in files:
        status = f"{f.status}{': ' + f.detail if f.detail else ''}"
        print(f"   {f.mirrored.path}: {status}")
        if f.mirrored.call:
            print(f"      call of {f.mirrored.call}: {f.call}"
                  + (f" ({f.call_detail})" if "\n" not in f.call_detail else ""))
            if "\n" in f.call_detail:
                print("\n".join(f"         {t}" for t in f.call_detail.splitlines()))
        for kind, name, old, new in f.api:
            shown = {"added": new, "removed": old}.get(kind, f"{old}\n            now: {new}")
            print(f"      API {kind}: {name}: {shown}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="docs/intake.md: the way to add a release")
    p.add_argument("version", help="the vLLM release to take in, e.g. 0.34.1")
    p.add_argument("--against", metavar="RELEASE",
                   help="a listed release to compare with (default: the newest listed release "
                        "older than VERSION); VERSION is then treated as unlisted")
    p.add_argument("--pin-new", action="store_true",
                   help="pin the release's sdist if it has no pin (tests/vllm_suites/SHA256SUMS)")
    tests = p.add_mutually_exclusive_group()
    tests.add_argument("--skip-tests", action="store_true", help="diff only (never 'add it')")
    tests.add_argument("--run-tests", action="store_true",
                       help="run the suites even when the diff found changes (to see what fails)")
    p.add_argument("--suites", default=",".join(SUITES),
                   help=f"the suites to run, of {','.join(SUITES)} (default: all; a suite "
                        "left out is 'not run' and keeps the verdict from 'add it')")
    p.add_argument("--apply", action="store_true",
                   help="on 'add it': add VERSION to the line (kvpool/vllm/releases.py), extend the "
                        "exceptions, rewrite the README's release table")
    a = p.parse_args(argv)
    started = time.monotonic()
    try:
        version_key(a.version)
        listed = _listed()
        against = a.against or nearest_listed(a.version, {r: n for r, n in listed.items()
                                                          if r != a.version})
        if against not in listed:
            raise ValueError(f"--against {against}: not a listed release")
        if version_key(against) >= version_key(a.version):
            raise ValueError(f"{against} is not older than {a.version}")
        suites = [s.strip() for s in a.suites.split(",") if s.strip()]
        unknown = [s for s in suites if s not in SUITES]
        if unknown:
            raise ValueError(f"--suites: unknown {unknown}; known: {', '.join(SUITES)}")
    except ValueError as exc:
        print(f"intake: {exc}", file=sys.stderr)
        return 2
    line = listed[against]
    intake_var = _lines_module().INTAKE_VAR
    print(f"== vLLM {a.version} against line {line}, its release {against}"
          + (f" (vLLM {a.version} is listed in line {listed[a.version]}; treated as unlisted)"
             if a.version in listed else ""), flush=True)
    try:
        new_root = fetch(a.version, a.pin_new)
        old_root = fetch(against, False)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"verdict: vLLM {a.version} stays refused: {exc}")
        return 1
    print(f"   trees: {new_root}, {old_root}")
    files = diff_trees(old_root, new_root)
    report_files(files)

    changed = [f.mirrored.path for f in files if f.blocks()]
    found: dict[str, list[str]] = {}
    skipped = ("not run (--skip-tests)" if a.skip_tests else
               "not run: the diff already shows changes (--run-tests runs them anyway)"
               if changed and not a.run_tests else "")
    if skipped:
        results = {key: skipped for key in SUITES}
        print(f"== tests: {skipped}")
    else:
        results = {key: "not run (--suites)" for key in SUITES if key not in suites}
        shown, summaries, found = {}, {}, {}
        with tempfile.TemporaryDirectory(prefix="kvpool-intake.") as tmp:
            env = dict(os.environ, **{intake_var: f"{a.version}={against}"})
            try:
                env["KVPOOL_WHEEL"] = str(build_wheel(Path(tmp)))
            except subprocess.CalledProcessError as exc:
                print(f"verdict: vLLM {a.version} is not proven: no kvpool wheel of this "
                      f"checkout to test with ({exc})")
                return 1
            for key in suites:
                results[key], shown[key], summaries[key], found[key] = run_suite(
                    key, a.version, env)
        print("== tests: summary")
        for key, (name, _) in SUITES.items():
            print(f"   {name}: {shown.get(key, results[key])}")
            for text in summaries.get(key, []):
                print(f"      {text}")

    decided = verdict(a.version, against, line, files, results, found)
    print("\n".join(decided.text))
    print(f"   ({time.monotonic() - started:.0f}s)")
    if a.apply:
        if not decided.add:
            print("--apply: nothing applied: the verdict is not 'add it'")
        elif a.version in listed:
            print(f"--apply: nothing to apply: {a.version} is already in line {listed[a.version]}")
        else:
            try:
                print("\n".join(f"--apply: {done}" for done in apply(a.version, against, line, new_root)))
            except RuntimeError as exc:
                print(f"--apply: nothing applied: {exc}")
                return 1
    return 0 if decided.add else 1


if __name__ == "__main__":
    sys.exit(main())
