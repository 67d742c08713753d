"""The hypothesis state machine of the 0.34 line: the 0.33 line's machine
(``test_v033_stateful.py``: every operation family of the differential
tests, misuse refused alike and changing nothing, the SPEC section 2
invariants and identical state in every core after every step) driving
``kvpool.v0_34`` pools, whose blocks hold their pool weakly and whose map
shows block ids, with ``free_blocks(evict_first=)`` among the frees."""

from __future__ import annotations

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from _helpers import run_state_machine_under_dev_mode
from test_v033_stateful import PoolMachine33


class PoolMachine34(PoolMachine33):
    LINE = "kvpool.v0_34"


def test_state_machine(all_cores):
    machine = type("PoolMachine34OverCores", (PoolMachine34,), {"cores": all_cores})
    run_state_machine_as_test(machine, settings=settings())


def test_state_machine_under_dev_mode(no_c_extensions):
    """The state machine again, in ``python -X dev`` (see the 0.33 line's)."""
    run_state_machine_under_dev_mode("test_v034_stateful.py", no_c_extensions)
