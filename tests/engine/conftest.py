"""The engine tests' switch for the planted-fault proofs.

A test marked ``proof`` runs an engine with a deliberately broken pool or
manager and checks that the comparison catches it: it shows the identity
tests can fail. The comparison is the same code for every release, so the
full CI run runs the proofs on one release (``.ci/vllm-engine-tests.sh``:
the last of its list) and sets ``KVPOOL_ENGINE_PROOFS=0`` for the others;
every other CI run sets it for all (the proofs prove the tests, which
change only with ``tests/engine``).

A scenario marked ``full_run`` is one that another scenario of every CI run
covers (the same model and manager paths, under more pressure): it runs
unless ``KVPOOL_ENGINE_ALL=0``, which every CI run but the full one sets
(``.ci/run``), to keep the run in its time budget.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "proof: a planted-fault run that must be caught")
    config.addinivalue_line("markers", "full_run: a scenario another one covers; the full run runs it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {}
    if os.environ.get("KVPOOL_ENGINE_PROOFS", "1") == "0":
        skips["proof"] = pytest.mark.skip(
            reason="KVPOOL_ENGINE_PROOFS=0: the proofs run on another release, or in the full run")
    if os.environ.get("KVPOOL_ENGINE_ALL", "1") == "0":
        skips["full_run"] = pytest.mark.skip(
            reason="KVPOOL_ENGINE_ALL=0: a scenario another one covers, run in the full run")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
