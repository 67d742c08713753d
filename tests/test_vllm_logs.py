"""``kvpool.vllm.logs``: kvpool's lines go to vLLM's log handlers where vLLM
sets up its logging, and stay quiet below WARNING where it does not.

No vLLM here: a process "has vLLM's logging" when ``vllm.logger`` is
imported; the tests stand a module in for it and give the ``vllm`` logger
a handler as vLLM's ``dictConfig`` would. The real engine's check (vLLM's
own format, every process, once each) is ``tests/engine/test_engine_logging.py``.
"""

from __future__ import annotations

import io
import logging
import sys
import types

import pytest

from kvpool.vllm import logs


@pytest.fixture
def loggers(monkeypatch):
    """The ``kvpool`` and ``vllm`` loggers as new (no handler, no level,
    propagating), restored afterwards, with no ``vllm.logger`` module."""
    saved = {}
    for name in ("kvpool", "vllm"):
        logger = logging.getLogger(name)
        saved[name] = (logger.handlers[:], logger.level, logger.propagate, vars(logger).get("addHandler"))
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
        vars(logger).pop("addHandler", None)
    monkeypatch.delitem(sys.modules, "vllm.logger", raising=False)
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    yield {name: logging.getLogger(name) for name in saved}
    for name, (handlers, level, propagate, add) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
        vars(logger).pop("addHandler", None)
        if add is not None:
            logger.addHandler = add


def vllm_present(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm.logger", types.ModuleType("vllm.logger"))


def vllm_handler(vllm_logger: logging.Logger, level=logging.INFO) -> io.StringIO:
    """What vLLM's default config gives its logger: a level and one handler
    whose format names the process (vLLM's record factory adds the name)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("(%(vllm_process_name)s) %(levelname)s %(message)s"))
    vllm_logger.setLevel(level)
    vllm_logger.addHandler(handler)
    return out


def test_plain_python_stays_quiet_below_warning(loggers) -> None:
    """Python's defaults: the root logger's WARNING, no handler of kvpool's
    (its warnings then reach the last-resort handler, or the application's)."""
    assert logs.join_vllm_logging() is False
    log = logging.getLogger("kvpool.vllm")
    assert not log.isEnabledFor(logging.INFO) and log.isEnabledFor(logging.WARNING)
    assert loggers["kvpool"].handlers == [] and loggers["kvpool"].propagate


def test_lines_go_to_vllms_handlers_at_its_level(loggers, monkeypatch) -> None:
    vllm_present(monkeypatch)
    out = vllm_handler(loggers["vllm"])
    root_seen = []
    root = logging.getLogger()
    catch = logging.Handler()
    catch.emit = root_seen.append
    root.addHandler(catch)
    try:
        assert logs.join_vllm_logging() is True
        assert logs.join_vllm_logging() is True     # once per process
        assert sum(isinstance(h, logs._ToVLLMHandlers) for h in loggers["kvpool"].handlers) == 1
        log = logging.getLogger("kvpool.vllm")
        log.debug("below vLLM's level")
        log.info("kvpool BlockPool installed")
        logging.getLogger("kvpool.block_pool").warning("a pool warning")
    finally:
        root.removeHandler(catch)
    assert out.getvalue().splitlines() == [
        "(MainProcess) INFO kvpool BlockPool installed", "(MainProcess) WARNING a pool warning"]
    assert root_seen == [], "kvpool's lines reached the root logger too (vLLM's do not)"


def test_lines_follow_vllms_reconfiguration(loggers, monkeypatch) -> None:
    vllm_present(monkeypatch)
    first = vllm_handler(loggers["vllm"])
    assert logs.join_vllm_logging()
    for h in loggers["vllm"].handlers[:]:      # dictConfig replaces the handlers
        loggers["vllm"].removeHandler(h)
    second = vllm_handler(loggers["vllm"], logging.WARNING)
    logging.getLogger("kvpool.vllm").info("dropped at WARNING")
    logging.getLogger("kvpool.vllm").warning("said")
    assert first.getvalue() == "" and second.getvalue() == "(MainProcess) WARNING said\n"


def test_lines_before_vllm_configures_are_held_then_handed_on(loggers, monkeypatch) -> None:
    vllm_present(monkeypatch)
    assert logs.join_vllm_logging()
    logging.getLogger("kvpool.vllm").warning("kvpool left out: early")
    logging.getLogger("kvpool.vllm").info("early info")
    [handler] = loggers["kvpool"].handlers
    assert [r.getMessage() for r in handler.held] == ["kvpool left out: early", "early info"]
    created = handler.held[0].created
    out = vllm_handler(loggers["vllm"])         # vLLM's dictConfig: level, then handler
    assert out.getvalue().splitlines() == [
        "(MainProcess) WARNING kvpool left out: early", "(MainProcess) INFO early info"]
    assert handler.held == []
    logging.getLogger("kvpool.vllm").info("later")
    assert out.getvalue().splitlines()[-1] == "(MainProcess) INFO later"
    assert created <= logging.makeLogRecord({}).created


def test_held_lines_are_bounded_and_warnings_kept_at_exit(loggers, monkeypatch, capsys) -> None:
    vllm_present(monkeypatch)
    assert logs.join_vllm_logging()
    for i in range(logs.HELD + 10):
        logging.getLogger("kvpool.vllm").info("info %d", i)
    [handler] = loggers["kvpool"].handlers
    assert len(handler.held) == logs.HELD
    handler.held.clear()
    logging.getLogger("kvpool.vllm").info("an info vLLM never showed")
    logging.getLogger("kvpool.vllm").warning("a warning vLLM never showed")
    handler.at_exit()                           # vLLM never configured its logging
    err = capsys.readouterr().err
    assert "a warning vLLM never showed" in err and "an info" not in err


def test_an_application_configured_kvpool_logger_is_left_alone(loggers, monkeypatch) -> None:
    vllm_present(monkeypatch)
    vllm_handler(loggers["vllm"])
    own = logging.NullHandler()
    loggers["kvpool"].addHandler(own)
    assert logs.join_vllm_logging() is False
    assert loggers["kvpool"].handlers == [own] and loggers["kvpool"].propagate
    loggers["kvpool"].removeHandler(own)
    loggers["kvpool"].setLevel(logging.ERROR)
    assert logs.join_vllm_logging() is False


def test_vllm_configure_logging_off_joins_nothing(loggers, monkeypatch) -> None:
    vllm_present(monkeypatch)
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")
    assert logs.join_vllm_logging() is False
    assert loggers["kvpool"].handlers == []
