#!/usr/bin/env bash
# CI step: the per-release pool differential tests (tests/vllm_release) for
# each vLLM release: kvpool's line for the release, over both cores, against
# the release's own BlockPool, plus the harness checks (the release's pool
# against itself, deliberately broken pools caught).
#
# One environment serves every release: a thin venv with kvpool (built once,
# as a wheel) over the cached vLLM 0.33.0 environment (.ci/vllm-env.sh), with
# the release's own source tree (.ci/vllm-src.sh) first on PYTHONPATH, so that
# vllm.__version__ is the release's. Prints one summary line per release and
# exits non-zero if any release fails or its tree cannot be fetched (loudly).
#
# usage: .ci/vllm-release-tests.sh [--vllm-only] [RELEASES...]
#   RELEASES     default: every release in kvpool.vllm.VLLM_LINES
#   --vllm-only  only the harness: the release's pool against itself and the
#                broken pools (for a release kvpool has no line for yet)
# Environment:
#   KVPOOL_WHEEL  a kvpool wheel to install (.ci/run builds one for all steps);
#                 unset: one is built from this checkout
#   KVPOOL_RELEASE_SEEDS_NEWEST  seeds for the newest release of each line
#                                (default 48)
#   KVPOOL_RELEASE_SEEDS_OTHER   seeds for every other release (default 16)
# A release costs about 8 s of CPU to start (vLLM and torch imports) plus
# about 0.25 s per seed (all candidates, broken pools, coverage).
#   KVPOOL_RELEASE_STEPS         steps per seed (default 200)
#   KVPOOL_VLLM_ENV_CACHE        cached vLLM environments (.ci/vllm-env.sh;
#                                default ~/.cache/kvpool/vllm-envs)
#   KVPOOL_VLLM_PYTEST_ARGS      extra pytest arguments, e.g. "-x"
#   PYTHON                       builds the wheel and the venv (default python3)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
python=${PYTHON:-python3}
export KVPOOL_VLLM_ENV_CACHE=${KVPOOL_VLLM_ENV_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/kvpool/vllm-envs}

candidates=""
if [ "${1:-}" = "--vllm-only" ]; then
    candidates=vllm
    shift
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-release.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=kvpool-wheel.sh
. "$here/kvpool-wheel.sh"
PYTHON=$python kvpool_wheel "$repo" "$tmp/wheel"

echo "== environment: vLLM 0.33.0's packages, kvpool installed"
venv=$tmp/venv
bash "$repo/.ci/vllm-env.sh" --vllm 0.33.0 "$venv" "$kvpool_wheel"
if [ ! -x "$venv/bin/python" ]; then
    echo "!!!!! vllm-release-tests: no environment was built (disk too small?) !!!!!" >&2
    exit 1
fi

# Each line's releases, oldest first; the newest of a line is marked "*".
# (The installed kvpool's registry, read from a neutral directory.)
lines=$(cd "$tmp" && "$venv/bin/python" -c '
from kvpool.vllm import VLLM_LINES
for line in VLLM_LINES:
    for release in line.releases:
        print(release + ("*" if release == line.releases[-1] else ""))
')
if [ $# -gt 0 ]; then
    releases="$*"
else
    releases=$(echo "$lines" | tr -d '*')
fi

summary=()
failed=0
total=$SECONDS
for release in $releases; do
    if echo "$lines" | grep -qx "$release\*"; then
        seeds=${KVPOOL_RELEASE_SEEDS_NEWEST:-48}
    else
        seeds=${KVPOOL_RELEASE_SEEDS_OTHER:-16}
    fi
    if ! src=$(bash "$repo/.ci/vllm-src.sh" "$release" "$python"); then
        echo "!!!!! vllm-release-tests: vLLM $release's source tree could not be fetched !!!!!" >&2
        summary+=("vLLM $release: FAILED (no source tree)")
        failed=1
        continue
    fi
    echo "== vLLM $release: tests/vllm_release, $seeds seeds${candidates:+, candidates: $candidates}"
    started=$SECONDS
    rc=0
    # From a neutral directory: the installed kvpool (compiled core) is the
    # one imported; --rootdir keeps the checkout's pytest settings.
    # shellcheck disable=SC2086
    # (KVPOOL_VLLM_EXPECT: the conftest fails if another vLLM was imported)
    (cd "$tmp" && PYTHONPATH=$src KVPOOL_VLLM_STRICT=1 KVPOOL_VLLM_EXPECT=$release \
        KVPOOL_RELEASE_SEEDS=$seeds \
        KVPOOL_RELEASE_CANDIDATES=$candidates \
        "$venv/bin/python" -m pytest "$repo/tests/vllm_release" --rootdir "$repo" -q \
        -p no:cacheprovider -W ignore::DeprecationWarning ${KVPOOL_VLLM_PYTEST_ARGS:-} \
        >"$tmp/log-$release" 2>&1) || rc=$?
    counts=$(grep -E '^[0-9]+ (passed|failed)|(passed|failed|error)' "$tmp/log-$release" | tail -1 || true)
    if [ "$rc" = 0 ]; then
        result="passed"
    else
        result="FAILED (pytest exit $rc)"
        failed=1
        tail -60 "$tmp/log-$release"
    fi
    summary+=("vLLM $release: $result, $seeds seeds, $((SECONDS - started))s: ${counts//=/}")
done

echo "== vLLM release tests summary ($((SECONDS - total))s)"
printf '   %s\n' "${summary[@]}"
exit "$failed"
