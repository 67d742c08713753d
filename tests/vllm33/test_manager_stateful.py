"""kvpool's 0.33 ``KVCacheManager`` (``kvpool.v0_33.kv_cache_manager``: vLLM's
class with compiled ``allocate_slots`` and ``cache_blocks``) over kvpool's 0.33
pool, on either core, against vLLM 0.33's own manager over vLLM's own pool:
the hypothesis state machine of ``manager_machine.py`` drives both with the
same operations and compares everything observable after every step (its
docstring lists the configurations, operations and comparisons).

- ``test_state_machine``: the machine for each layout (one full-attention
  group, full + sliding window with equal and with unequal block sizes) with
  prefix caching on and off, the core drawn per example from the selected
  cores (``--no-c-extensions``: the pure-Python core alone); over each run
  the compiled paths must have served calls themselves
  (``_kvpool_plan.counts["fast"]``) and handed calls to vLLM's code
  (``base``), so that both sides of each decision were compared
  (``manager_machine.run_until_served``);
- ``test_state_machine_under_dev_mode``: the same in ``python -X dev``;
- ``test_a_broken_manager_is_caught``: kvpool's manager broken in one detail
  (every 5th ``cache_blocks`` does nothing; every 3rd ``allocate_slots``
  delays caching; every 4th leaves an align-mode Mamba group's request
  unmarked as running) fails the machine, within a second.

Sizes: ``KVPOOL_HYPOTHESIS_EXAMPLES`` examples per layout and caching
(default 30 here, so that the file stays within about a minute on the 2-core
machine: the conftest's 200 is for the pool machines' single test),
``KVPOOL_DEV_MODE_EXAMPLES`` under ``-X dev`` (default 5); the ``ci``
profile makes both deterministic.
"""

from __future__ import annotations

import os

import pytest
from _helpers import run_state_machine_under_dev_mode
from hypothesis.stateful import run_state_machine_as_test
import manager_machine as mm

from kvpool.v0_33.kv_cache_manager import KVCacheManager
from kvpool.v0_33.vllm_events import vllm_block_pool_class

EXAMPLES = int(os.environ.get("KVPOOL_HYPOTHESIS_EXAMPLES", "30"))
DEV_MODE_EXAMPLES = 5


@pytest.mark.parametrize(
    ("layout", "caching"),
    [pytest.param(l, c, id=f"{l}-{'caching' if c else 'no-caching'}") for l, c in mm.CASES],
)
def test_state_machine(layout: str, caching: bool, all_cores) -> None:
    machine = mm.machine_for(layout, caching, KVCacheManager, vllm_block_pool_class, all_cores)
    mm.run_until_served(machine, EXAMPLES)


def test_state_machine_under_dev_mode(no_c_extensions) -> None:
    """The state machine again, in ``python -X dev``: memory errors in the
    compiled manager paths show up there as crashes rather than passing by."""
    run_state_machine_under_dev_mode(
        "vllm33/test_manager_stateful.py",
        no_c_extensions,
        DEV_MODE_EXAMPLES,
        passed=len(mm.CASES),
    )


@pytest.mark.parametrize("broken", list(mm.BROKEN))
def test_a_broken_manager_is_caught(broken: str, all_cores) -> None:
    """The comparison is not vacuous: a manager that differs from vLLM's in
    one detail (``manager_machine.BROKEN``) fails the machine."""
    breaks, layout = mm.BROKEN[broken]
    machine = mm.machine_for(layout, True, breaks(KVCacheManager), vllm_block_pool_class,
                             all_cores[:1])
    with pytest.raises(AssertionError, match=mm.MISMATCH):
        run_state_machine_as_test(machine, settings=mm.broken_machine_settings(EXAMPLES))
