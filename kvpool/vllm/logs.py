"""kvpool's log lines in vLLM's log.

vLLM's logging setup (``vllm/logger.py``) configures the ``vllm`` logger
and its children: a handler writing ``(EngineCore pid=N) INFO 12-06
10:00:00 [file.py:12] message`` at ``VLLM_LOGGING_LEVEL``, with
``propagate`` off. kvpool's loggers (``kvpool.vllm``, ``kvpool.*``) are
outside that tree, so on their own their INFO lines are dropped and their
warnings come out bare through Python's last-resort handler.

``join_vllm_logging()``, called where kvpool goes into vLLM (``plugin()``
and ``install()``, in every vLLM process), gives the ``kvpool`` logger one
handler that passes each record to the ``vllm`` logger's handlers, at that
logger's level, as they are when the record is emitted: vLLM reconfigures
its logging during start-up (``configure_logging`` from the engine's or
the server's arguments replaces its handlers), and kvpool's lines follow.
Like vLLM's own, they no longer propagate to the root logger.

Where vLLM has not configured its logging yet when kvpool logs (the front
end loads plugins in ``EngineArgs.__post_init__``, before ``LLM`` applies
its logging config: the ``auto`` warning is said there), the records are
held, at most ``HELD`` of them, and handed on when vLLM's ``vllm`` logger
gets its handler, with their own time and process; those still held at exit
(an engine never built) go out through Python's last-resort handler if they
are warnings, as they would have without this module.

Nothing is joined where kvpool is used without vLLM's logging: plain Python
(kvpool's lines stay quiet below WARNING), ``VLLM_CONFIGURE_LOGGING=0``
(vLLM's own lines are not handled either), or an application that
configured the ``kvpool`` logger itself (a handler or a level of its own:
its choice stands; a ``VLLM_LOGGING_CONFIG_PATH`` file that names
``kvpool`` replaces this handler when vLLM applies it).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

__all__ = ["HELD", "join_vllm_logging"]

#: Records kept while vLLM's logging is not configured yet (kvpool says a
#: handful of lines a process; the rest is dropped, not grown without bound).
HELD = 64

_lock = threading.RLock()


class _ToVLLMHandlers(logging.Handler):
    """Hands a kvpool record to the ``vllm`` logger's handlers, filtered by
    that logger's level, as vLLM's own records are; holds it while that
    logger has no handler yet."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []
        self._watching = False

    def emit(self, record: logging.LogRecord) -> None:
        vllm_logger = logging.getLogger("vllm")
        with _lock:
            if not vllm_logger.handlers:
                if len(self.held) < HELD:
                    self.held.append(record)
                self._watch(vllm_logger)
                return
            self._hand_on(vllm_logger)
        _deliver(vllm_logger, record)

    def _watch(self, vllm_logger: logging.Logger) -> None:
        """Hand the held records on once the ``vllm`` logger gets a handler
        (``dictConfig`` sets its level first, then adds its handlers): an
        ``addHandler`` on that logger object, not on vLLM's code."""
        if self._watching:
            return
        self._watching = True
        add = vllm_logger.addHandler

        def addHandler(handler: logging.Handler) -> None:  # noqa: N802 (logging's name)
            add(handler)
            with _lock:
                self._hand_on(vllm_logger)

        vllm_logger.addHandler = addHandler  # type: ignore[method-assign]

    def _hand_on(self, vllm_logger: logging.Logger) -> None:
        held, self.held = self.held, []
        for record in held:
            _deliver(vllm_logger, record)

    def at_exit(self) -> None:
        """The warnings still held (vLLM never configured its logging):
        through Python's last-resort handler, as without this handler."""
        with _lock:
            held, self.held = self.held, []
        last_resort = logging.lastResort
        for record in held:
            if last_resort is not None and record.levelno >= last_resort.level:
                last_resort.handle(record)


def _deliver(vllm_logger: logging.Logger, record: logging.LogRecord) -> None:
    if not vllm_logger.isEnabledFor(record.levelno):
        return
    # vLLM's format names the process (%(vllm_process_name)s), which its
    # record factory adds: a record made before vLLM installed the factory
    # gets what the factory gives a process that has not named itself.
    if not hasattr(record, "vllm_process_name"):
        record.vllm_process_name = record.processName
    for handler in vllm_logger.handlers:
        if record.levelno >= handler.level:
            handler.handle(record)


def _vllm_configures_logging() -> bool:
    """Whether vLLM sets up its logging in this process: its logger module
    imported, and ``VLLM_CONFIGURE_LOGGING`` not ``0``."""
    if "vllm.logger" not in sys.modules:
        return False
    return os.environ.get("VLLM_CONFIGURE_LOGGING", "1").strip() != "0"


def join_vllm_logging() -> bool:
    """Send kvpool's log lines to vLLM's handlers, once per process. Returns
    whether they go there (now or already); ``False`` where vLLM does not
    set up its logging or the ``kvpool`` logger was configured by the
    application."""
    kvpool_logger = logging.getLogger("kvpool")
    with _lock:
        if any(isinstance(h, _ToVLLMHandlers) for h in kvpool_logger.handlers):
            return True
        if kvpool_logger.handlers or kvpool_logger.level != logging.NOTSET:
            return False
        if not _vllm_configures_logging():
            return False
        handler = _ToVLLMHandlers()
        # Every record reaches the handler; the vllm logger's level decides.
        kvpool_logger.setLevel(logging.DEBUG)
        kvpool_logger.addHandler(handler)
        kvpool_logger.propagate = False
        atexit.register(handler.at_exit)
        return True
