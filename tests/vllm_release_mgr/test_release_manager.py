"""Differential tests for any vLLM release: the release's own
``KVCacheManager``, built and called as that release's ``Scheduler`` does,
over vLLM's own ``BlockPool`` and over kvpool's pool of the release's line
(``kvpool.vllm.vllm_line(vllm.__version__)``), must make identical decisions
and publish identical bytes.

The driver is chosen from the release's API: ``tests/vllm/vllm_workload.py``
for the releases whose ``get_computed_blocks`` returns two values (0.15.0 to
0.25.x), ``tests/vllm33/vllm_workload33.py`` from 0.26.0
(``vllm_workload.DRIVER_SPLIT``); each detects the rest of its range's
differences itself. What is compared is what those drivers record (see their
docstrings and ``tests/vllm/test_vllm_manager.py``).

Three checks per release:

- vLLM against itself: a second run over vLLM's own pool class, put in
  through the same names kvpool's pool is, gives the same trace (the driver is
  deterministic and the swap reaches the pool the manager builds);
- kvpool against vLLM, over each core: skipped where kvpool has no line for
  the release;
- a deliberately broken pool (vLLM's, and kvpool's where it has a line) is
  caught, and the report names the first difference.

``KVPOOL_MGR_SCALE`` (default 1) scales every workload's request count, so a
CI run over all releases fits its time (``.ci/vllm-mgr-all.sh``); the
``mamba-cow`` workload is never scaled below its own size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
from collections.abc import Iterator
from types import ModuleType

import msgspec
import pytest
import vllm
import vllm_workload as vw15
from _manager_trace import counters, events_broken, first_difference, free_order_broken
from _vllm_helpers import pool_in_vllm
from vllm.distributed import kv_events as vllm_kv_events
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core import kv_cache_coordinator
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1 import kv_cache_interface as vllm_kv_cache_interface

import kvpool.vllm as kv_vllm
from kvpool.vllm import vllm_block_pool_class

RELEASE = vllm.__version__
LATE_DRIVER = hasattr(KVCacheManager, vw15.DRIVER_SPLIT)
vw = importlib.import_module("vllm_workload33" if LATE_DRIVER else "vllm_workload")
SCALE = float(os.environ.get("KVPOOL_MGR_SCALE", "1"))


def _n(num_requests: int, least: int = 40) -> int:
    return max(least, round(num_requests * SCALE))


# Half the blocks of the drivers' default pool: preemptions and evictions even
# in the shortest runs.
NUM_BLOCKS = 1024

WORKLOADS = {
    "full": vw.FULL.scaled(num_requests=_n(600), num_blocks=NUM_BLOCKS),
    "full+sliding": vw.HYBRID.scaled(  # metrics collector on
        num_requests=_n(400), num_blocks=NUM_BLOCKS
    ),
    "sliding-only": vw.HYBRID.scaled(  # vLLM's unitary coordinator over a window
        name="a sliding window alone",
        groups=(vw.Group("sliding", 16, sliding_window=128),),
        num_requests=_n(300),
        # (a window frees its early blocks: fewer blocks for the same pressure)
        num_blocks=NUM_BLOCKS // 4,
    ),
    "full32+sliding16": vw.MIXED_BLOCK_SIZES.scaled(
        num_requests=_n(400), num_blocks=NUM_BLOCKS
    ),
    "full-bytes-hashes": vw.FULL.scaled(
        name="full, raw-bytes event hashes",
        num_requests=_n(300),
        num_blocks=NUM_BLOCKS,
    ),
    "no-prefix-caching": vw.FULL.scaled(
        name="prefix caching off",
        enable_caching=False,
        num_requests=_n(300),
        num_blocks=NUM_BLOCKS,
    ),
}
if LATE_DRIVER:
    WORKLOADS["shared-running-prefix"] = vw.FULL.scaled(
        name="hits on a prefix shared with running requests",
        num_requests=_n(250),
        num_prefixes=6,
        arrivals_per_step=2,
        num_blocks=400,
        metrics_sample_rate=0.5,
    )
    # Speculative decoding (drafts scheduled with each decode step, accepted
    # at random until the first rejection, the rest rolled back) and a KV
    # connector (external tokens past the local hit -- its store keeps every
    # finished prompt; resets between phases and evictions make it the only
    # hit -- synchronous and asynchronous loads, failed loads whose blocks
    # are evicted, loads aborted): (base, requests, name, changes).
    eagle = {"spec_tokens": 3, "eagle": True}
    connector = {"connector": True, "phases": 3}
    for key, base, n, name, changes in (
        ("eagle", vw.FULL, 300, "EAGLE, 3 drafts (lookahead 3, last hit block dropped)", eagle),
        ("eagle-1", vw.FULL, 200, "EAGLE, 1 draft", {"spec_tokens": 1, "eagle": True}),
        # Every third prompt repeats the one before: whole-prompt hits, where
        # the line's EAGLE margin decides the hit of a block-aligned prompt.
        ("eagle+sliding", vw.HYBRID, 300, "EAGLE, 3 drafts, full + sliding window",
         {**eagle, "repeat_every": 3}),
        ("mtp", vw.FULL, 200, "multi-module MTP, 3 drafts (3 prefill lookahead tokens)",
         {**eagle, "multi_module_mtp": True}),
        ("ngram", vw.FULL, 200, "n-gram drafts (4, no lookahead)",
         {"spec_tokens": 4, "accept_rate": 0.4}),
        ("connector", vw.FULL, 300,
         "KV connector: external tokens, async, failed and aborted loads", connector),
        # A mixed-precision cache: new blocks are recorded for zeroing, but
        # not the external ones an asynchronous load writes.
        ("connector+sliding", vw.HYBRID, 300,
         "KV connector, full + sliding window of another dtype (blocks zeroed)",
         {**connector, "groups": (vw.Group("full", 16),
                                  vw.Group("sliding", 16, sliding_window=128, dtype="bfloat16"))}),
        ("connector+eagle", vw.FULL, 200, "KV connector with EAGLE (3 drafts)",
         {**connector, **eagle}),
    ):
        WORKLOADS[key] = base.scaled(name=name, num_requests=_n(n), num_blocks=NUM_BLOCKS, **changes)
    # One sliding-window group alone (vLLM's unitary coordinator), with
    # EAGLE: the window's extra contiguous block, then dropped.
    WORKLOADS["eagle+sliding-only"] = WORKLOADS["sliding-only"].scaled(
        name="EAGLE, 3 drafts, a sliding window alone", num_requests=_n(200), **eagle
    )
    # R-SWA (reference sliding window, Unlimited-OCR's attention): full
    # attention whose blocks between the prompt and the last 64 processed
    # tokens are freed as decoding goes on (nulls in the middle of a table);
    # alone, and under EAGLE (in-flight drafts hold the window back).
    WORKLOADS["rswa"] = vw.FULL.scaled(
        name="R-SWA: the gap between prompt and window freed",
        groups=(vw.Group("rswa", 16, sliding_window=64),),
        num_requests=_n(300),
        num_blocks=NUM_BLOCKS // 2,
    )
    WORKLOADS["eagle+rswa"] = WORKLOADS["rswa"].scaled(
        name="EAGLE, 3 drafts, R-SWA", num_requests=_n(200), **eagle
    )
    # Chunked local attention beside full attention (Llama 4): the blocks
    # before the current 64-token chunk are freed at each chunk boundary;
    # its lookup is vLLM's (nulls before the current chunk, then a forward
    # scan). With a KV connector too: the external tokens a chunk skipped.
    chunked = {"groups": (vw.Group("full", 16), vw.Group("chunked", 16, sliding_window=64))}
    WORKLOADS["full+chunked"] = vw.HYBRID.scaled(
        name="full + chunked local attention", num_requests=_n(300), num_blocks=NUM_BLOCKS,
        **chunked,
    )
    WORKLOADS["connector+chunked"] = vw.HYBRID.scaled(
        name="KV connector, full + chunked local attention", num_requests=_n(300),
        num_blocks=NUM_BLOCKS, **connector, **chunked,
    )
    # An encoder-decoder model (Whisper's decoder): full self-attention and
    # cross-attention over each request's 16-400 encoder tokens, allocated
    # when it is admitted (again after a preemption); prefix caching off, as
    # vLLM runs these models (its coordinator without prefix caching).
    WORKLOADS["full+cross"] = vw.FULL.scaled(
        name="encoder-decoder: full + cross-attention, prefix caching off",
        groups=(vw.Group("full", 16), vw.Group("cross", 16)),
        enable_caching=False, encoder_tokens=(16, 400),
        # (prompts in chunks: the admission check, over the whole prompt,
        # is not the per-step one)
        token_budget=256,
        num_requests=_n(300), num_blocks=NUM_BLOCKS // 2,
    )
    # A hybrid of full attention and Mamba with prefix caching off
    # (mamba_cache_mode "none"): one state block per request as vLLM sizes
    # it (the model's length), held to the end. With MTP, the state's
    # speculative blocks too, and a Mamba block smaller than the model
    # length, so that each block behind the last token is freed as the
    # request passes it.
    mamba_none = {"enable_caching": False, "token_budget": 256}
    WORKLOADS["full+mamba"] = vw.FULL.scaled(
        name="hybrid: full attention + Mamba, prefix caching off",
        groups=(vw.Group("full", 16), vw.Group("mamba", vw.FULL.max_model_len, mamba_mode="none")),
        num_requests=_n(300), num_blocks=NUM_BLOCKS, **mamba_none,
    )
    WORKLOADS["mtp+mamba"] = vw.FULL.scaled(
        name="MTP (3 drafts): full attention + Mamba of 64-token blocks, prefix caching off",
        groups=(vw.Group("full", 16),
                vw.Group("mamba", 64, mamba_mode="none", speculative_blocks=3)),
        # (Mamba's blocks freed as it goes: fewer blocks for the same pressure)
        num_requests=_n(300), num_blocks=NUM_BLOCKS // 2, **mamba_none, **eagle,
    )
    # ... and a KV connector's external tokens, of which the Mamba group
    # keeps the last one's state only.
    WORKLOADS["connector+mamba"] = WORKLOADS["mtp+mamba"].scaled(
        name="KV connector: full attention + Mamba of 64-token blocks, prefix caching off",
        spec_tokens=0, eagle=False, **connector,
        groups=(vw.Group("full", 16), vw.Group("mamba", 64, mamba_mode="none")),
    )
    # A compressor's circular buffer beside full attention (DeepSeek-V4.1,
    # Qwen4-exp, Step5): one ring block a request, claimed when it is
    # admitted (and for a KV connector's external tokens), never cached.
    # (0.29 on: the spec is new in 0.29.0)
    if hasattr(vllm_kv_cache_interface, "CircularBufferSpec"):
        ring = {"groups": (vw.Group("full", 16), vw.Group("ring", 64))}
        WORKLOADS["full+ring"] = vw.HYBRID.scaled(
            name="full + a circular buffer", num_requests=_n(300), num_blocks=NUM_BLOCKS,
            **ring)
        WORKLOADS["connector+ring"] = vw.HYBRID.scaled(
            name="KV connector, full + a circular buffer", num_requests=_n(300),
            num_blocks=NUM_BLOCKS, **connector, **ring)
        # ... with multi-module MTP: the hybrid coordinator's cacheable
        # tokens rounded down to the ring's 64-token scheduler block, an
        # EAGLE group's one block further within its finalized tokens; the
        # full-attention group's caching steps done in C.
        WORKLOADS["mtp+full+ring"] = vw.HYBRID.scaled(
            name="multi-module MTP, full + a circular buffer", num_requests=_n(200),
            num_blocks=NUM_BLOCKS, **ring, **eagle, multi_module_mtp=True)
        if vw.HASH_LOOKAHEAD:
            # ... with lookahead block hashes (0.33 on): a group caches no
            # further than the request's hashed tokens.
            WORKLOADS["eagle-lookahead+full+ring"] = vw.HYBRID.scaled(
                name="EAGLE, lookahead block hashes, full + a circular buffer",
                num_requests=_n(200), num_blocks=NUM_BLOCKS, **ring, **eagle,
                hash_lookahead=True)
        # ... beside full attention and a sliding window, the ring's block
        # the hash block: the lookup is the simple hybrid's, the ring left
        # out (with EAGLE's drop, and the window's extra block).
        WORKLOADS["eagle+sliding+ring"] = vw.HYBRID.scaled(
            name="EAGLE, full + sliding window + a circular buffer", num_requests=_n(200),
            num_blocks=NUM_BLOCKS, **eagle,
            groups=(*vw.HYBRID.groups, vw.Group("ring", vw.HYBRID.groups[0].block_size)))
    if hasattr(vllm_kv_cache_interface, "KpoolTailSpec"):  # 0.30, 0.31
        WORKLOADS["full+kpool-tail"] = WORKLOADS["full+ring"].scaled(
            name="full + a kpool tail (a circular buffer over a sliding-window spec)",
            groups=(vw.Group("full", 16), vw.Group("kpool-tail", 64)))
    if vw.HASH_LOOKAHEAD:
        # 0.33 on, the engine's default for the EAGLE family (prefix caching
        # on, no connector): lookahead block hashes, no EAGLE drop, each
        # stored block's lookahead tokens in its event.
        for key, base, n, name, changes in (
            ("eagle-lookahead-hashes", vw.FULL, 300, "EAGLE, 3 drafts, lookahead block hashes (1)",
             eagle),
            ("mtp-lookahead-hashes", vw.FULL, 200,
             "multi-module MTP, 3 drafts, lookahead block hashes (3)",
             {**eagle, "multi_module_mtp": True}),
            ("eagle+sliding-lookahead-hashes", vw.HYBRID, 200,
             "EAGLE, full + sliding window, lookahead block hashes", eagle),
        ):
            WORKLOADS[key] = base.scaled(name=name, num_requests=_n(n), num_blocks=NUM_BLOCKS,
                                         hash_lookahead=True, **changes)
    # Full attention and a sliding window, each of four hash blocks, fed
    # in chunks of one hash block: a prompt's tail registered as a partial
    # key of its block on a step that fills no block (then checked in C on
    # every later step).
    WORKLOADS["full64+sliding64-small-chunks"] = vw.HYBRID.scaled(
        name="full + sliding window of 64-token blocks, 16-token hash blocks, small chunks",
        groups=(vw.Group("full", 64), vw.Group("sliding", 64, sliding_window=128)),
        hash_block_size=16, token_budget=16, num_requests=_n(400), num_prefixes=6,
        arrivals_per_step=2, num_blocks=NUM_BLOCKS // 16)
    if vw.HASH_LOOKAHEAD:
        # ... with multi-module MTP and lookahead block hashes (0.33 on): the
        # request's hashes trail its tokens by 3, and the tail's boundary
        # stops at them (a boundary past them must go to vLLM's code).
        WORKLOADS["mtp-lookahead+full64+sliding64-small-chunks"] = WORKLOADS[
            "full64+sliding64-small-chunks"].scaled(
            name="multi-module MTP, lookahead block hashes, full + sliding window of "
                 "64-token blocks, small chunks",
            hash_lookahead=True, token_budget=32, num_blocks=40, **eagle, multi_module_mtp=True)
    # Two full-attention groups of one block size and different specs (an
    # EAGLE draft whose layers differ from the target's): the hybrid
    # coordinator's caching step fills a block in both at once, each cached
    # in C.
    WORKLOADS["eagle+draft-spec"] = vw.HYBRID.scaled(
        name="EAGLE, full attention + a draft's full attention of another spec",
        groups=(vw.Group("full", 16), vw.Group("full", 16, dtype="bfloat16")),
        num_requests=_n(200), num_blocks=NUM_BLOCKS, **eagle)
    WORKLOADS["mamba-cow"] = vw.FULL.scaled(
        name="full attention + Mamba align: partial hits, copy-on-write",
        groups=(vw.Group("full", 64), vw.Group("mamba", 64)),
        hash_block_size=16,
        # Not scaled down: with fewer requests no partial hit is copied on
        # write, and the workload's own check (cow_copies > 0) fails.
        num_requests=_n(300, least=300),
        num_prefixes=6,
        arrivals_per_step=2,
        repeat_every=3,
        # A pool tight enough that admissions are refused by a block: a
        # count short of a partial hit's copy-on-write block shows.
        num_blocks=150,
        metrics_sample_rate=0.5,
    )

if LATE_DRIVER and {"num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment"} <= {
        f.name for f in dataclasses.fields(vllm_kv_cache_interface.MambaSpec)}:
    # (0.30 on: MambaSpec's prefill-checkpoint blocks and their alignment)
    # Mamba "align" beside full attention of the hash block (so the
    # manager's own steps decide the caching), with prefill-checkpoint
    # blocks: a chunk crossing a state block checkpoints inside it.
    ckpt = {"checkpoint_blocks": 1, "checkpoint_alignment": 16}
    WORKLOADS["mamba-ckpt"] = vw.FULL.scaled(
        name="full attention + Mamba align: prefill checkpoints, partial hits",
        groups=(vw.Group("full", 16), vw.Group("mamba", 64, **ckpt)),
        hash_block_size=16, num_requests=_n(200), num_prefixes=6, arrivals_per_step=2,
        repeat_every=3, num_blocks=300, token_budget=256,
    )
    # ... in chunks of no more than a hash block or two (a small token
    # budget): prefill steps within a state block, the prompt's partial
    # tail cached on one of them.
    WORKLOADS["mamba-small-chunks"] = WORKLOADS["mamba-ckpt"].scaled(
        name="full attention + Mamba align: small prefill chunks",
        num_requests=_n(60), token_budget=16, num_blocks=100,
    )
    # ... and with EAGLE's drafts: the Mamba group's speculative blocks,
    # relocated as drafts are rejected.
    WORKLOADS["eagle+mamba-ckpt"] = WORKLOADS["mamba-ckpt"].scaled(
        name="EAGLE, full attention + Mamba align with speculative blocks, checkpoints",
        groups=(vw.Group("full", 16), vw.Group("mamba", 64, speculative_blocks=3, **ckpt)),
        **eagle,
    )
    # ... keeping only the states a later request can resume at (the
    # engine's default retention): a checkpoint only on the chunk that
    # reaches the prompt's end (0.31 on).
    WORKLOADS["mamba-ckpt-reachable"] = WORKLOADS["mamba-ckpt"].scaled(
        name="full attention + Mamba align: prefill checkpoints, reachable states kept",
        retention_interval=0,
    )
    # ... with Mamba blocks of one hash block: a chunk crossing a state
    # block may checkpoint exactly one hash block past its start.
    WORKLOADS["mamba16-ckpt"] = WORKLOADS["mamba-ckpt"].scaled(
        name="full attention + Mamba align of the hash block: prefill checkpoints",
        groups=(vw.Group("full", 16), vw.Group("mamba", 16, **ckpt)),
        num_requests=_n(100), token_budget=32, num_blocks=100,
    )
    # ... and without checkpoint blocks: a running request's chunk that
    # crosses two state blocks or more moves its speculative blocks past the
    # new state's slot (kvpool does it in C).
    WORKLOADS["eagle+mamba-long-chunks"] = WORKLOADS["mamba-ckpt"].scaled(
        name="EAGLE, full attention + Mamba align with speculative blocks, long chunks",
        groups=(vw.Group("full", 16), vw.Group("mamba", 64, speculative_blocks=3)),
        **eagle,
    )

if LATE_DRIVER and vw.MAMBA_MODE_ALL:
    # (0.30, 0.31: the deprecated mode "all", prefix caching on: each Mamba
    # block of the attention block size is a cached state; the manager's
    # code is its "none" mode's, with caching) Hits on shared prefixes,
    # eviction, preemption; with MTP, the speculative blocks too.
    WORKLOADS["mamba-all"] = vw.FULL.scaled(
        name="full attention + Mamba in mode 'all': every block's state cached",
        groups=(vw.Group("full", 16), vw.Group("mamba", 16, mamba_mode="all")),
        num_requests=_n(250), num_prefixes=6, arrivals_per_step=2, repeat_every=3,
        num_blocks=NUM_BLOCKS // 2, token_budget=256,
    )
    WORKLOADS["mtp+mamba-all"] = WORKLOADS["mamba-all"].scaled(
        name="MTP (3 drafts): full attention + Mamba in mode 'all' with speculative blocks",
        groups=(vw.Group("full", 16),
                vw.Group("mamba", 16, mamba_mode="all", speculative_blocks=3)),
        num_requests=_n(150), **eagle,
    )
    # ... a Mamba model alone (vLLM's unitary coordinator): the group's own
    # count decides when a block is cached.
    WORKLOADS["mamba-only-all"] = WORKLOADS["mamba-all"].scaled(
        name="Mamba alone in mode 'all'",
        groups=(vw.Group("mamba", 16, mamba_mode="all"),), num_requests=_n(150),
        # (its blocks freed as it goes: a small pool for evictions)
        num_blocks=64,
    )


def _cores() -> dict[str, ModuleType]:
    cores = {"pure-python": importlib.import_module("kvpool._core_py")}
    try:
        cores["compiled"] = importlib.import_module("kvpool._core")
    except ImportError:
        pass
    return cores


CORES = _cores()

# Array-encoded events (until vLLM 0.23): field names in wire order, after the
# tag, from vLLM's own classes, to name a differing field.
EVENT_FIELDS = {
    cls.__name__: tuple(f.name for f in msgspec.structs.fields(cls))
    for cls in (vllm_kv_events.BlockStored, vllm_kv_events.BlockRemoved)
}

def kvpool_line() -> kv_vllm.VLLMLine:
    """kvpool's line for this release; a skip where it has none (every
    release of ``kvpool.vllm.VLLM_LINES`` has one, by definition)."""
    try:
        return kv_vllm.vllm_line(RELEASE)
    except kv_vllm.UnsupportedVLLMVersionError:
        pytest.skip(f"kvpool has no line for vLLM {RELEASE}")


@pytest.fixture(autouse=True)
def _vllm_pool_in_place() -> Iterator[None]:
    assert kv_cache_coordinator.BlockPool is vllm_block_pool.BlockPool
    yield
    assert kv_cache_coordinator.BlockPool is vllm_block_pool.BlockPool


@pytest.fixture
def workload(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> vw.Workload:
    name = request.param
    if name == "full-bytes-hashes":
        monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    else:
        monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    return WORKLOADS[name]


_reference: dict[str, vw.Run] = {}


def _finals(r: vw.Run, group: int) -> list[list[int]]:
    """Each finished request's last block table (ids) in KV-cache group
    ``group``."""
    return [e[3][group] for e in r.trace if e[0] == "final"]


def reference_run(key: str, w: vw.Workload) -> vw.Run:
    """vLLM's own pool on the workload (once per session per workload),
    checked to exercise what the workload claims to."""
    if key in _reference:
        return _reference[key]
    r = _reference[key] = vw.run(w)
    assert r.finished == w.num_requests
    assert r.busy_resets_refused > 0
    assert any(e[0] == "evict" for e in r.trace)
    if w.enable_caching:
        # (a Mamba model alone: a running request frees a block for each
        # it takes, and admissions wait for room, so nothing preempts it)
        assert r.preemptions > 0 or all(g.kind == "mamba" for g in w.groups)
        assert r.prefix_hit_tokens > 0
        assert any(e[0] == "reset" and e[2] for e in r.trace)
    if w.enable_events:
        assert r.events > 0
    if w.metrics_sample_rate:
        assert any(e[0] == "step" and e[7] for e in r.trace)
    if key == "shared-running-prefix":
        assert r.hits_on_blocks_in_use > 0
    if key == "mamba-cow":
        assert r.cow_copies > 0
    chunked = [i for i, g in enumerate(w.groups) if g.kind == "chunked"]
    if chunked:
        # Chunks left behind were freed: a finished request's chunked table
        # starts with a null block.
        assert any(ids[:1] == [0] for ids in _finals(r, chunked[0]))
    mamba = [g for g in w.groups if g.kind == "mamba" and g.mamba_mode == "none"]
    if mamba:
        assert r.preemptions > 0
        i = w.groups.index(mamba[0])
        finals = _finals(r, i)
        if mamba[0].block_size < w.max_model_len:
            # The blocks behind the last token were freed: a finished
            # request's table starts with a null block, and holds no more
            # than the state's two blocks (the last one, the one being
            # written) and its speculative ones.
            assert any(ids[:1] == [0] for ids in finals)
            assert all(len([b for b in ids if b]) <= 2 + mamba[0].speculative_blocks
                       for ids in finals)
        else:
            assert all(len(ids) == 1 + mamba[0].speculative_blocks for ids in finals if ids)
    ring = [i for i, g in enumerate(w.groups) if g.kind in ("ring", "kpool-tail")]
    if ring:
        # One ring block a request, held to the end.
        finals = _finals(r, ring[0])
        assert finals and all(len(ids) == 1 and ids[0] for ids in finals)
    cross = [i for i, g in enumerate(w.groups) if g.kind == "cross"]
    if cross:
        # Encoder blocks held to the end, and allocated again for the
        # preempted requests.
        assert any(_finals(r, cross[0]))
        assert r.preemptions > 0
    if any(g.kind == "rswa" for g in w.groups):
        # R-SWA freed gaps: a finished request's table holds a null block
        # (id 0) between two others.
        assert any(
            0 in ids[1:] and any(ids[ids.index(0, 1):])
            for e in r.trace if e[0] == "final" for ids in e[3]
        )
    if getattr(w, "spec_tokens", 0):
        # Drafts scheduled, some accepted, some rolled back.
        assert 0 < r.rejected_tokens < r.draft_tokens
    if getattr(w, "connector", False):
        assert r.external_tokens > 0, r
        assert r.async_loads > 0 and r.failed_loads > 0 and r.aborted_loads > 0, r
    return r


def candidate_run(pool_class: type, w: vw.Workload) -> vw.Run:
    with pool_in_vllm(pool_class):
        assert type(vw.make_manager(w).block_pool) is pool_class
        return vw.run(w)


def assert_same(expected: vw.Run, got: vw.Run, label: str) -> None:
    diff = first_difference(expected.trace, got.trace, EVENT_FIELDS)
    if diff:
        pytest.fail(f"vLLM {RELEASE}, {label}: {diff}", pytrace=False)
    assert counters(got) == counters(expected)


def test_driver_for_release(record_testsuite_property) -> None:
    """The driver in use is the one for this release's manager API (named in
    the JUnit report, with kvpool's line, for .ci/vllm-mgr-all.sh)."""
    record_testsuite_property("driver", vw.__name__)
    try:
        record_testsuite_property("kvpool_line", kv_vllm.vllm_line(RELEASE).name)
    except kv_vllm.UnsupportedVLLMVersionError:
        record_testsuite_property("kvpool_line", "none")
    assert vw.__name__ == ("vllm_workload33" if LATE_DRIVER else "vllm_workload")
    computed = vw.make_manager(WORKLOADS["full"]).get_computed_blocks(
        vw.build_requests(WORKLOADS["full"].scaled(num_requests=1))[0]
    )
    assert len(computed) == (3 if LATE_DRIVER else 2)


