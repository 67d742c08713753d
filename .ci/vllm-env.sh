#!/usr/bin/env bash
# Build the environment the vLLM tests (tests/vllm) and benchmark
# (benchmarks/bench_vllm_manager.py) run in: a venv with a CPU torch, vLLM
# 0.15.1 without its GPU dependencies, the pure-Python packages its
# scheduler-side imports need (tests/vllm/requirements.txt, pinned), and
# kvpool itself.
#
# usage: .ci/vllm-env.sh VENV_DIR [KVPOOL_SOURCE]
#   VENV_DIR       where to create the venv (must not exist yet)
#   KVPOOL_SOURCE  what to pip-install as kvpool (default: this checkout)
#
# Environment:
#   PYTHON                 interpreter for the venv (default: python3)
#   VLLM_WHEEL_DIR         a directory holding vllm-0.15.1-*.whl, to skip the
#                          ~500 MB download (optional; PyPI otherwise)
#   KVPOOL_VLLM_NEED_MIB   free disk required, MiB (default: 5000)
#   KVPOOL_SKIP_VLLM=1     if the disk is too small: say so and exit 0
#                          without building (otherwise: exit 1)
#
# About 2.6 GB installed, 1-2 minutes with a warm pip cache.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
venv=${1:?usage: .ci/vllm-env.sh VENV_DIR [KVPOOL_SOURCE]}
src=${2:-$repo}
python=${PYTHON:-python3}
need_mib=${KVPOOL_VLLM_NEED_MIB:-5000}

if [ -e "$venv" ]; then
    echo "vllm-env: $venv already exists; give a new path" >&2
    exit 1
fi

# --- disk: the venv (~2.6 GB) plus the pip cache and unpacked wheels --------
existing=$(dirname "$venv")
while [ ! -d "$existing" ]; do existing=$(dirname "$existing"); done
avail_mib=$(df -Pm "$existing" | awk 'NR == 2 { print $4 }')
if [ "$avail_mib" -lt "$need_mib" ]; then
    line="!!!!! KVPOOL vLLM TESTS CANNOT RUN: ${avail_mib} MiB free on the disk of ${existing}, the vLLM 0.15.1 test environment needs ${need_mib} MiB !!!!!"
    if [ "${KVPOOL_SKIP_VLLM:-}" = 1 ]; then
        echo "$line (KVPOOL_SKIP_VLLM=1: skipped, nothing built)"
        exit 0
    fi
    echo "$line (set KVPOOL_SKIP_VLLM=1 to allow skipping)"
    exit 1
fi

started=$SECONDS
step() { echo "vllm-env [$((SECONDS - started))s] $*"; }

step "venv: $venv ($("$python" --version 2>&1))"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

step "torch 2.13.0 (CPU build) and the pinned pure-Python dependencies"
"${pip[@]}" install -q -r "$repo/tests/vllm/requirements.txt"

step "vllm 0.15.1 and xgrammar 0.1.29, without their dependencies"
find_links=()
if [ -n "${VLLM_WHEEL_DIR:-}" ]; then
    find_links=(--find-links "$VLLM_WHEEL_DIR")
fi
"${pip[@]}" install -q --no-deps "${find_links[@]}" vllm==0.15.1 xgrammar==0.1.29

step "kvpool from $src"
"${pip[@]}" install -q --no-deps "$src"

step "check: vLLM's KV-cache manager imports on the CPU"
(cd / && "$venv/bin/python" -c '
import importlib.metadata as md
import vllm, kvpool
import vllm.v1.core.kv_cache_manager, vllm.distributed.kv_events, vllm.plugins
eps = [ep.value for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "kvpool"]
print("vllm", vllm.__version__, "| kvpool", kvpool.__version__,
      "core:", "compiled" if kvpool.USING_EXTENSION else "pure-Python",
      "| plugin entry point:", eps or "MISSING")
assert vllm.__version__ == "0.15.1", vllm.__version__
assert eps == ["kvpool.vllm:plugin"], eps
')
step "done: $venv ($(du -sm "$venv" | cut -f1) MiB)"
