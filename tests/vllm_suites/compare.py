"""Compare a stock run of vLLM's own tests with a run with kvpool swapped in
(two JUnit XML files written by pytest) and apply the rule of
docs/vllm-integration.md, "vLLM's own tests": every test that passes with vLLM's pool passes with
kvpool's, except the ones listed in ``exceptions.txt`` for this release, each
with the safety property it protects.

usage: python compare.py VERSION STOCK.xml SWAPPED.xml
Exit status 0 when the rule holds; 1 otherwise (the offending tests are
listed). A listed exception that passes with kvpool is reported (the list
must stay short and true) and fails the run too.
"""

from __future__ import annotations

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


def exceptions(version: str) -> dict[str, str]:
    """``VERSION TEST-ID -- reason`` lines of exceptions.txt for ``version``."""
    listed = {}
    for line in (HERE / "exceptions.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        head, _, reason = line.partition(" -- ")
        release, test_id = head.split(maxsplit=1)
        if release == version:
            listed[test_id.strip()] = reason.strip()
    return listed


def main(version: str, stock_xml: str, swapped_xml: str) -> int:
    stock, swapped = outcomes(stock_xml), outcomes(swapped_xml)
    listed = exceptions(version)
    passed_stock = {t for t, o in stock.items() if o == "passed"}
    passed_kvpool = {t for t, o in swapped.items() if o == "passed"}
    lost = sorted(passed_stock - passed_kvpool)
    unexplained = [t for t in lost if t not in listed]
    stale = sorted(t for t in listed if t in passed_kvpool or t not in passed_stock)
    print(f"vLLM {version}'s own tests: {len(stock)} collected; {len(passed_stock)} pass "
          f"with vLLM's pool, {len(passed_kvpool)} with kvpool's; the difference: "
          f"{len(lost)} test(s), {len(lost) - len(unexplained)} of them listed exceptions")
    for t in lost:
        print(f"   exception: {t}  -- {listed.get(t, 'NOT LISTED')}")
    failing_both = sorted(t for t, o in stock.items() if o != "passed")
    if failing_both:
        print(f"   {len(failing_both)} fail or skip with vLLM's own pool too (out of scope: "
              "a model download, a GPU or a server), e.g. " + ", ".join(failing_both[:3]))
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
    print(f"vLLM {version}'s own tests: {'rule holds' if status == 0 else 'RULE BROKEN'}")
    return status


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
