#!/usr/bin/env bash
# CI step: for each supported vLLM release, build its environment
# (.ci/vllm-env.sh) and run the tests written against it in there:
#   0.15.1, 0.16.0  tests/vllm    (differential tests against vLLM's own
#                                  KVCacheManager, install/plugin tests)
#   0.33.0          tests/vllm33
# (vLLM's own pool tests of every line's newest release run in
# .ci/vllm-own-all.sh.)
# Exits non-zero if a test fails, if an environment cannot be built, or if
# the disk cannot hold it (one loud line; KVPOOL_SKIP_VLLM=1 turns only that
# last case into a skip, said just as loudly). Every release is run even if
# an earlier one failed; the summary at the end lists each one's result and
# times.
#
# usage: .ci/vllm-tests.sh [REPO]   (default: this checkout)
# Environment:
#   KVPOOL_WHEEL  a kvpool wheel to install (.ci/run builds one for all steps);
#                 unset: one is built from this checkout
#   KVPOOL_VLLM_VERSIONS     releases to run (default: "0.15.1 0.16.0 0.33.0")
#   KVPOOL_VLLM_ENV_CACHE    where vLLM environments are cached between runs
#                            (default: ~/.cache/kvpool/vllm-envs; empty: build
#                            each one from scratch in a temporary directory).
#                            See .ci/vllm-env.sh: a cached environment is keyed
#                            by release, pins and Python, and only read; the
#                            kvpool under test always goes into a fresh venv.
#   KVPOOL_VLLM_PYTEST_ARGS  extra pytest arguments, e.g. "-x -k full"
# VLLM_WHEEL_DIR, PYTHON, KVPOOL_VLLM_NEED_MIB: passed on to .ci/vllm-env.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "${1:-$(dirname "$here")}" && pwd)
versions=${KVPOOL_VLLM_VERSIONS:-0.15.1 0.16.0 0.33.0}
export KVPOOL_VLLM_ENV_CACHE=${KVPOOL_VLLM_ENV_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/kvpool/vllm-envs}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-vllm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# kvpool is compiled once, into a wheel every release's venv installs.
# shellcheck source=kvpool-wheel.sh
. "$here/kvpool-wheel.sh"
kvpool_wheel "$repo" "$tmp/wheel"

summary=()
failed=0
for version in $versions; do
    case "$version" in
        0.15.* | 0.16.*) tests=tests/vllm ;;
        0.33.*) tests=tests/vllm33 ;;
        *) echo "vllm-tests: no tests for vLLM '$version'" >&2; exit 2 ;;
    esac
    venv=$tmp/venv-$version
    echo "== vLLM $version: environment"
    started=$SECONDS
    if ! bash "$repo/.ci/vllm-env.sh" --vllm "$version" "$venv" "$kvpool_wheel"; then
        summary+=("vLLM $version: FAILED to build its environment")
        failed=1
        continue
    fi
    built=$((SECONDS - started))
    if [ ! -x "$venv/bin/python" ]; then
        # vllm-env.sh exited 0 without building: the disk was too small and
        # KVPOOL_SKIP_VLLM=1 allowed the skip (it printed the loud line).
        summary+=("vLLM $version: SKIPPED (disk too small, KVPOOL_SKIP_VLLM=1)")
        continue
    fi

    echo "== vLLM $version: pytest $tests"
    started=$SECONDS
    # From a neutral directory, so that the installed kvpool (with its
    # compiled core and entry point) is the one imported, not the checkout's
    # sources. --rootdir keeps the checkout's pytest settings.
    rc=0
    # shellcheck disable=SC2086
    (cd "$tmp" && KVPOOL_VLLM_STRICT=1 "$venv/bin/python" -m pytest "$repo/$tests" \
        --rootdir "$repo" -q -p no:cacheprovider -ra ${KVPOOL_VLLM_PYTEST_ARGS:-}) || rc=$?
    result="passed"
    if [ "$rc" != 0 ]; then
        result="FAILED (pytest exit $rc)"
        failed=1
    fi
    summary+=("vLLM $version: $tests $result; environment ${built}s, tests $((SECONDS - started))s")
    # The thin venv is small, a full one is not: do not keep it past its tests.
    rm -rf "$venv"
done

echo "== vLLM tests summary"
printf '   %s\n' "${summary[@]}"
exit "$failed"
