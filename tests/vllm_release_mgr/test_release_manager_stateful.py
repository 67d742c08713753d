"""kvpool's KV-cache manager of the loaded release's line
(``kvpool.vllm.vllm_line(vllm.__version__).manager``) over kvpool's pool of
that line, on either core, against the release's own manager over its own
pool: the hypothesis state machine of ``tests/vllm33/manager_machine.py``
(its docstring says what it drives and compares), for each layout with
prefix caching on and off. Skipped for the releases whose line has no kvpool
manager (before 0.30). In the overlay environment (see ``conftest.py``).

``KVPOOL_HYPOTHESIS_EXAMPLES`` examples per layout and caching (default 15
here, about 6 s a release on the 2-core machine: ``.ci/vllm-mgr-all.sh`` runs
every release), then twice as many, up to sixteen times, where a run left
a path unexercised (``manager_machine.run_until_served``); the ``ci``
profile makes them deterministic.
"""

from __future__ import annotations

import importlib
import os

import pytest
import vllm

import kvpool.vllm as kv_vllm
from kvpool.vllm import vllm_block_pool_class

RELEASE = vllm.__version__
try:
    LINE = kv_vllm.vllm_line(RELEASE)
except kv_vllm.UnsupportedVLLMVersionError:
    pytest.skip(f"kvpool has no line for vLLM {RELEASE}", allow_module_level=True)
if LINE.manager is None:
    pytest.skip(f"kvpool's {LINE.name} line has no KV-cache manager", allow_module_level=True)

# The machine's driver (vllm_workload33) serves 0.26.0 on, so every line
# with a manager.
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402
import manager_machine as mm  # noqa: E402

EXAMPLES = int(os.environ.get("KVPOOL_HYPOTHESIS_EXAMPLES", "15"))


def manager_class() -> type:
    return importlib.import_module(LINE.manager).KVCacheManager


def pool_class(core) -> type:
    return vllm_block_pool_class(LINE.name, core)


@pytest.mark.parametrize(
    ("layout", "caching"),
    [pytest.param(l, c, id=f"{l}-{'caching' if c else 'no-caching'}") for l, c in mm.CASES],
)
def test_manager_state_machine(layout: str, caching: bool, all_cores) -> None:
    machine = mm.machine_for(layout, caching, manager_class(), pool_class, all_cores)
    mm.run_until_served(machine, EXAMPLES)


@pytest.mark.parametrize("broken", list(mm.BROKEN))
def test_a_broken_manager_fails_the_machine(broken: str, all_cores) -> None:
    """The machine is not vacuous on this release: kvpool's manager broken in
    one detail fails it."""
    breaks, layout = mm.BROKEN[broken]
    machine = mm.machine_for(layout, True, breaks(manager_class()), pool_class, all_cores[:1])
    with pytest.raises(AssertionError, match=mm.MISMATCH):
        run_state_machine_as_test(machine, settings=mm.broken_machine_settings(EXAMPLES))
