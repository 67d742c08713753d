"""Compare a stock run of vLLM's own tests with a run with kvpool swapped in
(two JUnit XML files written by pytest) and apply the rule of
docs/vllm-integration.md, "vLLM's own tests": every test that passes with vLLM's pool passes with
kvpool's, except the ones listed in ``exceptions.txt`` for this release, each
with the safety property it protects.

usage: python compare.py VERSION STOCK.xml [SWAPPED.xml]
Exit status 0 when the rule holds; 1 otherwise (the offending tests are
listed). A listed exception (exceptions.txt: one release or a range of them)
that passes with kvpool, or fails with it for another reason than the one
listed, is reported (the list must stay short and true) and fails the run
too. Without SWAPPED.xml it only counts what passes stock. The last line is a one-line summary
(``summary: tests=... stock=... kvpool=... exceptions=...: rule holds``).
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent


def outcomes(path: str) -> dict[str, str]:
    """test id -> passed | failed | skipped."""
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            result[test_id] = "failed"
        elif "skipped" in kinds:
            result[test_id] = "skipped"
        else:
            result[test_id] = "passed"
    return result


# What a test that wants a model's configuration from a hub fails with,
# offline (vLLM's ModelConfig, huggingface_hub).
HUB_FAILURES = ("Invalid repository ID or local directory", "LocalEntryNotFoundError",
                "offline mode is enabled")
# A fixture of vLLM's tests/conftest.py, which the runs leave out.
MISSING_FIXTURE = "fixture '"


def failures(path: str) -> dict[str, str]:
    """test id -> the message and text of its failure or error."""
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                test_id = f"{case.get('classname')}::{case.get('name')}"
                found[test_id] = f"{child.get('message', '')}\n{child.text or ''}"
    return found


def report_stock_failures(stock: dict[str, str], stock_xml: str) -> int:
    """Print what fails with vLLM's own pool (out of scope), by cause; the
    number of those that want a model from a hub."""
    failing = sorted(t for t, o in stock.items() if o != "passed")
    texts = failures(stock_xml)
    hub = [t for t in failing if any(m in texts.get(t, "") for m in HUB_FAILURES)]
    fixture = [t for t in failing if t not in hub and MISSING_FIXTURE in texts.get(t, "")]
    other = [t for t in failing if t not in hub and t not in fixture]
    if failing:
        print(f"   {len(failing)} fail or skip with vLLM's own pool too (out of scope): "
              f"{len(hub)} want a model's config from a hub (the run is offline), "
              f"{len(fixture)} a fixture of vLLM's tests/conftest.py (left out), "
              f"{len(other)} for other reasons" + (": " + ", ".join(other[:5]) if other else ""))
    return len(hub)


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def applies(releases: str, version: str) -> bool:
    """Whether an exceptions.txt entry for ``releases`` (``0.25.0``, or the
    inclusive range ``0.25.0..0.33.0``) covers ``version``."""
    first, _, last = releases.partition("..")
    return _release(first) <= _release(version) <= _release(last or first)


def intake_release(version: str) -> str:
    """The release whose exceptions ``version`` is held to: its own, or,
    for the release the intake is deciding about (``KVPOOL_VLLM_INTAKE=
    VERSION=LISTED``, tools/intake.py), LISTED's: the new release must keep
    every exception of the line it would join, for the same reason."""
    value = os.environ.get("KVPOOL_VLLM_INTAKE", "")
    new, _, listed = (part.strip() for part in value.partition("="))
    return listed if listed and new == version else version


def exceptions(version: str) -> dict[str, tuple[str, str]]:
    """test id -> (what its failure with kvpool says, the property it protects)
    from the ``RELEASES TEST-ID -- FAILURE -- PROPERTY`` lines of
    exceptions.txt that cover ``version``."""
    version = intake_release(version)
    listed = {}
    for line in (HERE / "exceptions.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        head, expected, reason = (part.strip() for part in line.split(" -- ", 2))
        releases, test_id = head.split(maxsplit=1)
        if applies(releases, version):
            listed[test_id.strip()] = (expected, reason)
    return listed


def main(version: str, stock_xml: str, swapped_xml: str | None = None) -> int:
    stock = outcomes(stock_xml)
    if swapped_xml is None:
        passed = sum(o == "passed" for o in stock.values())
        print(f"vLLM {version}'s own tests: {len(stock)} collected; {passed} pass with "
              "vLLM's pool (stock only: no comparison)")
        hub = report_stock_failures(stock, stock_xml)
        print(f"summary: tests={len(stock)} stock={passed} hub={hub}: stock only")
        return 0
    swapped = outcomes(swapped_xml)
    listed = exceptions(version)
    passed_stock = {t for t, o in stock.items() if o == "passed"}
    passed_kvpool = {t for t, o in swapped.items() if o == "passed"}
    lost = sorted(passed_stock - passed_kvpool)
    unexplained = [t for t in lost if t not in listed]
    stale = sorted(t for t in listed if t in passed_kvpool or t not in passed_stock)
    # An exception holds only if the test fails for the reason listed: a test
    # that fails with kvpool for another reason is a difference, not a
    # safety property.
    texts = failures(swapped_xml)
    other_cause = sorted(t for t in lost if t in listed and listed[t][0] not in texts.get(t, ""))
    print(f"vLLM {version}'s own tests: {len(stock)} collected; {len(passed_stock)} pass "
          f"with vLLM's pool, {len(passed_kvpool)} with kvpool's; the difference: "
          f"{len(lost)} test(s), {len(lost) - len(unexplained)} of them listed exceptions")
    for t in lost:
        said = texts[t].strip().splitlines()[0][:200] if texts.get(t) else "?"
        print(f"   exception: {t}  -- "
              + (listed[t][1] if t in listed else f"NOT LISTED; with kvpool: {said}"))
    hub = report_stock_failures(stock, stock_xml)
    gained = sorted(passed_kvpool - passed_stock)
    if gained:
        print(f"   {len(gained)} pass only with kvpool: " + ", ".join(gained[:5]))
    status = 0
    if unexplained:
        print("!! passes with vLLM's pool, fails with kvpool's, not a listed exception:")
        print("\n".join(f"   {t}" for t in unexplained))
        status = 1
    if stale:
        print("!! listed exceptions that do not hold (passes with kvpool, or not with vLLM):")
        print("\n".join(f"   {t}" for t in stale))
        status = 1
    if other_cause:
        print("!! listed exceptions that fail with kvpool for another reason than listed:")
        for t in other_cause:
            said = texts[t].strip().splitlines()[0][:200] if texts.get(t) else "?"
            print(f"   {t}: expected {listed[t][0]!r}, got: {said}")
        status = 1
    print(f"vLLM {version}'s own tests: {'rule holds' if status == 0 else 'RULE BROKEN'}")
    print(f"summary: tests={len(stock)} stock={len(passed_stock)} hub={hub} "
          f"kvpool={len(passed_kvpool)} exceptions={len(lost) - len(unexplained)}: "
          f"{'rule holds' if status == 0 else 'RULE BROKEN'}")
    return status


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
