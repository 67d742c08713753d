#!/usr/bin/env bash
# Run vLLM's own pool tests, from the release's source distribution, twice:
# with vLLM's classes (stock) and with kvpool's put in their place by the
# pytest plugin tests/vllm_suites/kvpool_swap.py (the pool of the release's
# kvpool line, kvpool.vllm.vllm_line, and for a line with a manager, 0.30-0.34,
# its KVCacheManager too, as kvpool.vllm.install() puts them in), then check the rule of
# docs/compatibility.md (tests/vllm_suites/compare.py): every test that
# passes stock passes with kvpool, but for the listed exceptions
# (tests/vllm_suites/exceptions.txt), and every listed exception still holds.
#
# usage: .ci/vllm-own-tests.sh VERSION PYTHON [REPO]
#   VERSION  a release with a suite below (0.16.0 ... 0.34.0, and a later 0.3x that
#            tools/intake.py adds to a line; 0.15.x has no tests).
#   PYTHON   an interpreter in which the release's scheduler side imports
#            with the release's tree first on PYTHONPATH, and kvpool imports
#            (installed, or on the caller's PYTHONPATH): the vLLM 0.33.0
#            environment serves every release (.ci/vllm-env.sh --vllm 0.33.0).
# The release's tree (vllm/ and tests/) is the one .ci/vllm-src.sh keeps,
# pinned by checksum (tests/vllm_suites/SHA256SUMS); it is only read.
# Environment:
#   KVPOOL_OWN_SKIP_MISSING=1  a release without a kvpool line is skipped
#                              (said loudly) instead of failing.
#   KVPOOL_OWN_MODES           "stock kvpool" (default), or "stock" alone to
#                              see what passes with vLLM's own pool.
#   KVPOOL_OWN_JOBS            2 (default): the stock and kvpool runs at the
#                              same time; 1: one after the other.
#   KVPOOL_OWN_RESULTS=DIR     keep each run's log and JUnit XML there
#                              (DIR/VERSION-MODE.log, .xml).
#   KVPOOL_VLLM_MANAGER=0      the kvpool run keeps vLLM's KVCacheManager (over
#                              kvpool's pool), as with kvpool.vllm.install().
#   KVPOOL_VLLM_INTAKE=VERSION=LISTED  (tools/intake.py) VERSION runs as a
#                              release of LISTED's line: LISTED's test files,
#                              line and exceptions.
#   KVPOOL_OWN_TIMEOUT         seconds one pytest run may take (default 600; a
#                              run takes 20-100 s): a manager that never finds
#                              room makes scheduler tests loop (`while
#                              scheduler.waiting: schedule()`), which would
#                              otherwise hang CI. A test running over 120 s
#                              gets its stack in the log (faulthandler).
# With kvpool's manager in, the kvpool run must have built no manager of
# vLLM's own class and taken kvpool's compiled allocate_slots path at least
# once (the plugin's "kvpool_swap: manager ..." line, fast=N): otherwise the
# run fails, so that the manager cannot pass vacuously.
# The last line of the output is one summary line: the release, its number
# of test files and tests, how many pass stock and with kvpool, the listed
# exceptions, the manager's compiled calls (mgr_fast=, "-" without kvpool's
# manager), the time, and whether the rule holds.
set -euo pipefail

version=${1:?usage: .ci/vllm-own-tests.sh VERSION PYTHON [REPO]}
python=${2:?usage: .ci/vllm-own-tests.sh VERSION PYTHON [REPO]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "${3:-$(dirname "$here")}" && pwd)
suites=$repo/tests/vllm_suites
modes=${KVPOOL_OWN_MODES:-stock kvpool}
jobs=${KVPOOL_OWN_JOBS:-2}
limit=${KVPOOL_OWN_TIMEOUT:-600}
started=$SECONDS

