"""``install()``, ``uninstall()``, ``enabled()`` and the vLLM plugin: put
kvpool's pool, manager and hasher into vLLM, and take them out again.

Every supported release builds its ``BlockPool`` in exactly one place,
``vllm.v1.core.kv_cache_coordinator``, and reaches it only through the name
``BlockPool`` bound in that module. ``install()`` rebinds that name (and the
same name in ``vllm.v1.core.single_type_kv_cache_manager``, where it only
annotates arguments, so that the two modules never disagree) to the pool of
the installed release's line (``kvpool.vllm.releases``), then puts in the
line's manager (``kvpool.vllm.manager``) and the request block hasher
(``kvpool.vllm.hasher``); ``uninstall()`` puts vLLM's own back.
``vllm.v1.core.block_pool.BlockPool`` itself is left alone: vLLM's own pool
stays importable, e.g. to compare the two.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from . import releases
from .digests import code_line
from .hasher import install_hasher, uninstall_hasher
from .logs import join_vllm_logging
from .manager import install_manager, uninstall_manager
from .releases import ENV_VAR, UnsupportedVLLMVersionError, vllm_version

__all__ = ["enabled", "install", "is_installed", "plugin", "uninstall"]

#: The values of ``KVPOOL_VLLM`` (lower-cased) that mean ``install()``.
ON = ("1", "true", "yes", "on")

logger = logging.getLogger("kvpool.vllm")


# Modules whose global name ``BlockPool`` is rebound. The coordinator is the
# one that matters (it constructs the pool); the manager module only uses the
# name in annotations.
_PATCHED_MODULES = (
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.single_type_kv_cache_manager",
)

_lock = threading.RLock()
# module -> the object its ``BlockPool`` name held before install(); empty
# while not installed.
_originals: dict[ModuleType, Any] = {}
# ENV_VAR's value before install() exported it (None: it was unset).
_saved_env: list[str | None] = []
# The class install() put in; empty while not installed.
_installed: list[type] = []


def _target_modules() -> list[ModuleType]:
    import importlib

    return [importlib.import_module(name) for name in _PATCHED_MODULES]


def install(*, force: bool = False) -> bool:
    """Make vLLM build kvpool's ``BlockPool`` in every ``KVCacheManager``
    created from now on, in this process.

    The pool is the one of the installed vLLM's line (``VLLM_LINES``); any
    other release raises ``UnsupportedVLLMVersionError``. ``force=True``
    installs anyway, at your own risk, the pool of the nearest older line
    (``vllm_line``). Exports
    ``KVPOOL_VLLM`` (``1``, or ``force``) so that vLLM processes started from
    now on install it as well. Idempotent and thread-safe: returns ``True`` if
    this call installed the pool, ``False`` if it was already installed.
    """
    return _install(force=force, export="force" if force else "1")


def _install(*, force: bool, export: str) -> bool:
    """``install()``, exporting ``KVPOOL_VLLM=export`` to the processes
    started while it is in effect (the plugin passes ``auto`` on)."""
    with _lock:
        if _originals:
            return False
        version = vllm_version()
        line, why = code_line(version, force=force)
        block_pool = line.block_pool()
        from kvpool import USING_EXTENSION

        modules = _target_modules()
        # (vLLM's logging is set up once its modules are imported.)
        join_vllm_logging()
        for module in modules:
            _originals[module] = module.BlockPool
        for module in modules:
            module.BlockPool = block_pool
        _installed.append(block_pool)
        # The engine core's request block hasher too, unless
        # KVPOOL_VLLM_HASHER=0 (kvpool.vllm.hasher says why it declines).
        try:
            hasher = install_hasher(line)
        except ImportError as exc:  # an engine core that cannot import here
            logger.warning("kvpool's request block hasher not installed: %s", exc)
            hasher = False
        # And the line's KV-cache manager, unless KVPOOL_VLLM_MANAGER=0.
        manager = install_manager(line)
        _saved_env.append(os.environ.get(ENV_VAR))
        os.environ[ENV_VAR] = export
        logger.info(
            "kvpool BlockPool of the %s line (%s.BlockPool) installed into vLLM %s "
            "(%s; %s core); request block hasher: %s; KV-cache manager: %s",
            line.name,
            line.module,
            version,
            why,
            "compiled" if USING_EXTENSION else "pure-Python",
            "kvpool's" if hasher else "vLLM's",
            "kvpool's" if manager else "vLLM's",
        )
        return True


def uninstall() -> bool:
    """Give vLLM its own ``BlockPool`` back (for managers created from now
    on). Returns ``True`` if kvpool was installed, ``False`` if not."""
    with _lock:
        if not _originals:
            return False
        block_pool = _installed.pop()
        for module, original in _originals.items():
            current = module.BlockPool
            if current is not block_pool:
                # Someone patched over us; put back what we found anyway, so
                # uninstall() always leaves vLLM's own class in place.
                logger.warning(
                    "%s.BlockPool was replaced by %r after kvpool was installed; "
                    "restoring vLLM's own BlockPool",
                    module.__name__,
                    current,
                )
            module.BlockPool = original
        _originals.clear()
        uninstall_hasher()
        uninstall_manager()
        previous = _saved_env.pop()
        if previous is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = previous
        logger.info("kvpool BlockPool uninstalled from vLLM")
        return True


def is_installed() -> bool:
    """Whether ``install()`` is in effect in this process."""
    return bool(_originals)


@contextlib.contextmanager
def enabled(*, force: bool = False) -> Iterator[None]:
    """Context manager: kvpool's pool is installed inside the block. Nests: it
    uninstalls on exit only if it was the one that installed."""
    installed_here = install(force=force)
    try:
        yield
    finally:
        if installed_here:
            uninstall()


def plugin() -> None:
    """The ``vllm.general_plugins`` entry point. vLLM calls it in each of its
    processes (front end, engine core, workers) before it builds the
    scheduler; it installs kvpool's pool when ``KVPOOL_VLLM=1`` (``force``:
    ``install(force=True)``; ``auto``: see below) and does nothing otherwise.
    An unsupported vLLM with ``KVPOOL_VLLM=1`` is an error, not a silent
    fallback to vLLM's pool: who asks for kvpool by name gets it or a
    traceback.

    ``KVPOOL_VLLM=auto`` is for a fleet whose vLLM is upgraded under it: on a
    release ``VLLM_LINES`` lists, the same as ``1``; on any other, one
    WARNING on the ``kvpool.vllm`` logger (the release found, the releases
    kvpool lists) and vLLM runs unchanged, its own pool, manager and hasher.
    The verdict passes to the processes vLLM starts from this one: where
    kvpool went in, ``install()`` exports ``auto`` itself (a child with the
    same vLLM reaches the same verdict, and one that somehow did not would
    still start); where it was left out, ``0``, so that an engine whose front
    end and engine core both load plugins says it once, not once a
    process.

    kvpool's lines (this WARNING, the install line, what the manager serves)
    go to vLLM's log, as vLLM's own do (``kvpool.vllm.logs``)."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in (*ON, "force", "auto"):
        join_vllm_logging()
    if value == "force":
        install(force=True)
    elif value in ON:
        install()
    elif value == "auto":
        _install_if_listed()


def _install_if_listed() -> None:
    """``KVPOOL_VLLM=auto``: ``plugin()`` says what and why."""
    version = vllm_version()
    try:
        code_line(version)
    except UnsupportedVLLMVersionError as exc:
        os.environ[ENV_VAR] = "0"
        logger.warning(
            "kvpool left out: vLLM %s here is %s, so vLLM runs unchanged, with its own "
            "BlockPool and KVCacheManager (%s=auto; python -m kvpool.vllm --prove checks "
            "this build).",
            version,
            getattr(exc, "code", exc),
            ENV_VAR,
        )
        return
    _install(force=False, export="auto")
