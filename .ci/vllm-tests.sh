#!/usr/bin/env bash
# CI step: build the vLLM 0.15.1 environment in a temporary directory
# (.ci/vllm-env.sh) and run the differential tests against vLLM's own
# KVCacheManager (tests/vllm) in it. Exits non-zero if a test fails, if the
# environment cannot be built, or if the disk cannot hold it (one loud line;
# KVPOOL_SKIP_VLLM=1 turns only that last case into a skip, said just as loudly).
#
# usage: .ci/vllm-tests.sh [REPO]   (default: this checkout)
# Extra pytest arguments: KVPOOL_VLLM_PYTEST_ARGS="-x -k full"
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "${1:-$(dirname "$here")}" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-vllm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
venv=$tmp/venv

bash "$repo/.ci/vllm-env.sh" "$venv" "$repo"
if [ ! -x "$venv/bin/python" ]; then
    # vllm-env.sh exited 0 without building: the disk was too small and
    # KVPOOL_SKIP_VLLM=1 allowed the skip (it printed the loud line).
    exit 0
fi

echo "vllm-tests: pytest tests/vllm"
# From a neutral directory, so that the installed kvpool (with its compiled
# core and entry point) is the one imported, not the checkout's sources.
cd "$tmp"
# shellcheck disable=SC2086
KVPOOL_VLLM_STRICT=1 "$venv/bin/python" -m pytest "$repo/tests/vllm" \
    --rootdir "$repo" -q -p no:cacheprovider -ra ${KVPOOL_VLLM_PYTEST_ARGS:-}
