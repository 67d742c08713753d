"""A global name rebound in some of vLLM's modules, and put back.

kvpool gets into vLLM by rebinding the names vLLM builds its objects
through (``kvpool.vllm.installer``, ``.hasher``, ``.manager``);
this is that one mechanism. Not thread-safe by itself: callers hold their
lock."""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any

__all__ = ["Rebinding"]


class Rebinding:
    """The global ``name`` of each module in ``modules`` (imported on
    ``install``), rebound to one value and restored on ``uninstall``."""

    def __init__(self, name: str, modules: tuple[str, ...], what: str = "") -> None:
        self.name = name
        self.modules = modules
        #: What is rebound, for the log line of ``uninstall`` ("KVCacheManager").
        self.what = what or name
        self._originals: dict[ModuleType, Any] = {}

    @property
    def installed(self) -> bool:
        return bool(self._originals)

    def install(self, value: Any) -> None:
        """Rebind the name in every module (all imported first, so a module
        that fails to import changes nothing)."""
        modules = [importlib.import_module(module) for module in self.modules]
        for module in modules:
            self._originals[module] = getattr(module, self.name)
        for module in modules:
            setattr(module, self.name, value)

    def uninstall(self) -> bool:
        """Put the original values back (and log it); ``False`` if nothing
        was rebound."""
        if not self._originals:
            return False
        for module, original in self._originals.items():
            setattr(module, self.name, original)
        self._originals.clear()
        logging.getLogger("kvpool.vllm").info("kvpool %s uninstalled from vLLM", self.what)
        return True