@pytest.mark.parametrize("workload", list(WORKLOADS), indirect=True)
def test_vllm_against_itself(workload: vw.Workload, request: pytest.FixtureRequest) -> None:
    expected = reference_run(request.node.callspec.params["workload"], workload)

    class VLLMBlockPool(vllm_block_pool.BlockPool):  # type: ignore[misc, valid-type]
        """vLLM's own pool, under another name: it must be the one built."""

    assert_same(expected, candidate_run(VLLMBlockPool, workload), "vLLM's pool again")


@pytest.mark.parametrize("core", list(CORES))
@pytest.mark.parametrize("workload", list(WORKLOADS), indirect=True)
def test_kvpool_against_vllm(
    workload: vw.Workload, core: str, request: pytest.FixtureRequest
) -> None:
    line = kvpool_line()
    expected = reference_run(request.node.callspec.params["workload"], workload)
    pool_class = vllm_block_pool_class(line.name, CORES[core])
    assert_same(
        expected, candidate_run(pool_class, workload), f"kvpool {line.name} ({core})"
    )


@pytest.mark.parametrize("base", ["vllm", "kvpool"])
@pytest.mark.parametrize(
    "breakage, where",
    [(free_order_broken, "expected (vLLM's pool)"), (events_broken, "KV events differ")],
    ids=["free-order", "dropped-event"],
)
def test_a_broken_pool_is_caught(base: str, breakage, where: str) -> None:
    """The comparison is not vacuous on this release: a pool that differs
    from vLLM's in one detail fails it, and the report names the first
    difference; the unbroken pool passes on the same workload."""
    if base == "vllm":
        pool_class = vllm_block_pool.BlockPool
    else:
        pool_class = vllm_block_pool_class(kvpool_line().name)
    w = WORKLOADS["full"].scaled(num_requests=_n(150))
    expected = vw.run(w)
    diff = first_difference(expected.trace, candidate_run(breakage(pool_class), w).trace)
    assert diff is not None, f"{breakage.__name__} over {base}'s pool went unnoticed"
    assert where in diff, diff
    assert first_difference(expected.trace, candidate_run(pool_class, w).trace) is None


