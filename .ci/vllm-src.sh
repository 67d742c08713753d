#!/usr/bin/env bash
# The Python source of one vLLM release, from its own release file on the
# package index (pinned by sha256 in tests/vllm_suites/SHA256SUMS): the sdist,
# or the wheel for the releases that have no sdist (0.15.0, 0.15.1). Prints
# the directory that holds the release's `vllm/` package (and, from an sdist,
# its `tests/`), extracted once into the cache and reused.
#
# Every release's scheduler side (vllm.v1.core.*, vllm.v1.request,
# vllm.distributed.kv_events, the scheduler) imports over the 0.33.0 test
# environment's packages (.ci/vllm-env.sh --vllm 0.33.0) with this directory
# first on PYTHONPATH: one 2 GB environment serves all releases, and each
# release costs its ~30 MB of source.
#
# usage: .ci/vllm-src.sh VERSION [PYTHON]
#   PYTHON runs .ci/pypi-fetch.py (default: python3); it needs pip.
# Environment:
#   KVPOOL_VLLM_SRC_CACHE  where the trees are kept (default:
#                          ~/.cache/kvpool/vllm-src, under XDG_CACHE_HOME if set)
#   KVPOOL_PYPI_CACHE      where the release files are kept (pypi-fetch.py)
set -euo pipefail

version=${1:?usage: .ci/vllm-src.sh VERSION [PYTHON]}
python=${2:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
cache=${KVPOOL_VLLM_SRC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpool/vllm-src}
dir=$cache/$version

# A tree is complete once its marker exists; a half-extracted one is redone.
if [ ! -f "$dir/.complete" ]; then
    case "$version" in
        0.15.0 | 0.15.1) kind=x86_64.whl ;;  # no sdist on the index
        *) kind=sdist ;;
    esac
    file=$("$python" "$here/pypi-fetch.py" --pins "$repo/tests/vllm_suites/SHA256SUMS" \
        "vllm==$version" "$kind") || {
        echo "!!!!! vllm-src: could not fetch vLLM $version's release file !!!!!" >&2
        exit 1
    }
    mkdir -p "$cache"
    # (Never removes $dir: only complete trees are moved there, and a step
    # running beside this one may be importing from it -- removing it once
    # made a release's tests import the environment's own vLLM.)
    partial=$(mktemp -d "$dir.partial.XXXXXX")
    trap 'rm -rf "$partial"' EXIT
    if [ "$kind" = sdist ]; then
        tar xzf "$file" -C "$partial" --strip-components=1 "vllm-$version/vllm" "vllm-$version/tests"
    else
        # Only the Python: the wheel's compiled CUDA libraries are not used on
        # the scheduler side and are most of its size.
        "$python" - "$file" "$partial" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extractall(sys.argv[2], [n for n in wheel.namelist()
                                   if n.startswith("vllm/") and not n.endswith(".so")])
PY
    fi
    if [ ! -f "$partial/vllm/_version.py" ] || ! grep -q "$version" "$partial/vllm/_version.py"; then
        echo "!!!!! vllm-src: vLLM $version's release file holds no vllm/_version.py of $version !!!!!" >&2
        exit 1
    fi
    touch "$partial/.complete"
    mv -T "$partial" "$dir" 2> /dev/null || rm -rf "$partial"  # a concurrent run won
    trap - EXIT
    if [ ! -f "$dir/.complete" ]; then
        echo "!!!!! vllm-src: $dir is not a complete tree (left by an older run?): remove it !!!!!" >&2
        exit 1
    fi
fi
echo "$dir"
