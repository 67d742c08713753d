"""What every proof suite is made of: cases, a patch that undoes itself, and
the failure a case raises.

A suite (``kvpool.vllm.proof.pool``, ``.manager``, ``.hasher``) is a module
with ``NAME`` (what ``--prove`` prints), ``applies(line) -> str | None`` (why
it does not apply to this line, or ``None``) and ``cases(line) ->
list[Case]``. Each case runs against the installed vLLM with the line given,
and raises ``ProofFailure`` at the first difference. The repository's tests
parametrize over the same cases, so what ``--prove`` runs is what CI runs.
No pytest here: a user's vLLM environment need not have it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["Case", "Patch", "ProofFailure", "patched"]

_UNSET = object()


class ProofFailure(AssertionError):
    """The first difference between kvpool's line and the installed vLLM's
    own code: the message names the operation, the field, kvpool's value and
    vLLM's (and, for a seeded trace, the seed and step)."""


class HarnessFailure(ProofFailure):
    """The suite itself does not work on this vLLM (its own code against
    itself differs, or a planted fault went unseen): nothing is proven."""


class Patch:
    """The part of pytest's ``monkeypatch`` the suites use; ``undo()``
    restores everything in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def setattr(self, target: Any, name: str, value: Any, raising: bool = True) -> None:
        old = getattr(target, name, _UNSET)
        if old is _UNSET and raising:
            raise AttributeError(f"{target!r} has no attribute {name!r}")
        setattr(target, name, value)
        self._undo.append(lambda: delattr(target, name) if old is _UNSET else setattr(target, name, old))

    def setitem(self, mapping: Any, key: Any, value: Any) -> None:
        old = mapping.get(key, _UNSET)
        mapping[key] = value
        self._undo.append(lambda: mapping.pop(key, None) if old is _UNSET else mapping.__setitem__(key, old))

    def setenv(self, name: str, value: str) -> None:
        self.setitem(os.environ, name, str(value))

    def delenv(self, name: str, raising: bool = True) -> None:
        if name not in os.environ:
            if raising:
                raise KeyError(name)
            return
        old = os.environ.pop(name)
        self._undo.append(lambda: os.environ.__setitem__(name, old))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


@contextmanager
def patched() -> Iterator[Patch]:
    patch = Patch()
    try:
        yield patch
    finally:
        patch.undo()


@dataclass(frozen=True)
class Case:
    """One check of a suite: ``run(patch)`` returns when it holds and raises
    ``ProofFailure`` when it does not."""

    name: str
    run: Callable[[Patch], None]

    def __call__(self, patch: Patch | None = None) -> None:
        if patch is not None:
            self.run(patch)
            return
        with patched() as own:
            self.run(own)
