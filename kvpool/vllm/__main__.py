"""``python -m kvpool.vllm``: what kvpool would do in the vLLM installed here.

Prints the vLLM release found, its kvpool line, what ``install()`` (and so
the plugin) would put in -- the pool, the KV-cache manager, the request block
hasher -- and, for each it would not, why; then the environment switches in
effect. Installs nothing and builds no engine.

The installed vLLM is judged by its code (``kvpool.vllm.digests``): the
files kvpool mirrors must be a listed release's, byte for byte; where they
are not, the report names the files that differ and from which release.

Exit status: 0 when kvpool would go in, 2 when it refuses the build
(``install()`` would raise ``UnsupportedVLLMVersionError``), 1 when no vLLM
can be imported. ``--vllm-version V`` judges release V by its number alone,
without importing vLLM or reading any code; ``--json`` prints the same report
as one JSON object.

``--prove`` runs kvpool's differential suites against the installed vLLM
and, where they all pass on code that is not a listed release's, records the
build so that ``install()`` accepts it (``kvpool.vllm.prove``): exit 0 when
proven, 3 when a suite failed (the first difference is printed), 1 without
vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from . import hasher as _hasher
from . import installer, releases
from . import manager as _manager
from .digests import code_line, identify, installed_digests

#: Exit status: listed, no vLLM, refused.
OK, NO_VLLM, REFUSED = 0, 1, 2

# The switches kvpool reads, each with what its values mean.
_SWITCHES = (
    (releases.ENV_VAR, {
        "": "the vLLM plugin does nothing (set 1 or auto to put kvpool into every vLLM "
            "process)",
        "1": "the vLLM plugin installs kvpool in every vLLM process; code that is not a "
             "listed release's stops vLLM's start",
        "auto": "the vLLM plugin installs kvpool where the code is a listed release's, and "
                "elsewhere logs one WARNING and leaves vLLM unchanged",
        "force": "the vLLM plugin installs kvpool on any build, the nearest older line's "
                 "on code it does not know (at your own risk)",
        "0": "the vLLM plugin does nothing",
    }),
    (_manager.ENV_VAR, {
        "": "kvpool's manager where the line has one",
        "0": "vLLM keeps its own KV-cache manager",
    }),
    (_hasher.ENV_VAR, {
        "": "kvpool's request block hasher",
        "0": "vLLM keeps its own request block hasher",
    }),
    ("KVPOOL_NO_EXTENSIONS", {
        "": "the compiled core, where it is built",
        "1": "the pure-Python core (no compiled manager or hasher)",
    }),
    (releases.INTAKE_VAR, {
        "": "no alias (only the release intake sets it)",
        "1": "the release intake's alias VERSION=LISTED: release VERSION is judged as the "
             "listed release LISTED",
    }),
)



def _switch(name: str, meanings: dict[str, str]) -> dict[str, Any]:
    raw = os.environ.get(name)
    value = (raw or "").strip().lower()
    if name == releases.ENV_VAR:
        key = "1" if value in installer.ON else value if value in ("auto", "force") else (
            "" if raw is None else "0")
    elif name == "KVPOOL_NO_EXTENSIONS":
        key = "1" if raw else ""
    elif name == releases.INTAKE_VAR:
        key = "1" if value else ""
    elif name == _manager.ENV_VAR:
        key = "" if _manager.manager_enabled() else "0"
    else:
        key = "" if _hasher.hasher_enabled() else "0"
    meaning = meanings[key]
    if raw is not None and key == "" and name != releases.INTAKE_VAR:
        meaning = f"not an off value, so: {meaning}"
    return {"name": name, "value": raw, "meaning": meaning}


def report(version: str | None = None) -> dict[str, Any]:
    """The report as a dict (what ``--json`` prints). ``version``: judge
    that release instead of importing vLLM."""
    import kvpool

    out: dict[str, Any] = {
        "kvpool": kvpool.__version__,
        "core": "compiled" if kvpool.USING_EXTENSION else "pure-Python",
        "vllm": version,
        "vllm_path": None,
        "code": None,
        "line": None,
        "status": "listed",
        "refused": None,
        "pool": None,
        "manager": None,
        "hasher": None,
        "switches": [_switch(name, meanings) for name, meanings in _SWITCHES],
    }
    imported = version is None
    if imported:
        try:
            import vllm
        except Exception as exc:  # noqa: BLE001  (any failure to import is "no vLLM")
            out["status"] = "no vllm"
            out["refused"] = (
                f"vLLM cannot be imported here ({type(exc).__name__}: {exc}); kvpool has "
                f"nothing to go into. Install a listed release: pip install 'kvpool[vllm]'"
            )
            return out
        out["vllm"] = version = str(vllm.__version__)
        out["vllm_path"] = os.path.dirname(getattr(vllm, "__file__", "") or "") or None
    try:
        if imported:
            line, out["code"] = code_line(version)
        else:
            line = releases.vllm_line(version)
    except releases.UnsupportedVLLMVersionError as exc:
        out["status"] = "refused"
        out["refused"] = str(exc)
        if imported:
            verdict = identify(installed_digests())
            out["code"] = getattr(exc, "code", verdict.describe())
            out["differing"] = [f"vllm/{p}" for p in verdict.differing]
            out["nearest"] = verdict.nearest
        forced = releases.vllm_line(version, force=True)
        out["force_line"] = forced.name
        return out
    except ValueError as exc:  # a mistyped KVPOOL_VLLM_INTAKE
        out["status"] = "refused"
        out["refused"] = str(exc)
        return out
    out["line"] = {"name": line.name, "module": line.module, "releases": list(line.releases)}
    out["pool"] = {"kvpool": True, "what": f"{line.module}.BlockPool ({out['core']} core)"}
    reason = _manager.manager_declined(line)
    out["manager"] = {"kvpool": reason is None,
                      "what": f"{line.manager}.KVCacheManager" if reason is None else reason}
    reason = _hasher.hasher_declined(line)
    if reason is None:
        from kvpool._hasher import SHA256_BACKEND

        what = f"kvpool._hasher.RequestBlockHasher (SHA-256: {SHA256_BACKEND})"
    else:
        what = reason
    out["hasher"] = {"kvpool": reason is None, "what": what}
    return out


def _text(out: dict[str, Any]) -> str:
    lines = [f"kvpool {out['kvpool']} ({out['core']} core)"]
    if out["status"] == "no vllm":
        lines.append(f"vLLM: not found. {out['refused']}")
    else:
        where = f" ({out['vllm_path']})" if out["vllm_path"] else " (as asked, not imported)"
        lines.append(f"vLLM {out['vllm']}{where}")
    if out["code"]:
        lines.append(f"its code (the files kvpool mirrors): {out['code']}")
    if out["status"] == "refused":
        listed = [r for line in releases.VLLM_LINES for r in line.releases]
        if out.get("differing"):
            lines.append(f"refused: install() raises UnsupportedVLLMVersionError, and "
                         f"KVPOOL_VLLM=1 stops vLLM's start: kvpool goes only into code it "
                         f"was proven against. python -m kvpool.vllm --prove proves this "
                         f"build (a few minutes), and kvpool then goes into exactly it.")
        elif "force_line" in out:
            lines.append(f"refused: kvpool lists vLLM {listed[0]} to {listed[-1]} "
                         f"({len(listed)} releases), not {out['vllm']}: install() raises "
                         f"UnsupportedVLLMVersionError, and KVPOOL_VLLM=1 stops vLLM's start.")
        else:
            lines.append(f"refused: {out['refused']}")
        if "force_line" in out:
            lines.append(f"install(force=True) and KVPOOL_VLLM=force would put in the "
                         f"{out['force_line']} line's classes, unproven on this release; "
                         f"KVPOOL_VLLM=auto leaves this vLLM unchanged.")
    if out["line"]:
        line = out["line"]
        lines.append(f"line {line['name']} ({line['module']}): vLLM "
                     f"{', '.join(line['releases'])}")
        lines.append("install() puts in:")
        for part in ("pool", "manager", "hasher"):
            entry = out[part]
            whose = "kvpool's" if entry["kvpool"] else "vLLM's "
            lines.append(f"  {part:<8} {whose}  {entry['what']}")
    lines.append("switches:")
    for switch in out["switches"]:
        shown = "unset" if switch["value"] is None else repr(switch["value"])
        lines.append(f"  {switch['name']}={shown}: {switch['meaning']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvpool.vllm",
        description="What kvpool would put into the vLLM installed here, and why not where "
                    "it would not. Installs nothing.",
    )
    parser.add_argument("--vllm-version", metavar="V",
                        help="judge vLLM release V instead of importing vLLM")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--prove", action="store_true",
                        help="run kvpool's differential suites against the installed vLLM "
                             "and, when they pass, record this build as proven (a few "
                             "minutes)")
    args = parser.parse_args(argv)
    if args.prove:
        if args.vllm_version or args.json:
            parser.error("--prove proves the installed vLLM: no --vllm-version or --json")
        from .prove import prove

        return prove()
    out = report(args.vllm_version)
    print(json.dumps(out, indent=2) if args.json else _text(out))
    return {"listed": OK, "no vllm": NO_VLLM, "refused": REFUSED}[out["status"]]


if __name__ == "__main__":
    sys.exit(main())