# kvpool's KV-cache manager (the lines that have one): the scheduler builds
# its manager through this module's name ``KVCacheManager``.
_MANAGER_NAME_MODULE = importlib.import_module("vllm.v1.core.sched.scheduler")

# The workloads kvpool's compiled manager paths serve; the others must fall
# back to vLLM's code for the reason named.
_FALLBACK: dict[str, str] = {}

def kvpool_manager_class() -> type:
    """kvpool's manager of this release's line; a skip where it has none (or
    the compiled core is missing: the manager paths are compiled only)."""
    line = kvpool_line()
    if line.manager is None:
        pytest.skip(f"kvpool's {line.name} line has no KV-cache manager")
    if "compiled" not in CORES:
        pytest.skip("kvpool's manager paths need the compiled core")
    return importlib.import_module(line.manager).KVCacheManager


@contextlib.contextmanager
def manager_in_vllm(manager_class: type, pool_class: type) -> Iterator[None]:
    """vLLM's scheduler name builds ``manager_class`` over ``pool_class``
    inside the block, as ``kvpool.vllm.install()`` puts them in."""
    saved = _MANAGER_NAME_MODULE.KVCacheManager
    _MANAGER_NAME_MODULE.KVCacheManager = manager_class
    try:
        with pool_in_vllm(pool_class):
            yield
    finally:
        _MANAGER_NAME_MODULE.KVCacheManager = saved


