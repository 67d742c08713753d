"""One line of .ci/vllm-mgr-all.sh's summary: what a release's run of
tests/vllm_release_mgr found, from pytest's JUnit XML.

usage: python3 vllm-mgr-summary.py JUNIT_XML PYTEST_EXIT_CODE
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET

# Test function -> what the summary calls it.
CHECKS = {
    "test_vllm_against_itself": "vLLM vs vLLM",
    "test_kvpool_against_vllm": "kvpool vs vLLM",
    "test_a_broken_pool_is_caught": "broken pools caught",
    "test_kvpool_manager_against_vllm": "kvpool's manager vs vLLM's",
    "test_a_broken_manager_is_caught": "broken manager caught",
    "test_a_manager_that_keeps_the_eagle_block_is_caught": "EAGLE block kept, caught",
    "test_manager_state_machine": "manager state machine",
    "test_a_broken_manager_fails_the_machine": "broken managers fail the machine",
    "test_scheduler_with_kvpool_against_vllm": "vLLM's schedulers, kvpool vs stock",
    # (the module skips whole where kvpool's line has no manager)
    "test_release_scheduler": "vLLM's schedulers, kvpool vs stock",
    "test_a_placeholder_miscount_is_caught": "placeholder miscount caught",
    "test_a_broken_pool_is_caught_by_the_schedulers": "broken pool caught by the schedulers",
}


def outcome(case: ET.Element) -> tuple[str, str]:
    for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        child = case.find(tag)
        if child is not None:
            return name, child.get("message", "")
    return "passed", ""


def main(path: str, rc: str) -> str:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return f"FAILED (pytest exit {rc}, no report)"
    properties = {p.get("name"): p.get("value") for p in root.iter("property")}
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    reasons: dict[str, str] = {}
    workloads = set()
    for case in root.iter("testcase"):
        function, _, params = case.get("name", "").partition("[")
        result, message = outcome(case)
        counts[CHECKS.get(function, "other")][result] += 1
        if function == "test_vllm_against_itself":
            workloads.add(params)
        if result != "passed":
            first = message.splitlines()[0][:80] if message else ""
            reasons.setdefault(CHECKS.get(function, "other"), first)
    parts = [
        f"{'passed' if rc == '0' else f'FAILED (pytest exit {rc})'}",
        f"{properties.get('driver', '?')}, {len(workloads)} workloads",
    ]
    for check in [*dict.fromkeys(CHECKS.values()), "other"]:
        if check not in counts:
            continue
        said = ", ".join(f"{n} {result}" for result, n in sorted(counts[check].items()))
        line = properties.get("kvpool_line")
        if check == "kvpool vs vLLM" and line:
            if line == "none" and set(counts[check]) == {"skipped"}:
                parts.append("kvpool vs vLLM: no kvpool line")
                continue
            check = f"kvpool {line} vs vLLM"
        if check == "other" and set(counts[check]) == {"passed"}:
            continue
        if reasons.get(check) and "no line" not in reasons[check]:
            said += f" ({reasons[check]})"
        parts.append(f"{check}: {said}")
    return "; ".join(parts)


if __name__ == "__main__":
    print(main(*sys.argv[1:3]))
