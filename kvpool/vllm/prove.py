"""``python -m kvpool.vllm --prove``: prove kvpool exact on the vLLM
installed here, whatever it is (a release, a nightly, a release candidate, a
patched fork), and record the build so that ``install()`` accepts it.

The line proven is the one of the listed release whose code is nearest
(``kvpool.vllm.digests.identify``: the fewest mirrored files differing).
The suites are kvpool's own differential checks, shipped in the package
(``kvpool.vllm.proof``), run against the installed vLLM's own classes:

- the pool traces (``proof.pool``): seeded operation sequences on vLLM's
  ``BlockPool`` and on kvpool's as ``install()`` puts it in, compared after
  every step (ids, every block's fields, queue order, map, event bytes,
  metrics);
- the manager driver (``proof.manager``): vLLM's ``KVCacheManager`` driven
  as its scheduler drives it, over vLLM's pool and kvpool's, and kvpool's
  manager against vLLM's where the line has one;
- the hasher check (``proof.hasher``): kvpool's request block hasher against
  vLLM's, where the line installs it.

Each suite also shows it has teeth on this build: vLLM against itself must
pass, and planted faults must be caught. The first failing case stops the
proof, names the difference and records nothing. When every suite passes
and the code is not a listed release's, the build is recorded
(``kvpool.vllm.proven``).
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from typing import Any, TextIO

from .digests import identify, installed_digests

__all__ = ["PROVEN", "FAILED", "NO_VLLM", "SUITES", "prove"]

#: Exit status: proven, no vLLM, a suite failed.
PROVEN, NO_VLLM, FAILED = 0, 1, 3

#: The suites, in the order they run (modules of ``kvpool.vllm.proof``).
SUITES = ("pool", "manager", "hasher")


class _Progress:
    """One line per suite: rewritten in place on a terminal, else printed
    when the suite starts and ends (and every 20% in between)."""

    def __init__(self, out: TextIO, label: str, total: int) -> None:
        self.out, self.label, self.total = out, label, total
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.started = time.monotonic()
        self.shown = -1
        self.show(0)

    def show(self, done: int, end: str = "") -> None:
        seconds = time.monotonic() - self.started
        text = f"{self.label}: {done}/{self.total} cases, {seconds:.0f} s{end}"
        if self.tty:
            self.out.write("\r\x1b[K" + text + ("\n" if end else ""))
        elif end or done == 0 or (done < self.total and done * 5 // max(self.total, 1) > self.shown):
            self.out.write(text + "\n")
        self.shown = done * 5 // max(self.total, 1)
        self.out.flush()


def _line_to_prove(version: str, verdict: Any) -> Any:
    from .releases import vllm_line

    if verdict.release is not None:
        return vllm_line(verdict.release)
    if verdict.nearest is not None:
        return vllm_line(verdict.nearest)
    return vllm_line(version, force=True)


def prove(out: TextIO | None = None, *, suites: tuple[str, ...] = SUITES) -> int:
    """Run the suites against the installed vLLM, print the verdict per
    suite to ``out`` (default stdout), record the build when all pass;
    returns the exit status."""
    out = sys.stdout if out is None else out
    from . import proven
    from .proof._base import HarnessFailure, ProofFailure, patched

    try:
        import vllm
    except Exception as exc:  # noqa: BLE001  (any failure to import is "no vLLM")
        out.write(f"vLLM cannot be imported here ({type(exc).__name__}: {exc}): nothing to prove\n")
        return NO_VLLM
    import kvpool

    version = str(vllm.__version__)
    digests = installed_digests()
    verdict = identify(digests)
    line = _line_to_prove(version, verdict)
    out.write(f"kvpool {kvpool.__version__} "
              f"({'compiled' if kvpool.USING_EXTENSION else 'pure-Python'} core), vLLM {version} "
              f"({vllm.__file__.rsplit('/', 1)[0]})\n")
    out.write(f"its code: {verdict.describe()}\n")
    out.write(f"proving the {line.name} line ({line.module}) against it\n")
    if not kvpool.USING_EXTENSION:
        out.write("FAILED: kvpool's compiled core is not loaded here (KVPOOL_NO_EXTENSIONS "
                  "set, or the extension not built): install() would put in the pure-Python "
                  "core, which is not what --prove proves\n")
        return FAILED
    # vLLM's own warnings (a random NONE_HASH seed for xxhash, refused
    # resets) would bury the progress lines: only its errors show.
    for noisy in ("vllm", "kvpool"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    ran: dict[str, str] = {}
    for i, name in enumerate(suites, 1):
        suite = importlib.import_module(f"{__package__}.proof.{name}")
        label = f"[{i}/{len(suites)}] {suite.NAME}"
        reason = suite.applies(line)
        if reason is not None:
            out.write(f"{label}: not run: {reason}\n")
            ran[suite.NAME] = f"not run: {reason}"
            continue
        cases = suite.cases(line)
        progress = _Progress(out, label, len(cases))
        for done, case in enumerate(cases):
            try:
                with patched() as patch:
                    case.run(patch)
            except HarnessFailure as exc:
                progress.show(done, " FAILED")
                out.write(f"{case.name}: the suite does not work on this vLLM, so it proves "
                          f"nothing here:\n{exc}\nnothing recorded\n")
                return FAILED
            except ProofFailure as exc:
                progress.show(done, " FAILED")
                out.write(f"{case.name}: kvpool differs from this vLLM:\n{exc}\n"
                          f"nothing recorded: kvpool stays out of this build\n")
                return FAILED
            except Exception as exc:  # noqa: BLE001  (a raise is a difference too)
                import traceback

                progress.show(done, " FAILED")
                where = "".join(traceback.format_exception(exc)[-6:])
                out.write(f"{case.name}: raised where vLLM's own code did not, or the suite "
                          f"cannot drive this vLLM:\n{where}nothing recorded: kvpool stays out "
                          f"of this build\n")
                return FAILED
            progress.show(done + 1)
        progress.show(len(cases), " passed")
        ran[suite.NAME] = f"{len(cases)} cases passed"
    if verdict.release is not None:
        out.write(f"proven: every suite passed. This is the code of vLLM {verdict.release}, "
                  f"which install() accepts already: nothing recorded\n")
        return PROVEN
    try:
        path = proven.record(digests, vllm=version, line=line.name, nearest=verdict.nearest,
                             suites=ran)
    except (proven.RecordError, OSError) as exc:
        out.write(f"proven, but not recorded: {exc}\n")
        return FAILED
    out.write(f"proven: every suite passed. Recorded in {path}: install() and "
              f"KVPOOL_VLLM=1|auto now put the {line.name} line into exactly this build "
              f"(one byte changed in a mirrored file, or another kvpool, and it is "
              f"refused again)\n")
    return PROVEN