def manager_run(manager_class: type, w: vw.Workload) -> tuple[vw.Run, list]:
    """A run with kvpool's pool and ``manager_class``; the managers built."""
    pool_class = vllm_block_pool_class(kvpool_line().name, CORES["compiled"])
    managers: list = []
    with manager_in_vllm(manager_class, pool_class):
        r = vw.run(w, on_manager=managers.append)
    assert managers and all(type(m) is manager_class for m in managers)
    return r, managers


@pytest.mark.parametrize("workload", list(WORKLOADS), indirect=True)
def test_kvpool_manager_against_vllm(workload: vw.Workload, request: pytest.FixtureRequest) -> None:
    """vLLM's manager over vLLM's pool against kvpool's manager over kvpool's
    pool: the same trace, events and counters; the compiled paths must have
    served the workload (or have refused it for the reason expected)."""
    key = request.node.callspec.params["workload"]
    manager_class = kvpool_manager_class()
    expected = reference_run(key, workload)
    got, managers = manager_run(manager_class, workload)
    assert_same(expected, got, f"kvpool's {kvpool_line().name} manager")
    for m in managers:
        if key in _FALLBACK:
            assert m._kvpool_plan is None and m.kvpool_fallback_reason == _FALLBACK[key]
        else:
            assert m.kvpool_fallback_reason is None
            if key in _SPEC_WORKLOADS:
                # (lookahead hashes: no EAGLE drop, as the scheduler builds it)
                assert m.use_eagle == (workload.eagle and not workload.num_hash_lookahead_tokens)
                assert getattr(m.block_pool, "num_hash_lookahead_tokens", 0) \
                    == workload.num_hash_lookahead_tokens
            counts = m._kvpool_plan.counts
            if getattr(workload, "connector", False):
                # External tokens adopted in C.
                assert counts["external"] > 0, counts
            assert counts["fast"] > counts["base"], counts
            align = any(g.kind == "mamba" and g.mamba_mode == "align" for g in workload.groups)
            if align:
                # A Mamba group in "align" mode: every allocate_slots call is
                # done in C -- hits adopted on admission, and a hit ending
                # inside a block (a partial hit, where a block is larger than
                # the hash block) copied on write, a new request's or a
                # running one's after its prompt-tail step; every lookup is
                # vLLM's code.
                assert counts["lookups"] == 0, counts
                assert counts["base"] == 0 and counts["adopt"] > 0, counts
                if any(g.block_size > workload.hash_block_size for g in workload.groups):
                    assert counts["cow"] > 0, counts
                assert counts["cache_calls"] > 0, counts
            elif any(g.kind == "mamba" for g in workload.groups) and workload.enable_caching:
                # ... in 0.30/0.31's mode "all": the steps of running
                # requests in C, blocks cached through vLLM's coordinator;
                # an admission with a hit (there are hits) vLLM's code, and
                # so is every lookup.
                assert got.prefix_hit_tokens > 0, got
                assert counts["adopt"] == 0 and counts["lookups"] == 0, counts
                assert counts["cache_calls"] > 0 and counts["base"] > 0, counts
            elif workload.enable_caching:
                # Prefix-cache hits adopted, blocks cached (by the pool
                # directly, or through vLLM's coordinator).
                assert counts["adopt"] > 0, counts
                assert counts["cache_calls"] + counts["cache_direct"] > 0, counts
                # Every block the lookup reads the hash block: the
                # prefix-cache lookups are done in C (one full-attention
                # group, or full + a sliding window or chunked local
                # attention, with EAGLE's drop and the window's extra block;
                # a circular buffer's group takes no part, and beside full
                # attention alone its block may make the hits' alignment
                # coarser); with another block size, or two full-attention
                # specs (vLLM's fixed-point loop), by vLLM's code.
                looked_up = [g for g in workload.groups if g.kind not in ("ring", "kpool-tail")]
                if all(g.block_size == workload.hash_block_size for g in looked_up) and (
                        len(looked_up) == 1
                        or workload.scheduler_block_size == workload.hash_block_size) and (
                        sum(g.kind == "full" for g in looked_up) <= 1):
                    assert counts["lookups"] > 0, counts
                else:
                    assert counts["lookups"] == 0, counts
                if [(g.kind, g.block_size) for g in workload.groups] == [
                    ("full", workload.hash_block_size)
                ]:
                    # ... and with events, the BlockStored of a request
                    # without LoRA is built in C (every 7th has one: the
                    # line's own builder), its lookahead tokens too.
                    if workload.enable_events:
                        assert counts["plain_events"] > 0, counts
                # A full-attention block larger than the hash block may
                # register a partial tail on any step: vLLM's code decides.
                if not any(
                    g.kind == "full" and g.block_size != workload.hash_block_size
                    for g in workload.groups
                ):
                    assert counts["cache_skips"] > 0, counts
                # 0.30, 0.31: the scheduler's once-a-step common-prefix
                # count (the driver asks it every step) is done in C.
                if manager_class._kvpool_common_prefix_blocks is not None:
                    assert counts["common_prefix"] > 0, counts


