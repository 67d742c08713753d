"""Checks and small queries for tools/build-wheels.sh, one subcommand each.

Most run in the script's tool venv (they need ``packaging`` and, before
Python 3.11, ``tomli``); ``marker-env`` and ``installed`` run in the
interpreter under test and use the standard library only. Each check prints
what it verified and exits non-zero with the reason when something is off.

    release_checks.py config PYPROJECT VERSION...   pyproject agrees with the versions the script builds
    release_checks.py test-command PYPROJECT        [tool.cibuildwheel] test-command, as one shell line
    release_checks.py test-sources PYPROJECT        [tool.cibuildwheel] test-sources, one a line
    release_checks.py marker-env                    this interpreter's PEP 508 marker environment (JSON)
    release_checks.py test-deps WHEEL ENV_JSON      what `pip install kvpool[test]` would pull in, minus kvpool
    release_checks.py wheel WHEEL FILE_LIST         a repaired wheel has every kvpool/ file of FILE_LIST, the compiled core, metadata
    release_checks.py sdist SDIST FILE_LIST         the sdist has everything to build, test and license kvpool
    release_checks.py installed [WHEEL]             run in a test venv: the installed kvpool (from WHEEL) and its compiled core are imported
    release_checks.py pytest-counts LOG             "passed=N failed=N ..." from a pytest log's last summary line
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

PACKAGE = "kvpool"
# What an sdist must hold besides every tracked file of kvpool/ and tests/.
SDIST_REQUIRED = (
    "PKG-INFO",
    "pyproject.toml",
    "setup.py",
    "README.md",
    "LICENSE",
    "kvpool/py.typed",
    "tests/conftest.py",
)
# In kvpool/, at least one of each (the build needs the first two, type
# checkers the last two).
PACKAGE_SUFFIXES = (".pyx", ".pxd", ".pyi", "py.typed")


def fail(message: str) -> None:
    sys.exit(f"release_checks: FAIL: {message}")


def load_toml(path: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def as_list(value: str | list[str]) -> list[str]:
    return value.split() if isinstance(value, str) else list(value)


def cmd_config(pyproject: str, *versions: str) -> None:
    """The script's Python range is the classifiers'; requires-python and
    [tool.cibuildwheel] must say the same."""
    from packaging.specifiers import SpecifierSet

    data = load_toml(pyproject)
    project = data["project"]
    classified = sorted(
        (m.group(1) for c in project.get("classifiers", [])
         if (m := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))),
        key=lambda v: int(v.split(".")[1]),
    )
    if classified != list(versions):
        fail(f"classifiers name Python {classified}, the script builds {list(versions)}")
    spec = SpecifierSet(project["requires-python"])
    lowest = int(versions[0].split(".")[1])
    if not all(spec.contains(f"{v}.0") for v in versions) or spec.contains(f"3.{lowest - 1}.99"):
        fail(f"requires-python {spec} does not start at {versions[0]}")

    # Its build selector is checked by cibuildwheel itself (the script
    # compares the identifiers it prints); here, what it leaves to us.
    cibw = data.get("tool", {}).get("cibuildwheel")
    if not cibw:
        fail("pyproject.toml has no [tool.cibuildwheel] section")
    if "test" not in as_list(cibw.get("test-extras", [])):
        fail("[tool.cibuildwheel] test-extras must include 'test' (the script installs them too)")
    sources = set(as_list(cibw.get("test-sources", [])))
    if not {"tests", "README.md"} <= sources:
        fail("[tool.cibuildwheel] test-sources must copy tests and README.md (tests/test_readme.py reads it)")
    if not cibw.get("test-command"):
        fail("[tool.cibuildwheel] has no test-command")
    print(f"pyproject agrees: Python {', '.join(versions)} (classifiers, requires-python {spec}); "
          f"cibuildwheel tests with extras {as_list(cibw['test-extras'])}, "
          f"sources {sorted(sources)}, command {cibw['test-command']!r}")


def cmd_test_command(pyproject: str) -> None:
    command = load_toml(pyproject)["tool"]["cibuildwheel"]["test-command"]
    print(" && ".join(command) if isinstance(command, list) else command)


def cmd_test_sources(pyproject: str) -> None:
    print("\n".join(as_list(load_toml(pyproject)["tool"]["cibuildwheel"]["test-sources"])))


def cmd_marker_env() -> None:
    """packaging.markers.default_environment(), without packaging."""
    import os
    import platform

    impl = sys.implementation
    version = f"{impl.version.major}.{impl.version.minor}.{impl.version.micro}"
    env = {
        "implementation_name": impl.name,
        "implementation_version": version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }
    print(json.dumps(env))


def wheel_metadata(wheel: str) -> tuple[list[str], str]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        return names, zf.read(meta).decode()


def cmd_test_deps(wheel: str, env_json: str) -> None:
    """One requirement a line: the runtime and 'test' dependencies whose
    markers hold for the interpreter under test, markers dropped."""
    from email.parser import HeaderParser

    from packaging.requirements import Requirement

    env = json.loads(Path(env_json).read_text())
    _, text = wheel_metadata(wheel)
    for line in HeaderParser().parsestr(text).get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or any(
            req.marker.evaluate({**env, "extra": extra}) for extra in ("", "test")
        ):
            req.marker = None
            print(req)


def package_files(file_list: str) -> list[str]:
    """The source tree's files of kvpool/ (subpackages too) and tests/."""
    return [p for p in Path(file_list).read_text().splitlines()
            if p.startswith((f"{PACKAGE}/", "tests/")) and not p.endswith(".c")]