# A 0.3x release after 0.34 (added by tools/intake.py, which ran these files
# for it) runs 0.34's files.
# The pool-related test files of each release 0.16.0-0.34.0 (0.15.x has no
# sdist, so no tests), under tests/v1/core: the pool, its blocks, queue and
# map (test_prefix_caching, test_kv_cache_utils), the managers that drive it
# (test_single_type_kv_cache_manager; from 0.24 deferred frees and
# partial-block hashes; from 0.26 the partial-hit search and SWA frees in
# flight; from 0.27 Mamba chunk alignment; from 0.29 the packed layout's
# managers; from 0.30 Mamba/EAGLE checkpoints) and its metrics. Each file
# is listed from the first release that has it (and, for
# test_contiguous_kv_packing, builds a manager in it). From 0.30, where
# kvpool has a KVCacheManager, also test_scheduler.py: the scheduler driving
# the manager (about 10-40 s of CPU a release for both runs, 170-280 tests),
# from 0.31 test_prefix_replay.py's replays of cached prefixes; on every
# release that has them (from 0.16; the pool alone before 0.30), vLLM's
# AsyncScheduler driving the manager a step ahead of its outputs
# (test_async_scheduler.py), priority scheduling and its preemptions
# (test_priority_*.py: the random blast's 12 tests build Qwen2.5-VL, a
# multimodal model vLLM inspects by importing its module, which needs
# torchvision, as llava below: they fail stock, counted as wanting a hub)
# and the worker's slot overflow checks (0.25 on),
# and the scheduler-side KV-connector tests under tests/v1/kv_connector/unit
# (remote prefill and decode lifecycles, failed loads and their recovery,
# invalid blocks, error propagation: external tokens, delayed caching and
# evictions through the manager; about 40 tests, 10-30 s).
# Left out, with vLLM's pool too they need what this run does not have, or
# are not about the pool:
#   test_scheduler.py before 0.30 (no kvpool manager to test there),
#   test_scheduler.py's multimodal tests (llava-hf/llava-1.5-7b-hf) fail
#     stock: see tests/vllm_suites/hf_hub_cache.py;
#   test_scheduler_e2e.py, test_reset_prefix_cache_e2e.py,
#   prefix_cache/test_hybrid_prefix_cache_hit_rate.py: serve a model;
#   test_kv_sharing.py, test_kv_cache_planning.py, test_kv_cache_config_builder.py,
#   test_encoder_cache_manager.py, test_output.py, test_repetition_detection.py,
#   and test_contiguous_kv_packing.py before 0.29: no pool in them.
# Within the listed files, the tests that build a model config from a hub
# other than facebook/opt-125m's (Qwen/..., llava-hf/...) fail stock too
# (offline) and are out of scope: compare.py counts them.
# The release the intake is deciding about (KVPOOL_VLLM_INTAKE=VERSION=LISTED,
# tools/intake.py) runs LISTED's files: the tests of the line it would join.
suite_version=$version
intake=${KVPOOL_VLLM_INTAKE:-}
if [ -n "$intake" ] && [ "${intake%%=*}" = "$version" ]; then
    suite_version=${intake#*=}
fi
files="test_prefix_caching.py test_kv_cache_utils.py test_single_type_kv_cache_manager.py test_kv_cache_metrics.py"
case "$suite_version" in
    # vLLM's schedulers over kvpool's pool (and, 0.30 on, its manager), where
    # the release has the test files.
    0.1[6-9].* | 0.2[0-9].* | 0.3[0-9].*)
        files="$files test_async_scheduler.py test_priority_scheduler_random.py" ;;&
    0.2[5-9].* | 0.3[0-9].*) files="$files test_worker_slot_overflow.py" ;;&
    0.2[89].* | 0.3[0-9].*) files="$files test_priority_preemption_bug.py" ;;&
    0.2[4-9].* | 0.3[0-9].*)
        files="$files test_deferred_block_free.py prefix_cache/test_partial_prefix_cache_primitives.py" ;;&
    0.2[6-9].* | 0.3[0-9].*)
        files="$files prefix_cache/test_partial_prefix_cache_hits.py test_swa_inflight_window_free.py" ;;&
    0.2[7-9].* | 0.3[0-9].*) files="$files test_mamba_align_chunk_split.py" ;;&
    0.29.* | 0.3[0-9].*) files="$files test_contiguous_kv_packing.py" ;;&
    0.3[1-9].*) files="$files test_prefix_replay.py" ;;&
    0.3[0-9].*) files="$files prefix_cache/test_mamba_eagle_resume_checkpoint.py test_scheduler.py"
        for f in remote_prefill_lifecycle remote_decode_lifecycle kv_load_failure_recovery \
                 invalid_blocks_correctness error_propagation; do
            files="$files ../kv_connector/unit/test_$f.py"
        done ;;&
    0.1[6-9].* | 0.2[0-9].* | 0.3[0-9].*) ;;
    *) echo "!!!!! vllm-own-tests: no suite for vLLM '$version' !!!!!" >&2; exit 2 ;;