_SPEC_WORKLOADS = ("eagle", "eagle-1", "eagle+sliding", "eagle+sliding-only", "eagle+rswa", "mtp",
                   "ngram", "connector+eagle", "mtp+mamba",
                   "eagle-lookahead-hashes", "mtp-lookahead-hashes",
                   "eagle+sliding-lookahead-hashes")


@pytest.mark.parametrize("key", ["eagle", "mtp"])
def test_a_manager_that_keeps_the_eagle_block_is_caught(key: str) -> None:
    """The EAGLE workloads have teeth on the compiled lookup: kvpool's
    manager made to read an empty drop set (so its lookup keeps the last hit
    block, as without EAGLE) fails the comparison; the unbroken one passes
    (``test_kvpool_manager_against_vllm``)."""
    if not LATE_DRIVER:
        pytest.skip("no speculative decoding in the 0.15 driver")
    manager_class = kvpool_manager_class()

    class KeepsTheBlock(manager_class):  # type: ignore[misc, valid-type]
        _kvpool_eagle_drop_attr = "_kvpool_planted_no_drop"

    w = WORKLOADS[key].scaled(num_requests=_n(150))
    expected = vw.run(w)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            kv_cache_coordinator.KVCacheCoordinator,
            "_kvpool_planted_no_drop",
            frozenset(),
            raising=False,
        )
        broken, managers = manager_run(KeepsTheBlock, w)
    assert all(m._kvpool_plan is not None for m in managers)
    diff = first_difference(expected.trace, broken.trace)
    assert diff is not None, "a lookup that keeps the EAGLE block went unnoticed"


