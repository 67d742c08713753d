#!/usr/bin/env bash
# Build the environment the vLLM tests (tests/vllm, tests/vllm33) and benchmark
# (benchmarks/bench_vllm_manager.py) run in: a venv with a CPU torch, one vLLM
# release without its GPU dependencies, the pure-Python packages its
# scheduler-side imports need (pinned, per release line: see VERSIONS below),
# and kvpool itself.
#
# usage: .ci/vllm-env.sh [--vllm VERSION] [--no-kvpool] VENV_DIR [KVPOOL_SOURCE]
#   --vllm VERSION  0.15.1 (default), 0.16.0 or 0.33.0
#   --no-kvpool     leave kvpool out (an environment to install a kvpool into
#                   later, or to run vLLM's own pool alone)
#   VENV_DIR        where to create the venv (must not exist yet)
#   KVPOOL_SOURCE   what to pip-install as kvpool (default: this checkout)
#
# Environment:
#   PYTHON                 interpreter for the venv (default: python3)
#   VLLM_WHEEL_DIR         a directory holding vllm-VERSION-*.whl, to skip the
#                          300-500 MB download (optional; PyPI otherwise)
#   KVPOOL_VLLM_ENV_CACHE  a directory of cached vLLM environments (optional).
#                          Set: vLLM and its pinned dependencies are built once
#                          per (release, requirements file, Python) into
#                          DIR/vllm-VERSION-KEY and reused; VENV_DIR is then a
#                          thin venv holding kvpool, which sees the cached
#                          packages through a .pth file. The cached tree is
#                          only read, never installed into.
#   KVPOOL_VLLM_NEED_MIB   free disk required to build, MiB (default: 5000)
#   KVPOOL_SKIP_VLLM=1     if the disk is too small: say so and exit 0
#                          without building (otherwise: exit 1)
#
# About 2.7 GB installed (0.33.0: 2.3 GB), 1.5 minutes on the 2-core CI
# machine with a warm pip cache (up to 5 when it is shared); from
# KVPOOL_VLLM_ENV_CACHE, 20-30 s.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
usage="usage: .ci/vllm-env.sh [--vllm VERSION] [--no-kvpool] VENV_DIR [KVPOOL_SOURCE]"

version=0.15.1
with_kvpool=1
while [ $# -gt 0 ]; do
    case "$1" in
        --vllm) version=${2:?$usage}; shift 2 ;;
        --vllm=*) version=${1#--vllm=}; shift ;;
        --no-kvpool) with_kvpool=0; shift ;;
        -*) echo "vllm-env: unknown option $1; $usage" >&2; exit 2 ;;
        *) break ;;
    esac
done
venv=${1:?$usage}
src=${2:-$repo}
python=${PYTHON:-python3}
need_mib=${KVPOOL_VLLM_NEED_MIB:-5000}

# VERSIONS: the releases this script builds. Per release: the pinned
# requirements file (installed with dependencies) and what goes in with
# --no-deps because its wheel pins GPU packages or a different torch.
case "$version" in
    0.15.1 | 0.16.0)
        requirements=$repo/tests/vllm/requirements.txt
        no_deps=("vllm==$version" xgrammar==0.1.29) ;;
    0.33.0)
        requirements=$repo/tests/vllm/requirements-0.33.txt
        no_deps=("vllm==$version" xgrammar==0.2.8) ;;
    *)
        echo "vllm-env: no environment for vLLM '$version' (supported: 0.15.1, 0.16.0, 0.33.0)" >&2
        exit 2 ;;
esac

if [ -e "$venv" ]; then
    echo "vllm-env: $venv already exists; give a new path" >&2
    exit 1
fi

started=$SECONDS
step() { echo "vllm-env [$((SECONDS - started))s] $*"; }

tests_name=vLLM
env_name="the vLLM ${version} test environment"
# shellcheck source=env-cache.sh
. "$here/env-cache.sh"

# build_vllm DIR: a venv at DIR with torch, the pinned requirements and vLLM.
build_vllm() {
    local dir=$1 find_links=()
    step "venv: $dir ($("$python" --version 2>&1))"
    "$python" -m venv "$dir"
    step "torch 2.13.0 (CPU build) and the pinned dependencies of $(basename "$requirements")"
    "$dir/bin/python" -m pip --disable-pip-version-check install -q -r "$requirements"
    step "${no_deps[*]}, without their dependencies"
    if [ -n "${VLLM_WHEEL_DIR:-}" ]; then
        find_links=(--find-links "$VLLM_WHEEL_DIR")
    fi
    "$dir/bin/python" -m pip --disable-pip-version-check install -q --no-deps \
        "${find_links[@]}" "${no_deps[@]}"
}

if [ -n "${KVPOOL_VLLM_ENV_CACHE:-}" ]; then
    # The key changes whenever what would be installed changes: the release,
    # the pins (not the comments), the --no-deps list, the interpreter.
    env_cached "$KVPOOL_VLLM_ENV_CACHE/vllm-$version-$(env_key "$version ${no_deps[*]}" "$requirements")" \
        build_vllm "$venv" _kvpool_vllm_env_cache.pth
else
    env_check_disk "$(dirname "$venv")"
    build_vllm "$venv"
fi

if [ "$with_kvpool" = 1 ]; then
    step "kvpool from $src"
    "$venv/bin/python" -m pip --disable-pip-version-check install -q --no-deps "$src"
fi

step "check: vLLM's scheduler side imports on the CPU"
(cd / && VERSION=$version WITH_KVPOOL=$with_kvpool "$venv/bin/python" -W ignore -c '
import importlib, importlib.metadata as md, os
import vllm
for name in ("vllm.v1.core.block_pool", "vllm.v1.core.kv_cache_utils",
             "vllm.v1.core.kv_cache_manager", "vllm.v1.core.kv_cache_coordinator",
             "vllm.v1.core.single_type_kv_cache_manager", "vllm.v1.core.kv_cache_metrics",
             "vllm.distributed.kv_events", "vllm.v1.request", "vllm.plugins",
             "vllm.v1.core.sched.scheduler"):
    importlib.import_module(name)
assert vllm.__version__ == os.environ["VERSION"], vllm.__version__
eps = [ep.value for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "kvpool"]
if os.environ["WITH_KVPOOL"] == "1":
    import kvpool
    print("vllm", vllm.__version__, "| kvpool", kvpool.__version__,
          "core:", "compiled" if kvpool.USING_EXTENSION else "pure-Python",
          "| plugin entry point:", eps or "MISSING")
    assert eps == ["kvpool.vllm:plugin"], eps
else:
    print("vllm", vllm.__version__, "| kvpool: not installed")
    assert not eps, eps
')
step "done: $venv ($(du -sm "$venv" | cut -f1) MiB)"
