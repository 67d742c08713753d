"""What the tests against a real vLLM (tests/vllm for the 0.15 line,
tests/vllm33 for the 0.33 line, tests/vllm_release_mgr) share: the
strict-mode checks, kvpool's entry point, a clean install state around every
test, and putting a pool class where vLLM builds its pool. Imports neither
vLLM nor anything that does (``pool_in_vllm`` imports it when entered)."""

from __future__ import annotations

import importlib.metadata
import os

import pytest

# vLLM builds the pool class given inside ``with pool_in_vllm(cls):`` (the
# manager suite's; it imports vLLM when entered).
from kvpool.vllm.proof._in_vllm import pool_in_vllm as pool_in_vllm

#: Set by .ci/vllm-tests.sh: what would be a skip or a quiet fallback (the
#: pure-Python core, a kvpool without its entry point) is a failure.
STRICT = os.environ.get("KVPOOL_VLLM_STRICT") == "1"


def check_strict_core() -> None:
    """Under KVPOOL_VLLM_STRICT=1, kvpool's compiled core must be loaded."""
    import kvpool

    if STRICT and not kvpool.USING_EXTENSION:
        raise pytest.UsageError(
            f"KVPOOL_VLLM_STRICT=1 but kvpool's compiled core is not loaded "
            f"(kvpool imported from {kvpool.__file__})"
        )


def check_expected_release() -> None:
    """``KVPOOL_VLLM_EXPECT`` (set by the per-release CI scripts to the
    release whose tree they put first on ``PYTHONPATH``): the vLLM imported
    must be that release. A tree missing when Python started (another step
    replacing it, a fetch that failed quietly) would otherwise test the
    environment's own vLLM under the release's name."""
    expected = os.environ.get("KVPOOL_VLLM_EXPECT")
    if not expected:
        return
    import vllm

    if vllm.__version__ != expected:
        raise pytest.UsageError(
            f"KVPOOL_VLLM_EXPECT={expected} but vLLM {vllm.__version__} was imported "
            f"(from {os.path.dirname(vllm.__file__)}): the release's tree was not on PYTHONPATH"
        )


def kvpool_entry_point() -> importlib.metadata.EntryPoint:
    """kvpool's ``vllm.general_plugins`` entry point; without it (kvpool not
    pip-installed) the test is skipped, or fails under KVPOOL_VLLM_STRICT=1."""
    for ep in importlib.metadata.entry_points(group="vllm.general_plugins"):
        if ep.name == "kvpool":
            return ep
    if STRICT:
        pytest.fail("kvpool's vllm.general_plugins entry point is not installed")
    pytest.skip(
        "kvpool is not pip-installed here (no vllm.general_plugins entry point)"
    )


@pytest.fixture(autouse=True)
def no_leftover_install(monkeypatch: pytest.MonkeyPatch):
    """Every test starts and ends with vLLM's own pool in place, KVPOOL_VLLM
    unset and the ``kvpool`` logger as it was (a conftest imports this to
    make it autouse there). ``plugin()`` and ``install()`` join that logger
    to vLLM's handlers with ``propagate`` off (``kvpool.vllm.logs``), once
    per process; left joined, a later test's ``caplog`` (a handler on the
    root logger) would never see kvpool's records."""
    import logging

    import kvpool.vllm as kv_vllm

    kv_vllm.uninstall()
    monkeypatch.delenv("KVPOOL_VLLM", raising=False)
    kvpool_logger = logging.getLogger("kvpool")
    handlers = list(kvpool_logger.handlers)
    level, propagate = kvpool_logger.level, kvpool_logger.propagate
    yield
    kv_vllm.uninstall()
    kvpool_logger.handlers[:] = handlers
    kvpool_logger.setLevel(level)
    kvpool_logger.propagate = propagate


def pretend_code(monkeypatch: pytest.MonkeyPatch, version: str, *, release: str | None = None,
                 changed: str | None = None) -> dict[str, str]:
    """Make the imported vLLM look like another build to kvpool: version
    ``version``, its mirrored files those of listed release ``release``
    (default: the files installed here) with ``changed`` (a path of
    ``kvpool.vllm.digests.MIRRORED``) edited. kvpool judges vLLM by those
    files (``kvpool.vllm.digests``); the digests it would read are what is
    replaced, the files stay as they are. Returns the digests."""
    import vllm

    from kvpool.vllm import digests

    if release is None:
        code = digests.installed_digests()
    else:
        code = digests.release_digests()[release]
    if changed is not None:
        if changed not in code:
            raise ValueError(f"{changed!r} is not a mirrored file")
        code = dict(code, **{changed: "0" * 64})
    monkeypatch.setattr(digests, "installed_digests", lambda: dict(code))
    monkeypatch.setattr(vllm, "__version__", version)
    return code