def test_a_hybrid_lookup_with_the_other_lines_eagle_margin_is_caught() -> None:
    """The EAGLE + sliding window workload has teeth on the compiled hybrid
    lookup: kvpool's manager with the other lines' EAGLE margin (0.30, 0.31
    look one block past the hit up to the lookup's bound, 0.32 on up to the
    hashed tokens: a repeated block-aligned prompt differs by a block) fails
    the comparison."""
    if not LATE_DRIVER:
        pytest.skip("no speculative decoding in the 0.15 driver")
    manager_class = kvpool_manager_class()

    class OtherMargin(manager_class):  # type: ignore[misc, valid-type]
        _kvpool_eagle_margin_to_hashes = not manager_class._kvpool_eagle_margin_to_hashes

    w = WORKLOADS["eagle+sliding"]
    expected = reference_run("eagle+sliding", w)
    broken, managers = manager_run(OtherMargin, w)
    assert all(m._kvpool_plan is not None and m._kvpool_plan.counts["lookups"] for m in managers)
    diff = first_difference(expected.trace, broken.trace)
    assert diff is not None, "a hybrid lookup with the other lines' EAGLE margin went unnoticed"


def test_a_sink_group_fails_to_build_as_in_vllm() -> None:
    """vLLM 0.30-0.34 cannot build a ``SinkFullAttentionManager``: its
    ``__init__`` takes no ``needs_kv_cache_zeroing``, which the coordinator
    passes every manager, so a model with sink attention (openPangu's
    ``StaticSinkAttention``) fails at engine start. kvpool's manager fails
    the same way (nothing to serve). A release that fixes it fails this
    test: then kvpool's compiled paths should serve the group (full
    attention, as far as the scheduler's paths go)."""
    if not LATE_DRIVER:
        pytest.skip("the 0.15 driver has no sink groups")
    manager_class = kvpool_manager_class()
    w = WORKLOADS["full"].scaled(groups=(vw.Group("sink", 16),))
    for cls in (KVCacheManager, manager_class):
        with pytest.raises(TypeError, match="needs_kv_cache_zeroing"):
            vw.make_manager(w, cls)