esac
nfiles=$(wc -w <<< "$files")

summary() {  # the last line of the output, for .ci/vllm-own-all.sh
    echo "vllm-own-tests: $version files=$nfiles $* time=$((SECONDS - started))s"
}

# No kvpool line for the release: a loud failure (or, when told, a loud skip).
# Else whether the kvpool run puts kvpool's manager in (the plugin decides
# the same way): "manager" or "none"; "no-core" if the line has a manager
# but the kvpool the tests import has no compiled core. Asked from a neutral
# directory, so that the kvpool is the one the tests import (the
# environment's, or PYTHONPATH's), not a source checkout in the current
# directory: from CI's unbuilt checkout that answered "none", and vLLM's
# own tests ran without kvpool's manager.
if [[ " $modes " == *" kvpool "* ]] && ! manager=$(cd / && "$python" -c '
import os
import sys
import kvpool
from kvpool.vllm import UnsupportedVLLMVersionError, vllm_line
from kvpool.vllm.manager import manager_enabled
try:
    line = vllm_line(sys.argv[1])
except UnsupportedVLLMVersionError:
    sys.exit(1)
if line.manager is None or not manager_enabled():
    print("none")
elif kvpool.USING_EXTENSION:
    print("manager")
elif os.environ.get("KVPOOL_NO_EXTENSIONS", "").strip() not in ("", "0"):
    print("none")  # asked for: the pure-Python core has no manager paths
else:
    print("no-core " + os.path.dirname(kvpool.__file__))' "$version"); then
    if [ "${KVPOOL_OWN_SKIP_MISSING:-}" = 1 ]; then
        echo "!!!!! vllm-own-tests: no kvpool line for vLLM $version: SKIPPED (KVPOOL_OWN_SKIP_MISSING=1) !!!!!" >&2
        summary "SKIPPED (no kvpool line)"
        exit 0
    fi
    echo "!!!!! vllm-own-tests: no kvpool line for vLLM $version (kvpool.vllm.VLLM_LINES) !!!!!" >&2
    summary "FAILED (no kvpool line)"
    exit 1
fi

if [[ "${manager:-}" == no-core* ]]; then
    echo "!!!!! vllm-own-tests: vLLM $version's line has kvpool's manager, but the kvpool" \
        "the tests import (${manager#no-core }) has no compiled core !!!!!" >&2
    summary "FAILED (no compiled core: kvpool's manager cannot be in)"
    exit 1
fi

tree=$(bash "$here/vllm-src.sh" "$version" "$python") || {
    echo "!!!!! vllm-own-tests: no source tree for vLLM $version (.ci/vllm-src.sh) !!!!!" >&2
    exit 1
}
# The release's tree first: its vllm/ shadows the environment's. The plugin
# comes from this repository.
pythonpath="$tree:$suites${PYTHONPATH:+:$PYTHONPATH}"
found=$(PYTHONPATH=$pythonpath "$python" -c 'import vllm; print(vllm.__version__)' 2> /dev/null) || true
if [ "$found" != "$version" ]; then
    echo "!!!!! vllm-own-tests: vLLM '$found' imported, not $version's tree ($tree) !!!!!" >&2
    exit 1
fi

paths=()
for f in $files; do
    f=tests/v1/core/$f
    f=${f//core\/..\//}  # (tests/v1/core/../kv_connector/... -> tests/v1/kv_connector/...)
    if [ ! -f "$tree/$f" ]; then
        echo "!!!!! vllm-own-tests: vLLM $version has no $f !!!!!" >&2
        exit 1
    fi
    paths+=("$f")
done
work=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-vllm-own.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The model configurations the scheduler tests build from, in a hub cache of
# their own (tests/vllm_suites/hf_hub_cache.py): facebook/opt-125m's
# config.json, all that vLLM's ModelConfig reads of it offline.
"$python" "$suites/hf_hub_cache.py" "$work/hf" > /dev/null

run() {  # MODE: one pytest run, its JUnit XML and log in $work
    local mode=$1 swap=1 t0=$SECONDS rc=0
    [ "$mode" = stock ] && swap=0
    # From the tree's root, for the tests' `import tests.*`, which is only
    # read: no byte code, no pytest cache. --confcutdir leaves out vLLM's
    # tests/conftest.py, which imports vLLM's server stack (not needed by
    # these tests; its autouse fixtures reset HTTP clients, dynamo and GPU
    # memory). Offline, over the hub cache above: the tests that want another
    # model from a hub fail at once, in both runs alike, instead of trying
    # the network. VLLM_TARGET_DEVICE=cpu: vLLM's platform is this machine's
    # (else a scheduler's config fails with "Failed to infer device type").
    (cd "$tree" && PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        HF_HOME="$work/hf" VLLM_TARGET_DEVICE=cpu \
        KVPOOL_SWAP=$swap PYTHONPATH=$pythonpath timeout "$limit" "$python" -m pytest \
        -p kvpool_swap -p cpu_without_triton -p no:cacheprovider -q -o addopts="" -o faulthandler_timeout=120 \
        --confcutdir="$tree/tests/v1" --junitxml="$work/$mode.xml" "${paths[@]}") \
        > "$work/$mode.log" 2>&1 || rc=$?
    if [ "${rc:-0}" = 124 ]; then  # no XML: reported as a run that wrote no results
        echo "!!!!! vllm-own-tests: the $mode run of vLLM $version timed out after ${limit}s" \
            "(KVPOOL_OWN_TIMEOUT); where its slow test was, in the tests:" \
            "$(sed -n '/Timeout (0:/,$p' "$work/$mode.log" | grep -m 3 '/tests/' | tr -s ' ' | tr '\n' ';') !!!!!" >&2
        rm -f "$work/$mode.xml"
        printf "\ntimed out after %ss\n" "$limit" >> "$work/$mode.log"
    fi
    echo "   vLLM $version's own tests, $mode: $(tail -n 1 "$work/$mode.log") ($((SECONDS - t0))s)"
    grep -m 1 '^kvpool_swap: ' "$work/$mode.log" | cut -c 1-200 || true
    grep -m 1 '^kvpool_swap: manager ' "$work/$mode.log" || true
}

if [ "$jobs" = 1 ]; then
    for mode in $modes; do run "$mode"; done
else
    for mode in $modes; do run "$mode" & done
    wait
fi
for mode in $modes; do
    if [ ! -s "$work/$mode.xml" ]; then
        tail -n 30 "$work/$mode.log"
        echo "!!!!! vllm-own-tests: the $mode run of vLLM $version wrote no results !!!!!" >&2
        summary "FAILED (the $mode run wrote no results)"
        exit 1
    fi
done

# kvpool's manager, when in: no manager of vLLM's class built, and its
# compiled path taken.
mgr_fast=-
if [ "${manager:-none}" = manager ] && [ -s "$work/kvpool.xml" ]; then
    said=$(grep -m 1 '^kvpool_swap: manager ' "$work/kvpool.log" || true)
    mgr_fast=$(sed -n 's/.* fast=\([0-9]*\) .*/\1/p' <<< "$said")
    vllm_own=$(sed -n 's/.*vllm_own=\([0-9]*\).*/\1/p' <<< "$said")
    if [ -z "$mgr_fast" ] || [ "$mgr_fast" = 0 ] || [ "${vllm_own:-1}" != 0 ]; then
        echo "!!!!! vllm-own-tests: kvpool's manager was to be in vLLM $version's kvpool run," \
            "but: ${said:-no 'kvpool_swap: manager' line} !!!!!" >&2
        summary "FAILED (kvpool's manager not used: fast=${mgr_fast:-?} vllm_own=${vllm_own:-?})"
        exit 1
    fi
fi

if [ "$modes" = stock ]; then
    "$python" "$suites/compare.py" "$version" "$work/stock.xml" > "$work/compare.txt" || true
else
    status=0
    "$python" "$suites/compare.py" "$version" "$work/stock.xml" "$work/kvpool.xml" > "$work/compare.txt" || status=$?
fi
cat "$work/compare.txt"
if [ -n "${KVPOOL_OWN_RESULTS:-}" ]; then
    mkdir -p "$KVPOOL_OWN_RESULTS"
    for mode in $modes; do
        cp "$work/$mode.log" "$KVPOOL_OWN_RESULTS/$version-$mode.log"
        cp "$work/$mode.xml" "$KVPOOL_OWN_RESULTS/$version-$mode.xml"
    done
fi
said=$(tail -n 1 "$work/compare.txt" | sed 's/^summary: //')  # COUNTS: VERDICT
summary "${said%%:*} mgr_fast=$mgr_fast:${said#*:}"
exit "${status:-0}"
