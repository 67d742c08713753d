#!/usr/bin/env bash
# Run vLLM's own pool tests, from the release's source distribution, twice in
# a vLLM environment: with vLLM's classes (stock) and with kvpool's put in
# their place (tests/vllm_suites/kvpool_swap.py), then check the rule of the
# docs/vllm-integration.md, "vLLM's own tests" (tests/vllm_suites/compare.py): every test
# that passes stock passes with kvpool, but for the listed exceptions.
#
# usage: .ci/vllm-own-tests.sh VERSION PYTHON [REPO]
#   VERSION  0.16.0 or 0.33.0; PYTHON: the environment's interpreter, with
#   kvpool installed. The sdist is pinned by checksum
#   (tests/vllm_suites/SHA256SUMS) and cached in ${KVPOOL_PYPI_CACHE:-~/.cache/kvpool/pypi}
#   by .ci/pypi-fetch.py. No network, or a file that differs from its pin:
#   a loud failure.
set -euo pipefail

version=${1:?usage: .ci/vllm-own-tests.sh VERSION PYTHON [REPO]}
python=${2:?usage: .ci/vllm-own-tests.sh VERSION PYTHON [REPO]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "${3:-$(dirname "$here")}" && pwd)
suites=$repo/tests/vllm_suites
sdist=vllm-$version.tar.gz

# The pool-related test files of each release (tests that need a served
# model are left out: tests/v1/core/prefix_cache/test_hybrid_prefix_cache_hit_rate.py).
# What is extracted: 0.16.0's tests/conftest.py imports vLLM's server
# stack, which these tests do not need, so only tests/v1/core; 0.33.0's
# tests import helpers from elsewhere in tests/, so all of it.
case "$version" in
    0.16.0) extract="vllm-$version/tests/v1/core"
        files="test_prefix_caching.py test_kv_cache_utils.py test_single_type_kv_cache_manager.py test_kv_cache_metrics.py" ;;
    0.33.0) extract="vllm-$version/tests"
        files="test_prefix_caching.py test_kv_cache_utils.py test_single_type_kv_cache_manager.py test_kv_cache_metrics.py test_deferred_block_free.py prefix_cache/test_partial_prefix_cache_hits.py prefix_cache/test_partial_prefix_cache_primitives.py prefix_cache/test_mamba_eagle_resume_checkpoint.py" ;;
    *) echo "vllm-own-tests: no suite for vLLM '$version'" >&2; exit 2 ;;
esac

# pypi-fetch.py looks the sdist up as pip would and downloads it with pip's
# own session, without running vLLM's build (which `pip download` of an sdist
# does, and which cannot run here); it checks the pin and fails loudly.
sdist_path=$("$python" "$here/pypi-fetch.py" --pins "$suites/SHA256SUMS" "vllm==$version" sdist) || {
    echo "!!!!! vllm-own-tests: could not fetch $sdist !!!!!" >&2
    exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-vllm-own.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar xzf "$sdist_path" -C "$work" "$extract"
cd "$work/vllm-$version"
paths=()
for f in $files; do paths+=("tests/v1/core/$f"); done

status=0
for mode in stock kvpool; do
    swap=1
    [ "$mode" = stock ] && swap=0
    started=$SECONDS
    # The tests import `tests.*` from the sdist's root (the working
    # directory); the plugin comes from this repository.
    # Offline: the tests that want a model from a hub fail at once, in both
    # runs alike, instead of trying the network.
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    KVPOOL_SWAP=$swap PYTHONPATH="$work/vllm-$version:$suites${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest \
        -p kvpool_swap -p no:cacheprovider -q --no-header -o addopts="" \
        --junitxml="$work/$mode.xml" "${paths[@]}" > "$work/$mode.log" 2>&1 || true
    echo "   vLLM $version's own tests, $mode: $(tail -n 1 "$work/$mode.log") ($((SECONDS - started))s)"
    if [ ! -s "$work/$mode.xml" ]; then
        tail -n 30 "$work/$mode.log"
        echo "!!!!! vllm-own-tests: the $mode run wrote no results !!!!!" >&2
        exit 1
    fi
done
"$python" "$suites/compare.py" "$version" "$work/stock.xml" "$work/kvpool.xml" || status=$?
exit "$status"
