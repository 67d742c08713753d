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
(``kvpool.vllm.events``), which the tests compare and check the class of.
After collection, a module of vLLM or of the tests that still binds one of
vLLM's originals is an error. The core is the compiled one unless
``KVPOOL_NO_EXTENSIONS=1``.

The manager too, for a line that has one (``kvpool.vllm.VLLMLine.manager``,
0.30-0.33), as ``kvpool.vllm.install()`` puts it in: with the compiled core,
unless ``KVPOOL_VLLM_MANAGER=0``. kvpool's ``KVCacheManager`` subclasses the
vLLM class that ``vllm.v1.core.kv_cache_manager`` binds when the facade is
imported, so that name stays vLLM's; every other ``vllm.*`` module binding
vLLM's class (the scheduler's, which ``Scheduler.__init__`` builds through)
is rebound before the tests are imported, and each test module that bound it
(``from vllm.v1.core.kv_cache_manager import KVCacheManager``) after
collection, before any test runs; then a ``vllm.*`` or ``tests.*`` module
still bound to vLLM's class is an error, as for the pool. Every manager
built in the session is counted by class, and kvpool's by what their
compiled paths did (``_kvpool_plan.counts``); the summary's ``kvpool_swap:
manager ...`` line says it (``.ci/vllm-own-tests.sh`` requires ``fast`` > 0
and no manager of vLLM's own class).
"""

from __future__ import annotations

import builtins
import collections
import functools
import gc
import importlib
import os
import sys
import weakref

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
MANAGER = "KVCacheManager"
# The module kvpool's manager takes vLLM's class from (its ``_kvpool_base``):
# never rebound.
MANAGER_HOME = "vllm.v1.core.kv_cache_manager"


def _kvpool_classes():  # noqa: ANN202
    """The release's kvpool line (a ``kvpool.vllm.VLLMLine``) and its classes."""
    import vllm

    from kvpool.vllm import UnsupportedVLLMVersionError, vllm_block_pool_class, vllm_line

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
    return line, ours


def _bindings(originals: dict[str, object], prefixes: tuple[str, ...],
              modules: list[str] | None = None) -> list[tuple[str, str]]:
    """(module, name) of every loaded module under ``prefixes`` (of
    ``modules`` if given) whose global ``name`` is ``originals[name]``
    (vLLM's manager's home module aside). Globals are read from the module's
    dict: a module's ``__getattr__`` (``vllm``'s imports lazily) is not run."""
    found = []
    for mod_name in list(sys.modules) if modules is None else modules:
        module = sys.modules.get(mod_name)
        if module is None or not mod_name.startswith(prefixes):
            continue
        namespace = getattr(module, "__dict__", {})
        for attr, original in originals.items():
            if attr == MANAGER and mod_name == MANAGER_HOME:
                continue
            if namespace.get(attr) is original:
                found.append((mod_name, attr))
    return found


class ManagerTally:
    """The ``KVCacheManager`` objects built in the session, by class, and what
    kvpool's compiled paths did in theirs (``_kvpool_plan.counts``, added up
    when each manager is collected, or at the end for those still alive)."""

    def __init__(self, vllm_cls: type, ours: type) -> None:
        self.vllm_cls, self.ours = vllm_cls, ours
        self.built: collections.Counter[str] = collections.Counter()
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self._pending: list[weakref.finalize] = []
        # vLLM's __init__ runs for every manager (kvpool's calls it through
        # super()); kvpool's own for kvpool's, after which its plan is set.
        vllm_init, our_init = vllm_cls.__init__, ours.__init__

        @functools.wraps(vllm_init)
        def counted_init(manager, *args, **kwargs) -> None:
            vllm_init(manager, *args, **kwargs)
            self.built[f"{type(manager).__module__}.{type(manager).__qualname__}"] += 1

        @functools.wraps(our_init)
        def planned_init(manager, *args, **kwargs) -> None:
            our_init(manager, *args, **kwargs)
            if manager._kvpool_plan is None:
                self.fallbacks[manager.kvpool_fallback_reason] += 1
            else:
                self.counts["in scope"] += 1
                self._pending.append(weakref.finalize(manager, self._add, manager._kvpool_plan))

        vllm_cls.__init__, ours.__init__ = counted_init, planned_init

    def _add(self, plan) -> None:  # noqa: ANN001
        self.counts.update(plan.counts)

    def report(self) -> str:
        gc.collect()
        for pending in self._pending:
            pending()  # a manager still alive: its counts so far
        self._pending.clear()
        ours = f"{self.ours.__module__}.{self.ours.__qualname__}"
        others = {name: n for name, n in self.built.items() if name != ours}
        counts = dict(self.counts)
        counts.setdefault("fast", 0)
        return (
            f"manager {ours}: built={self.built[ours]} (other classes: "
            + (", ".join(f"{name} {n}" for name, n in sorted(others.items())) or "none")
            + f"; vllm_own={self.built[f'{MANAGER_HOME}.{MANAGER}']}), "
            f"in_scope={counts.pop('in scope', 0)} "
            # fast first (.ci/vllm-own-tests.sh reads it), then the plan's others
            + " ".join(f"{name}={counts[name]}" for name in sorted(counts, key=lambda n: n != "fast"))
            + "; out of scope: "
            + (", ".join(f"{why} {n}" for why, n in self.fallbacks.most_common()) or "none")
        )


def _kvpool_manager(line) -> tuple[type | None, str]:  # noqa: ANN001
    """kvpool's manager class for the line, as ``kvpool.vllm.install()`` would
    put it in, or None and why not."""
    import kvpool
    from kvpool.vllm.manager import ENV_VAR, manager_enabled

    if line.manager is None:
        return None, f"vLLM's (kvpool has no manager for the {line.name} line)"
    if not manager_enabled():
        return None, f"vLLM's ({ENV_VAR}={os.environ.get(ENV_VAR)})"
    if not kvpool.USING_EXTENSION:
        return None, "vLLM's (kvpool's manager paths are compiled only)"
    ours = importlib.import_module(line.manager).KVCacheManager
    vllm_cls = getattr(sys.modules[MANAGER_HOME], MANAGER)
    if ours._kvpool_base is not vllm_cls or not issubclass(ours, vllm_cls):
        raise pytest.UsageError(
            f"kvpool_swap: {line.manager}.KVCacheManager does not extend {MANAGER_HOME}."
            f"{MANAGER} (its _kvpool_base is {ours._kvpool_base!r})"
        )
    return ours, f"{line.manager}.KVCacheManager"


def swap() -> tuple[str, dict[str, object], dict[str, object], list[str]]:
    """Put kvpool's classes in place of vLLM's: the line (and manager),
    vLLM's originals, kvpool's classes, and the rebound names."""
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
    manager, manager_said = _kvpool_manager(line)
    if manager is not None:
        originals[MANAGER] = getattr(sys.modules[MANAGER_HOME], MANAGER)
        ours[MANAGER] = manager
    rebound = _rebind(originals, ours, ("vllm",))
    said = f"line {line.name} ({line.module}), manager {manager_said}"
    return said, originals, ours, rebound


def _rebind(originals: dict[str, object], ours: dict[str, object],
            prefixes: tuple[str, ...], modules: list[str] | None = None) -> list[str]:
    """Rebind every binding of an original under ``prefixes`` (in
    ``modules`` if given) to ours."""
    rebound = []
    for mod_name, attr in _bindings(originals, prefixes, modules):
        setattr(sys.modules[mod_name], attr, ours[attr])
        rebound.append(f"{mod_name}.{attr}")
    return rebound


def _rebind_on_import(originals: dict[str, object], ours: dict[str, object],
                      rebound: list[str]) -> None:
    """From now on, a ``vllm.*`` or ``tests.*`` module first imported by an
    ``import`` statement (a test's ``from tests.v1.core.test_prefix_caching
    import make_hisparse_kv_cache_manager``) gets ``ours`` for ``originals``
    before the statement returns; each rebinding is added to ``rebound``."""
    real_import = builtins.__import__
    known = set(sys.modules)
    depth = 0  # nested imports: a module is looked at once its own import is done

    def importing(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        nonlocal depth
        depth += 1
        try:
            module = real_import(*args, **kwargs)
        finally:
            depth -= 1
        if depth == 0:
            new = sys.modules.keys() - known  # (not its size: tests delete modules too)
            if new:
                known.update(new)
                rebound.extend(_rebind(originals, ours, ("vllm", "tests"), sorted(new)))
        return module

    builtins.__import__ = importing


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("KVPOOL_SWAP", "1") == "0":
        config._kvpool_swap = "stock vLLM classes (KVPOOL_SWAP=0)"
        return
    import kvpool

    line, originals, ours, rebound = swap()
    config._kvpool_originals, config._kvpool_ours = originals, ours
    if MANAGER in ours:
        config._kvpool_tally = ManagerTally(originals[MANAGER], ours[MANAGER])
    core = "compiled" if kvpool.USING_EXTENSION else "pure-Python"
    config._kvpool_swap = (
        f"kvpool {kvpool.__version__} ({core} core) {line}, in place of vLLM's: "
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
    late = getattr(config, "_kvpool_late", None)
    if late:
        terminalreporter.write_line("kvpool_swap: manager rebound in modules imported by "
                                    "the tests: " + ", ".join(late))
    tally = getattr(config, "_kvpool_tally", None)
    if tally is not None:
        terminalreporter.write_line(f"kvpool_swap: {tally.report()}")
    originals = getattr(config, "_kvpool_originals", None)
    subclasses = _vllm_subclasses(originals) if originals is not None else []
    if subclasses:
        terminalreporter.write_line(
            "kvpool_swap: vLLM's own subclasses of its classes, not swapped (vLLM's code "
            "over kvpool's blocks or pool): " + ", ".join(subclasses)
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The test modules that bound vLLM's manager get kvpool's (the pool's
    # names they took from modules already rebound). A module imported after
    # the swap that kept one of vLLM's pool classes (bound by a path the swap
    # did not see) would mix the two pools, and one still bound to vLLM's
    # manager would test vLLM's: refuse.
    originals = getattr(config, "_kvpool_originals", None)
    if originals is not None:
        if MANAGER in originals:
            manager = {MANAGER: originals[MANAGER]}
            late = _rebind(manager, config._kvpool_ours, ("vllm", "tests"))
            if late:
                config._kvpool_swap += "; after collection: " + ", ".join(late)
            config._kvpool_late = []
            _rebind_on_import(manager, config._kvpool_ours, config._kvpool_late)
        left = _bindings(originals, ("vllm", "tests"))
        if left:
            raise pytest.UsageError(
                "kvpool_swap: still vLLM's after the swap: "
                + ", ".join(f"{mod}.{attr}" for mod, attr in left)
            )
