#!/usr/bin/env python3
"""Fetch a release file (an sdist or a wheel) from the package index that pip
is configured for, without building anything, and check it against a pin.

    python .ci/pypi-fetch.py [--pins FILE] [--cache DIR] [--pin-new] NAME==VERSION KIND

KIND is ``sdist`` or a wheel filename suffix (``x86_64.whl``). The file is
looked up the way ``pip download`` looks it up (pip's own finder, with pip's
configuration files and environment: the same index, mirrors and
certificates), then downloaded with pip's own HTTP session, into DIR
(default ``$KVPOOL_PYPI_CACHE``, else ``~/.cache/kvpool/pypi``); the path is
printed on stdout.

Why not ``pip download``: for an sdist it runs the package's metadata step
(``setup.py egg_info``), which for vLLM needs torch, setuptools-rust and a
target device, none of which a download should need. Here nothing of the
package runs.

Every file must have a line ``SHA256  FILENAME`` in the pins file (default
``tests/vllm_suites/SHA256SUMS``): a missing pin, a hash that differs from
the pin, or a file the index does not have is a loud failure (exit 1). A
cached file is checked against its pin before it is used. ``--pin-new``
adds the pin of a file that has none (from the index's own sha256, checked
on download): for a maintainer adding a release, never used by CI.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PINS = REPO / "tests" / "vllm_suites" / "SHA256SUMS"


def fail(message: str) -> None:
    print(f"!!!!! pypi-fetch: {message} !!!!!", file=sys.stderr)
    sys.exit(1)


def read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            digest, name = line.split()
            pins[name] = digest
    return pins


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_link(requirement: str, kind: str):
    """(session, link) of the file of ``requirement`` (NAME==VERSION) whose
    name ends with ``kind`` (``sdist``: ``.tar.gz``), found as ``pip
    download`` finds it."""
    import logging

    from pip._internal.commands.download import DownloadCommand

    # pip's finder warns about every configured file:// index it cannot read.
    logging.getLogger("pip").setLevel(logging.ERROR)

    name, _, version = requirement.partition("==")
    if not version:
        fail(f"give the release as NAME==VERSION, not {requirement!r}")
    command = DownloadCommand("download", "fetch a release file")
    # Parsed as pip download's own options: pip's configuration files and
    # PIP_* environment apply exactly as they would to `pip download`.
    options, _ = command.parse_args(["--no-deps", requirement])
    session = command._build_session(options)
    finder = command._build_package_finder(options=options, session=session)
    suffix = ".tar.gz" if kind == "sdist" else kind
    wanted = f"{name.lower().replace('_', '-')}-{version}"
    for candidate in finder.find_all_candidates(name):
        link = candidate.link
        if str(candidate.version) != version or not link.filename.endswith(suffix):
            continue
        if kind == "sdist" and link.filename.lower().replace("_", "-") != wanted + suffix:
            continue
        return session, link
    fail(f"the package index has no {kind} of {requirement}")


def download(session, link, target: Path) -> None:
    partial = target.with_name(target.name + f".partial.{os.getpid()}")
    try:
        with session.get(link.url_without_fragment, stream=True) as response:
            response.raise_for_status()
            with partial.open("wb") as fh:
                for chunk in response.iter_content(1 << 20):
                    fh.write(chunk)
        partial.replace(target)
    except Exception as exc:  # network, HTTP status, disk
        partial.unlink(missing_ok=True)
        fail(f"could not download {link.filename}: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requirement", help="NAME==VERSION")
    parser.add_argument("kind", help="'sdist' or a wheel filename suffix such as x86_64.whl")
    parser.add_argument("--pins", type=Path, default=DEFAULT_PINS)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--pin-new", action="store_true", help="pin a file that has no pin yet")
    args = parser.parse_args()
    cache = args.cache or Path(
        os.environ.get("KVPOOL_PYPI_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "kvpool", "pypi")
    )
    cache.mkdir(parents=True, exist_ok=True)
    pins = read_pins(args.pins)

    session, link = find_link(args.requirement, args.kind)
    name = link.filename
    if name not in pins and not args.pin_new:
        fail(f"{name} has no pin in {args.pins}")
    target = cache / name
    if target.exists() and sha256_of(target) != pins.get(name):
        target.unlink()  # a stale or damaged copy: fetch it again
    if not target.exists():
        print(f"pypi-fetch: downloading {name}", file=sys.stderr)
        download(session, link, target)
        digest = sha256_of(target)
        index_digest = link.hash if link.hash_name == "sha256" else None
        if index_digest and index_digest != digest:
            target.unlink()
            fail(f"{name}: its sha256 {digest} is not the one the index gives, {index_digest}")
        if name not in pins:
            with args.pins.open("a") as fh:
                fh.write(f"{digest}  {name}\n")
            pins[name] = digest
            print(f"pypi-fetch: pinned {name}", file=sys.stderr)
        if digest != pins[name]:
            target.unlink()
            fail(f"{name} does not match its pinned checksum (got {digest})")
    print(target)


if __name__ == "__main__":
    main()
