"""A pytest plugin that runs vLLM's own tests with kvpool's classes in place
of vLLM's: ``pytest -p kvpool_swap <vLLM's test files>`` (with this directory
on ``sys.path``). ``KVPOOL_SWAP=0`` runs them stock, for the comparison.

Before any test module is imported, every ``vllm.*`` module that binds
``BlockPool``, ``BlockHashToBlockMap``, ``KVCacheBlock`` or
``FreeKVCacheBlockQueue`` to vLLM's own class gets the class of the release's
kvpool line instead (``kvpool.vllm.vllm_line(vllm.__version__)``: the line's
module's blocks, queue and map, and its pool as installed into vLLM), so the
tests' ``from vllm.v1.core.block_pool import BlockPool`` and vLLM's own
managers both see kvpool, all four names from one line. A release without a
line is a usage error naming it. Events stay vLLM's classes: the pool
installed into vLLM queues vLLM's own event objects
(``kvpool.vllm_events``), which the tests compare and check the class of.
After collection, a module of vLLM or of the tests that still binds one of
vLLM's originals is an error. The core is the compiled one unless
``KVPOOL_NO_EXTENSIONS=1``.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

NAMES = ("BlockPool", "BlockHashToBlockMap", "KVCacheBlock", "FreeKVCacheBlockQueue")
# The vLLM modules that bind one of NAMES at import, loaded before the swap so
# that their names are rebound (modules loaded later import kvpool's from
# these). Any other module binding an original is found after collection.
MODULES = (
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.sched.scheduler",
)


def _kvpool_classes() -> tuple[str, dict[str, type]]:
    """The release's kvpool line (its description) and its classes."""
    import vllm

    from kvpool.vllm import UnsupportedVLLMVersionError, vllm_line
    from kvpool.vllm_events import vllm_block_pool_class

    try:
        line = vllm_line(vllm.__version__)
    except UnsupportedVLLMVersionError as exc:
        raise pytest.UsageError(
            f"kvpool_swap: no kvpool line for vLLM {vllm.__version__}: {exc}"
        ) from None
    module = importlib.import_module(line.module)
    ours = {"BlockPool": vllm_block_pool_class(line.name)}
    for name in NAMES[1:]:
        if not hasattr(module, name):
            raise pytest.UsageError(
                f"kvpool_swap: kvpool line {line.name} ({line.module}) has no {name} "
                f"for vLLM {vllm.__version__}'s tests"
            )
        ours[name] = getattr(module, name)
    return f"line {line.name} ({line.module})", ours


def _bindings(originals: dict[str, object], prefixes: tuple[str, ...]) -> list[tuple[str, str]]:
    """(module, name) of every loaded module under ``prefixes`` whose global
    ``name`` is ``originals[name]``."""
    found = []
    for mod_name, module in list(sys.modules.items()):
        if module is None or not mod_name.startswith(prefixes):
            continue
        for attr in NAMES:
            if getattr(module, attr, None) is originals[attr]:
                found.append((mod_name, attr))
    return found


def swap() -> tuple[str, dict[str, object], list[str]]:
    """Put kvpool's classes in place of vLLM's: the line, vLLM's originals and
    the rebound names."""
    for mod in MODULES:
        try:
            importlib.import_module(mod)
        except ImportError:
            continue
    utils = sys.modules["vllm.v1.core.kv_cache_utils"]
    bp = sys.modules["vllm.v1.core.block_pool"]
    originals = {
        "BlockPool": bp.BlockPool,
        "BlockHashToBlockMap": bp.BlockHashToBlockMap,
        "KVCacheBlock": utils.KVCacheBlock,
        "FreeKVCacheBlockQueue": utils.FreeKVCacheBlockQueue,
    }
    line, ours = _kvpool_classes()
    rebound = []
    for mod_name, attr in _bindings(originals, ("vllm",)):
        setattr(sys.modules[mod_name], attr, ours[attr])
        rebound.append(f"{mod_name}.{attr}")
    return line, originals, rebound


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("KVPOOL_SWAP", "1") == "0":
        config._kvpool_swap = "stock vLLM classes (KVPOOL_SWAP=0)"
        return
    import kvpool

    line, config._kvpool_originals, rebound = swap()
    core = "compiled" if kvpool.USING_EXTENSION else "pure-Python"
    config._kvpool_swap = (
        f"kvpool {kvpool.__version__} {line} ({core} core) in place of vLLM's: "
        + ", ".join(rebound)
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"kvpool_swap: {config._kvpool_swap}"


def _vllm_subclasses(originals: dict[str, object]) -> list[str]:
    """vLLM's own subclasses of its original classes that were loaded (e.g.
    0.30's ``hisparse.block_pool.SharedEventQueueBlockPool(BlockPool)``):
    a rebinding cannot reach them, so they stay vLLM's pool, over kvpool's
    blocks."""
    found, todo = [], [cls for cls in originals.values() if isinstance(cls, type)]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("vllm"):
                found.append(f"{sub.__module__}.{sub.__qualname__}")
    return sorted(set(found))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # noqa: ANN001
    # Also under -q, which drops the header: the log says which classes ran.
    terminalreporter.write_line(f"kvpool_swap: {config._kvpool_swap}")
    originals = getattr(config, "_kvpool_originals", None)
    subclasses = _vllm_subclasses(originals) if originals is not None else []
    if subclasses:
        terminalreporter.write_line(
            "kvpool_swap: vLLM's own subclasses of its classes, not swapped (vLLM's code "
            "over kvpool's blocks): " + ", ".join(subclasses)
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A module imported after the swap that kept one of vLLM's classes (bound
    # by a path the swap did not see) would mix the two pools: refuse.
    originals = getattr(config, "_kvpool_originals", None)
    if originals is not None:
        left = _bindings(originals, ("vllm", "tests"))
        if left:
            raise pytest.UsageError(
                "kvpool_swap: still vLLM's after the swap: "
                + ", ".join(f"{mod}.{attr}" for mod, attr in left)
            )