def cmd_wheel(wheel: str, file_list: str) -> None:
    from email.parser import HeaderParser

    names, text = wheel_metadata(wheel)
    meta = HeaderParser().parsestr(text)
    tag = re.search(r"-(cp3\d+)-(cp3\d+)-([^-]+)\.whl$", Path(wheel).name)
    if not tag or "manylinux_" not in tag.group(3):
        fail(f"{Path(wheel).name}: not a CPython manylinux wheel")
    problems = []
    if not any(re.fullmatch(rf"{PACKAGE}/_core\.cpython-{tag.group(1)[2:]}-[^/]*\.so", n) for n in names):
        problems.append(f"no compiled kvpool/_core for {tag.group(1)}")
    for suffix in PACKAGE_SUFFIXES:
        if not any(n.startswith(f"{PACKAGE}/") and n.endswith(suffix) for n in names):
            problems.append(f"no {suffix} in kvpool/")
    if missing := [p for p in package_files(file_list) if p.startswith(f"{PACKAGE}/") and p not in names]:
        problems.append(f"it lacks {', '.join(missing)}")
    if any(n.endswith(".c") for n in names):
        problems.append("it carries generated C source")
    if not any(re.search(r"\.dist-info/licenses/LICENSE$", n) for n in names):
        problems.append("no .dist-info/licenses/LICENSE")
    if meta.get("License-Expression") != "Apache-2.0":
        problems.append(f"License-Expression is {meta.get('License-Expression')!r}")
    if not meta.get("Requires-Python"):
        problems.append("no Requires-Python")
    if problems:
        fail(f"{Path(wheel).name}: " + "; ".join(problems))
    print(f"{Path(wheel).name}: compiled core, every file of kvpool/, LICENSE, "
          f"License-Expression {meta['License-Expression']}, Requires-Python {meta['Requires-Python']}")


def cmd_sdist(sdist: str, file_list: str) -> None:
    import tarfile

    with tarfile.open(sdist) as tf:
        members = tf.getnames()
    top = members[0].split("/")[0]
    have = {m[len(top) + 1:] for m in members if m.startswith(top + "/")}
    missing = [p for p in (*SDIST_REQUIRED, *package_files(file_list)) if p not in have]
    for suffix in PACKAGE_SUFFIXES:
        if not any(p.startswith(f"{PACKAGE}/") and p.endswith(suffix) for p in have):
            missing.append(f"kvpool/*{suffix}")
    if missing:
        fail(f"{Path(sdist).name} lacks {', '.join(missing)}")
    if generated := sorted(p for p in have if p.endswith((".c", ".so", ".pyc"))):
        fail(f"{Path(sdist).name} carries build output: {', '.join(generated)}")
    tests = sum(1 for p in have if p.startswith("tests/") and p.endswith(".py"))
    print(f"{Path(sdist).name}: {len(have)} entries; .pyx/.pxd/.pyi/py.typed, "
          f"{tests} test modules (every source-tree file of kvpool/ and tests/), README.md, LICENSE")


def cmd_installed(wheel: str = "") -> None:
    """In the venv under test: kvpool comes from this venv's site-packages,
    was installed from WHEEL (its tags; without WHEEL, built from the sdist),
    and runs on the compiled core."""
    import importlib.metadata
    import sysconfig

    import kvpool

    where = Path(kvpool.__file__).resolve()
    site = Path(sysconfig.get_paths()["platlib"]).resolve()
    if site not in where.parents:
        fail(f"kvpool was imported from {where}, not from {site}")
    wheel_file = importlib.metadata.distribution(PACKAGE).read_text("WHEEL") or ""
    installed = {t.split("-", 2)[2] for t in re.findall(r"^Tag: (\S+)", wheel_file, re.M)}
    wheel_tags = set(Path(wheel).name[:-4].split("-")[-1].split(".")) if wheel else installed
    if not installed or not installed <= wheel_tags:
        fail(f"the installed kvpool has tags {sorted(installed)}, not those of {Path(wheel).name}")
    if not kvpool.USING_EXTENSION:
        fail("kvpool.USING_EXTENSION is False: the compiled core was not imported")
    core = Path(kvpool.CORE.__file__)
    if core.suffix != ".so":
        fail(f"kvpool.CORE is {core}, not a compiled module")
    print(f"kvpool {kvpool.__version__} from {where.parent}, "
          f"core {kvpool.CORE.__name__} ({core.name}), tags {'.'.join(sorted(installed))}")


def cmd_pytest_counts(log: str) -> None:
    lines = [ln for ln in Path(log).read_text(errors="replace").splitlines()
             if re.search(r"\d+ (passed|failed|error)", ln)]
    counts = dict.fromkeys(("passed", "failed", "errors", "skipped"), 0)
    if lines:
        for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", lines[-1]):
            counts["errors" if word.startswith("error") else word] = int(n)
    print(" ".join(f"{k}={v}" for k, v in counts.items()))


COMMANDS = {
    "config": cmd_config,
    "test-command": cmd_test_command,
    "test-sources": cmd_test_sources,
    "marker-env": cmd_marker_env,
    "test-deps": cmd_test_deps,
    "wheel": cmd_wheel,
    "sdist": cmd_sdist,
    "installed": cmd_installed,
    "pytest-counts": cmd_pytest_counts,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](*sys.argv[2:])
