#!/usr/bin/env bash
# vLLM's own pool tests, stock and with kvpool swapped in
# (.ci/vllm-own-tests.sh), for a list of releases, in one environment: the
# vLLM 0.33.0 test environment with each release's tree first on PYTHONPATH.
# One summary line per release; exits non-zero if any release fails.
#
# usage: .ci/vllm-own-all.sh [--python PYTHON] [VERSION...]
#   VERSION  default: the newest release of each line in kvpool.vllm.VLLM_LINES
#            (the releases CI runs).
#   PYTHON   an interpreter of that environment in which kvpool imports;
#            default: a thin venv over the cached 0.33.0 environment
#            (.ci/vllm-env.sh, KVPOOL_VLLM_ENV_CACHE as in .ci/vllm-tests.sh)
#            holding kvpool built from this checkout, removed at the end.
# For the releases whose kvpool line has a KVCacheManager (0.30-0.34) the
# kvpool run has kvpool's manager in too, and vLLM's test_scheduler.py.
# Environment: KVPOOL_OWN_SKIP_MISSING, KVPOOL_OWN_MODES, KVPOOL_OWN_JOBS,
#   KVPOOL_OWN_TIMEOUT, KVPOOL_VLLM_MANAGER (=0: vLLM's manager in the kvpool
#   run), KVPOOL_WHEEL (a kvpool wheel to install; unset: built from this
#   checkout) (see .ci/vllm-own-tests.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
python=
if [ "${1:-}" = --python ]; then
    python=${2:?usage: .ci/vllm-own-all.sh [--python PYTHON] [VERSION...]}
    shift 2
fi
started=$SECONDS

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-vllm-own-all.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ -z "$python" ]; then
    export KVPOOL_VLLM_ENV_CACHE=${KVPOOL_VLLM_ENV_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/kvpool/vllm-envs}
    echo "== vllm-own-all: environment (vLLM 0.33.0's, kvpool from ${KVPOOL_WHEEL:-$repo})"
    bash "$here/vllm-env.sh" --vllm 0.33.0 "$tmp/venv" "${KVPOOL_WHEEL:-$repo}" > "$tmp/env.log" 2>&1 || {
        tail -n 20 "$tmp/env.log"
        echo "!!!!! vllm-own-all: could not build the environment !!!!!" >&2
        exit 1
    }
    if [ ! -x "$tmp/venv/bin/python" ]; then  # the disk too small, skip allowed
        tail -n 3 "$tmp/env.log"
        exit 0
    fi
    python=$tmp/venv/bin/python
fi

if [ $# -gt 0 ]; then
    versions=("$@")
else
    # From a neutral directory: the kvpool the interpreter imports decides.
    read -r -a versions <<< "$(cd "$tmp" && "$python" -c '
from kvpool.vllm import VLLM_LINES
print(" ".join(line.releases[-1] for line in VLLM_LINES))')"
fi

summary=()
failed=0
# Wall time depends on what else the machine runs; the CPU time (user+sys of
# every process of the release's runs) much less: both are reported.
TIMEFORMAT='%U %S'
for version in "${versions[@]}"; do
    echo "== vLLM $version: its own pool tests, stock and with kvpool"
    rc=0
    { time bash "$here/vllm-own-tests.sh" "$version" "$python" "$repo" 2>&1 | tee "$tmp/own.log"; } \
        2> "$tmp/time" || rc=$?
    line=$(grep '^vllm-own-tests: ' "$tmp/own.log" | tail -n 1 || true)
    if [ "$rc" != 0 ]; then
        failed=1
        [ -n "$line" ] || line="vllm-own-tests: $version FAILED (exit $rc)"
    fi
    cpu=$(awk '{printf "%d", $1 + $2}' "$tmp/time" 2> /dev/null || echo "?")
    summary+=("${line#vllm-own-tests: } cpu=${cpu}s")
done

echo "== vLLM's own pool tests, $((SECONDS - started))s in all"
printf '   %s\n' "${summary[@]}"
exit "$failed"
