"""Put kvpool's ``KVCacheManager`` into vLLM's scheduler.

vLLM's scheduler builds its KV-cache manager in one place,
``Scheduler.__init__``, through the name ``KVCacheManager`` imported into
``vllm.v1.core.sched.scheduler`` (every release kvpool has a manager for).
``install_manager()`` rebinds that name to the manager of the installed
release's line (``kvpool.vllm.VLLMLine.manager``), a subclass of vLLM's
class with compiled hot paths (``kvpool.v0_33.kv_cache_manager`` says which
and for which configurations); ``uninstall_manager()`` puts vLLM's class
back. ``vllm.v1.core.kv_cache_manager.KVCacheManager`` itself is left alone.

``kvpool.vllm.install()`` calls it, after the pool; ``KVPOOL_VLLM_MANAGER=0``
(or false/no/off) keeps vLLM's manager over kvpool's pool. Lines without a
kvpool manager, and the pure-Python core, keep vLLM's manager too.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from typing import Any

from ._rebind import Rebinding

__all__ = [
    "ENV_VAR",
    "install_manager",
    "manager_declined",
    "manager_enabled",
    "manager_installed",
    "uninstall_manager",
]

logger = logging.getLogger("kvpool.vllm")

#: ``0`` / false / no / off: keep vLLM's own KV-cache manager.
ENV_VAR = "KVPOOL_VLLM_MANAGER"

_lock = threading.RLock()
_rebinding = Rebinding("KVCacheManager", ("vllm.v1.core.sched.scheduler",), "KVCacheManager")


def manager_enabled() -> bool:
    """False when ``KVPOOL_VLLM_MANAGER`` says to keep vLLM's manager."""
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("0", "false", "no", "off")


def manager_declined(line: Any) -> str | None:
    """Why ``install_manager(line)`` would leave vLLM's manager in, or
    ``None`` if it would put kvpool's in (``python -m kvpool.vllm`` prints
    it)."""
    from kvpool import USING_EXTENSION

    if not manager_enabled():
        return f"{ENV_VAR}={os.environ.get(ENV_VAR)}: vLLM keeps its own KV-cache manager"
    if line.manager is None:
        return f"kvpool has no KV-cache manager for the {line.name} line: vLLM keeps its own"
    if not USING_EXTENSION:
        return ("kvpool's manager paths are compiled only: vLLM keeps its own "
                "KV-cache manager over the pure-Python core")
    return None


def install_manager(line: Any) -> bool:
    """Make vLLM schedulers built from now on (in this process) build
    kvpool's ``KVCacheManager`` of ``line`` (a ``kvpool.vllm.VLLMLine``).
    Returns ``True`` if this call installed it; ``False`` if it was
    installed already, if ``KVPOOL_VLLM_MANAGER=0``, if the line has no
    kvpool manager, or if the compiled core is not in use
    (``manager_declined`` says which)."""
    with _lock:
        if _rebinding.installed:
            return False
        reason = manager_declined(line)
        if reason is not None:
            logger.info("%s", reason)
            return False
        _rebinding.install(importlib.import_module(line.manager).KVCacheManager)
        logger.info("kvpool KVCacheManager of the %s line (%s) installed into vLLM",
                    line.name, line.manager)
        return True


def uninstall_manager() -> bool:
    """Give vLLM's scheduler its own manager back (for schedulers built from
    now on). Returns ``True`` if kvpool's was installed."""
    with _lock:
        return _rebinding.uninstall()


def manager_installed() -> bool:
    """Whether ``install_manager()`` is in effect in this process."""
    return _rebinding.installed
