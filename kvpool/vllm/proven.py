"""The builds a user proved (`python -m kvpool.vllm --prove`), recorded so
that ``install()`` accepts exactly them.

The record is one JSON file: ``$KVPOOL_PROVEN`` when set, else
``$XDG_CONFIG_HOME/kvpool/proven.json`` (``~/.config/kvpool/proven.json``
without ``XDG_CONFIG_HOME``). Each entry holds a build's mirrored files'
digests (``kvpool.vllm.digests``), the vLLM version it reported, the line it
was proven against, the kvpool version that proved it, the date, what each
suite ran, and a checksum of all of that. An entry counts only for the same
digests, the same kvpool version and a line kvpool still has; one byte
changed in a mirrored file is another build, and a new kvpool proves it
again. The checksum catches an edited or truncated entry (it is no
signature: the record is the user's own statement about their build).

Standard library only; nothing of vLLM is imported.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENV_VAR", "ProvenBuild", "RecordError", "find", "record", "record_path"]

#: The record's path, overriding the default.
ENV_VAR = "KVPOOL_PROVEN"
FORMAT = 1


class RecordError(Exception):
    """The record cannot be used: unreadable, not JSON of this format, or an
    entry whose checksum does not match. The message says which and how to
    mend it."""


def record_path() -> Path:
    """Where the record is (it need not exist)."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "kvpool" / "proven.json"


@dataclass(frozen=True)
class ProvenBuild:
    """One recorded build, as ``install()`` uses it."""

    vllm: str
    line: str
    nearest: str | None
    kvpool: str
    date: str
    path: Path

    def describe(self) -> str:
        return (f"a build proven by the user on {self.date} against the {self.line} line "
                f"(vLLM {self.vllm}, kvpool {self.kvpool}; {self.path})")


def _checksum(entry: dict[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _mend(path: Path) -> str:
    return (f"delete or move {path} and run python -m kvpool.vllm --prove again "
            f"(or point {ENV_VAR} at another record)")


def _load(path: Path) -> list[dict[str, Any]]:
    """The record's entries ([] when there is no record)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"the record of proven vLLM builds, {path}, cannot be read "
                          f"({type(exc).__name__}: {exc}); {_mend(path)}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"the record of proven vLLM builds, {path}, is not JSON ({exc}); "
                          f"{_mend(path)}") from None
    builds = data.get("builds") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(builds, list):
        raise RecordError(f"the record of proven vLLM builds, {path}, is not a record of "
                          f"format {FORMAT} (an object with \"format\": {FORMAT} and a "
                          f"\"builds\" list); {_mend(path)}")
    for i, entry in enumerate(builds):
        if not isinstance(entry, dict) or entry.get("checksum") != _checksum(entry):
            raise RecordError(f"the record of proven vLLM builds, {path}: entry {i} was "
                              f"changed after --prove wrote it (its checksum does not "
                              f"match); {_mend(path)}")
        if not isinstance(entry.get("digests"), dict):
            raise RecordError(f"the record of proven vLLM builds, {path}: entry {i} has no "
                              f"digests; {_mend(path)}")
    return builds


def find(digests: dict[str, str]) -> tuple[ProvenBuild | None, str]:
    """The recorded build whose digests are ``digests`` and which this
    kvpool can use, and otherwise ``None`` with why not (an empty string
    when the record names no such build). Raises ``RecordError``."""
    import kvpool

    from .releases import VLLM_LINES

    path = record_path()
    why = ""
    for entry in _load(path):
        if entry["digests"] != digests:
            continue
        if entry.get("kvpool") != kvpool.__version__:
            why = (f"this build was proven with kvpool {entry.get('kvpool')}, and this is "
                   f"kvpool {kvpool.__version__}: run python -m kvpool.vllm --prove again")
            continue
        if entry.get("line") not in {line.name for line in VLLM_LINES}:
            why = (f"this build was proven against the {entry.get('line')} line, which this "
                   f"kvpool does not have: run python -m kvpool.vllm --prove again")
            continue
        return ProvenBuild(str(entry.get("vllm")), entry["line"], entry.get("nearest"),
                           entry["kvpool"], str(entry.get("date")), path), ""
    return None, why


def record(digests: dict[str, str], *, vllm: str, line: str, nearest: str | None,
           suites: dict[str, str]) -> Path:
    """Add (or replace) the entry of the build with ``digests``, atomically;
    returns the record's path. An unusable record is not overwritten
    (``RecordError``)."""
    import kvpool

    path = record_path()
    builds = [b for b in _load(path) if b["digests"] != digests]
    entry: dict[str, Any] = {
        "vllm": vllm,
        "line": line,
        "nearest": nearest,
        "kvpool": kvpool.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "suites": suites,
        "digests": dict(sorted(digests.items())),
    }
    entry["checksum"] = _checksum(entry)
    builds.append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".proven-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "builds": builds}, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