@pytest.mark.parametrize("key, single", [("rswa", "RSWAManager"),
                                         ("full+chunked", "ChunkedLocalAttentionManager"),
                                         ("full+cross", "CrossAttentionManager"),
                                         ("full+mamba", "MambaManager"),
                                         ("full+ring", "CircularBufferManager")])
def test_a_class_with_a_method_of_its_own_falls_back(key: str, single: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-type manager class the compiled paths serve only as vLLM
    ships it: given a method they do not know of (a later release's, a
    plugin's), its groups run vLLM's code, and the manager says why."""
    if key not in WORKLOADS:
        pytest.skip(f"no {key} workload in this driver")
    manager_class = kvpool_manager_class()
    from vllm.v1.core import single_type_kv_cache_manager as single_types

    cls = getattr(single_types, single)
    pool_class = vllm_block_pool_class(kvpool_line().name, CORES["compiled"])
    with manager_in_vllm(manager_class, pool_class):
        assert vw.make_manager(WORKLOADS[key]).kvpool_fallback_reason is None
        monkeypatch.setattr(cls, "a_method_of_its_own", lambda self: None, raising=False)
        manager = vw.make_manager(WORKLOADS[key])
    assert manager._kvpool_plan is None
    assert manager.kvpool_fallback_reason == f"a {single} group"


def test_each_group_says_what_serves_it(caplog: pytest.LogCaptureFixture) -> None:
    """At manager build, one INFO line per KV-cache group: its spec, the
    single-type manager serving it, and whether kvpool's compiled paths or
    vLLM's code run it (and why); each manager's set of lines once per
    process."""
    manager_class = kvpool_manager_class()
    module = importlib.import_module("kvpool.v0_33.kv_cache_manager")
    pool_class = vllm_block_pool_class(kvpool_line().name, CORES["compiled"])
    compiled = "kvpool's compiled paths"
    lookup = " (its prefix-cache lookup: vLLM's code, for these groups' block sizes or specs)"
    expected = {
        "full": [("FullAttentionSpec", "FullAttentionManager", compiled)],
        "full+sliding": [("FullAttentionSpec", "FullAttentionManager", compiled),
                         ("SlidingWindowSpec", "SlidingWindowManager", compiled)],
        "full32+sliding16": [("FullAttentionSpec", "FullAttentionManager", compiled + lookup),
                             ("SlidingWindowSpec", "SlidingWindowManager", compiled + lookup)],
    }
    if "mamba-cow" in WORKLOADS:
        steady = ("kvpool's compiled paths; vLLM's code for a connector's tokens "
                  "(mamba_cache_mode 'align')")
        expected["mamba-cow"] = [("FullAttentionSpec", "FullAttentionManager", compiled + lookup),
                                 ("MambaSpec", "MambaManager", steady + lookup)]
    if "full+ring" in WORKLOADS:
        expected["full+ring"] = [
            ("FullAttentionSpec", "FullAttentionManager", compiled),
            ("CircularBufferSpec", "CircularBufferManager", compiled)]
    if "full+mamba" in WORKLOADS:
        expected["full+mamba"] = [("FullAttentionSpec", "FullAttentionManager", compiled),
                                  ("MambaSpec", "MambaManager", compiled)]
    if "mamba-all" in WORKLOADS:
        hits = ("kvpool's compiled paths; vLLM's code for an admission with a prefix-cache hit "
                "(mamba_cache_mode 'all')")
        expected["mamba-all"] = [("FullAttentionSpec", "FullAttentionManager", compiled + lookup),
                                 ("MambaSpec", "MambaManager", hits + lookup)]
    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.INFO, "kvpool.vllm"):
        patch.setattr(module, "_logged", set())
        for key, groups in expected.items():
            caplog.clear()
            with manager_in_vllm(manager_class, pool_class):
                manager = vw.make_manager(WORKLOADS[key])
                vw.make_manager(WORKLOADS[key])  # (said once)
            lines = [r.getMessage() for r in caplog.records if r.name == "kvpool.vllm"]
            assert lines == module.group_lines(manager), (key, lines)
            assert len(lines) == len(groups), (key, lines)
            for i, (line, (spec, single, served)) in enumerate(zip(lines, groups)):
                assert line.startswith(f"kvpool: KV-cache group {i} ({spec}, "), line
                assert line.endswith(f" is served by {single}: {served}"), line


def broken_manager(manager_class: type) -> type:
    """kvpool's manager, broken in one detail: every 13th ``allocate_slots``
    taken by the compiled path leaves its new full blocks uncached (as if
    ``delay_cache_blocks`` were set), so later requests miss hits."""

    class BrokenKVCacheManager(manager_class):  # type: ignore[misc, valid-type]
        _calls = 0

        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            BrokenKVCacheManager._calls += 1
            if BrokenKVCacheManager._calls % 13 == 0 and not args:
                kwargs["delay_cache_blocks"] = True
            return super().allocate_slots(request, num_new_tokens, *args, **kwargs)

    return BrokenKVCacheManager


def test_a_broken_manager_is_caught() -> None:
    """The manager comparison is not vacuous: kvpool's manager broken in one
    detail fails it, naming the first difference; unbroken it passes."""
    manager_class = kvpool_manager_class()
    w = WORKLOADS["full"].scaled(num_requests=_n(150))
    expected = vw.run(w)
    broken, _ = manager_run(broken_manager(manager_class), w)
    diff = first_difference(expected.trace, broken.trace)
    assert diff is not None, "a manager that skips caching went unnoticed"
    good, _ = manager_run(manager_class, w)
    assert first_difference(expected.trace, good.trace) is None


def test_align_steady_step_counts_below_zero() -> None:
    """A running request whose Mamba "align" table holds more blocks than
    its next step needs (its drafts rejected after a state block was added)
    makes vLLM's predictor count below zero for it; the step's total then
    fits a pool short by one block, and vLLM allocates. kvpool's steady
    step, done in C, must count the same (a count floored at zero refuses
    the step: returns None)."""
    manager_class = kvpool_manager_class()
    if "eagle+mamba-ckpt" not in WORKLOADS:
        pytest.skip("MambaSpec has no prefill-checkpoint blocks before 0.30")
    w = WORKLOADS["eagle+mamba-ckpt"]
    pool_class = vllm_block_pool_class(kvpool_line().name, CORES["compiled"])
    hasher = vw.request_block_hasher(w)
    prompt = list(range(1, 63))  # 62 tokens: the draft step crosses the state block
    results = []
    for cls, pool in ((KVCacheManager, vllm_block_pool.BlockPool), (manager_class, pool_class)):
        with manager_in_vllm(cls, pool):
            mgr = vw.make_manager(w, cls)
        req = vw.new_request("r", prompt, 8, hasher)
        steps = []
        # The prompt, then one token and 3 drafts (a new state block: 5 blocks).
        for num_new in (len(prompt), 4):
            steps.append(mgr.allocate_slots(req, num_new, num_lookahead_tokens=3))
            req.num_computed_tokens += num_new
            if num_new == 4:
                req.num_computed_tokens -= 3  # every draft rejected
            req.append_output_token_ids(7)
        # One token, no drafts: the state needs 4 blocks; with no block to
        # spare beyond what the step's count frees, vLLM still allocates.
        free = mgr.block_pool.get_num_free_blocks()
        steps.append(mgr.allocate_slots(req, 1, num_lookahead_tokens=3, reserved_blocks=free + 1))
        results.append([None if s is None else s.get_block_ids() for s in steps])
        if cls is manager_class:
            # (the prompt, the new state block and the steady step: all C's)
            counts = mgr._kvpool_plan.counts if mgr._kvpool_plan is not None else None
            assert counts is not None and counts["fast"] == 3 and counts["base"] == 0, counts
    assert results[0][2] is not None, results[0]
    assert results[1] == results[0]
