#!/usr/bin/env bash
# The manager differential test (tests/vllm_release_mgr) for each vLLM
# release, in the overlay environment: ONE environment, the cached vLLM
# 0.33.0 test environment (.ci/vllm-env.sh --vllm 0.33.0) with kvpool
# installed, and per release that release's own Python tree
# (.ci/vllm-src.sh VERSION) first on PYTHONPATH. Each release's own
# KVCacheManager then runs over vLLM's pool and over kvpool's pool of the
# release's line (kvpool.vllm.vllm_line). One summary line per release;
# exits non-zero if any release failed. Every release is run even if an
# earlier one failed.
#
# usage: .ci/vllm-mgr-all.sh [RELEASES...]
#   default: the newest release of each line in kvpool.vllm.VLLM_LINES
# Environment:
#   KVPOOL_WHEEL  a kvpool wheel to install (.ci/run builds one for all steps);
#                 unset: one is built from this checkout
#   KVPOOL_MGR_PYTHON       the python of an existing overlay environment to
#                           use instead of building one (kvpool is then taken
#                           from this checkout: build its core in place first,
#                           python setup.py build_ext --inplace)
#   KVPOOL_MGR_SCALE        scales every workload's request count (default 1)
#   KVPOOL_VLLM_ENV_CACHE   cached vLLM environments (default:
#                           ~/.cache/kvpool/vllm-envs; see .ci/vllm-env.sh)
#   KVPOOL_VLLM_PYTEST_ARGS extra pytest arguments, e.g. "-x -k full"
# About 20 s of CPU a release (a third of it importing torch and vLLM): the
# 12 newest releases of issue 15 took 3 min 41 s of CPU, 12 min of wall time
# on the 2-core machine shared at load 11; plus about 30 s for the
# environment from its cache.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
export KVPOOL_VLLM_ENV_CACHE=${KVPOOL_VLLM_ENV_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/kvpool/vllm-envs}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-mgr.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

if [ -n "${KVPOOL_MGR_PYTHON:-}" ]; then
    python=$KVPOOL_MGR_PYTHON
    kvpool_path=$repo
else
    # shellcheck source=kvpool-wheel.sh
    . "$here/kvpool-wheel.sh"
    kvpool_wheel "$repo" "$tmp/wheel"
    echo "== the overlay environment (vLLM 0.33.0's, with kvpool)"
    bash "$here/vllm-env.sh" --vllm 0.33.0 "$tmp/venv" "$kvpool_wheel"
    python=$tmp/venv/bin/python
    kvpool_path=
fi

if [ $# -gt 0 ]; then
    releases=("$@")
else
    # shellcheck disable=SC2207
    releases=($(PYTHONPATH=$kvpool_path "$python" -c '
import kvpool.vllm as v
print(" ".join(line.releases[-1] for line in v.VLLM_LINES))'))
fi

summary=()
failed=0
for release in "${releases[@]}"; do
    started=$SECONDS
    tree=$(bash "$here/vllm-src.sh" "$release") || {
        summary+=("vLLM $release: FAILED (no source tree from .ci/vllm-src.sh)")
        failed=1
        continue
    }
    log=$tmp/$release.log
    echo "== vLLM $release: tests/vllm_release_mgr"
    rc=0
    # From a neutral directory, so that kvpool comes from the environment (or
    # KVPOOL_MGR_PYTHON's checkout), not from the current directory.
    # shellcheck disable=SC2086
    # (KVPOOL_VLLM_EXPECT: the conftest fails if another vLLM was imported)
    (cd "$tmp" && KVPOOL_VLLM_STRICT=1 KVPOOL_VLLM_EXPECT=$release \
        PYTHONPATH=$tree${kvpool_path:+:$kvpool_path} \
        "$python" -m pytest "$repo/tests/vllm_release_mgr" --rootdir "$repo" \
        -q -p no:cacheprovider --junitxml "$tmp/$release.xml" \
        ${KVPOOL_VLLM_PYTEST_ARGS:-}) > "$log" 2>&1 || rc=$?
    if [ "$rc" = 0 ]; then tail -1 "$log"; else failed=1; tail -60 "$log"; fi
    summary+=("vLLM $release: $(python3 "$here/vllm-mgr-summary.py" "$tmp/$release.xml" "$rc"); $((SECONDS - started))s")
done

echo "== manager differential tests, per release"
printf '   %s\n' "${summary[@]}"
exit "$failed"
