"""The manager driver: vLLM's own ``KVCacheManager``, built and called as the
installed vLLM's ``Scheduler`` does (``_workload`` for the releases whose
``get_computed_blocks`` returns two values, 0.15.0 to 0.25.x; ``_workload33``
from 0.26.0, ``_workload.DRIVER_SPLIT``), over vLLM's own ``BlockPool`` and
over kvpool's pool of the line being proven, must make identical decisions
and publish identical bytes; where the line has a compiled
``KVCacheManager`` (0.30 on), kvpool's manager over kvpool's pool must match
vLLM's manager over vLLM's pool too. What is compared is what the drivers
record (their docstrings say what).

``python -m kvpool.vllm --prove`` runs ``cases(line)``;
``tests/vllm_release_mgr/test_release_manager.py`` runs the same checks, for
both cores, per listed release (``Suite``: one per process, the reference
runs shared). The checks, per workload (``workloads``):

- vLLM against itself: a second run over vLLM's own pool class, put in
  through the names kvpool's pool is, gives the same trace (the driver is
  deterministic on this vLLM and the swap reaches the pool the manager
  builds); otherwise ``HarnessFailure``;
- kvpool's pool under vLLM's manager, over each core asked for;
- kvpool's manager against vLLM's (where the line has one and the compiled
  core is loaded), which must also have served the workload on its compiled
  paths;

and once: deliberately broken pools (vLLM's and kvpool's) and a broken
manager must be caught, the report naming the first difference (the
comparison has teeth on this vLLM; otherwise ``HarnessFailure``).

The line proven is the one given, never looked up from ``vllm.__version__``:
the installed vLLM may be a build no listed release names.

``KVPOOL_MGR_SCALE`` (default 1) scales every workload's request count, so a
CI run over all releases fits its time (``.ci/vllm-mgr-all.sh``); the
``mamba-cow`` workload is never scaled below its own size.

Imports vLLM only when a function below is called (``applies`` excepted:
it only tries to).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from ..releases import VLLMLine, vllm_block_pool_class
from ._base import Case, HarnessFailure, Patch, ProofFailure
from ._in_vllm import manager_in_vllm, pool_in_vllm
from ._trace import counters, events_broken, first_difference, free_order_broken

__all__ = [
    "BROKEN_POOLS",
    "NAME",
    "PROVE_CORES",
    "SCALE_VAR",
    "Suite",
    "all_cores",
    "applies",
    "broken_manager",
    "cases",
    "driver",
    "late_driver",
    "workloads",
]

NAME = "manager driver"

#: Scales every workload's request count (a float; default 1).
SCALE_VAR = "KVPOOL_MGR_SCALE"

#: The cores ``cases`` runs kvpool's pool over by default: the one
#: ``install()`` puts in (the tests ask for every core).
PROVE_CORES = ("compiled",)

#: The core modules by the name the checks use.
CORE_MODULES = {"pure-python": "kvpool._core_py", "compiled": "kvpool._core"}

#: The planted pool faults, by name: (what breaks the pool class, what the
#: report of the first difference must say).
BROKEN_POOLS: dict[str, tuple[Callable[[type], type], str]] = {
    "free-order": (free_order_broken, "expected (vLLM's pool)"),
    "dropped-event": (events_broken, "KV events differ"),
}

#: Half the blocks of the drivers' default pool: preemptions and evictions
#: even in the shortest runs.
NUM_BLOCKS = 1024

#: The workloads kvpool's compiled manager paths do not serve, with the
#: reason they must give for falling back to vLLM's code (none today).
FALLBACK: dict[str, str] = {}

#: The speculative-decoding workloads: kvpool's manager must use EAGLE's
#: drop as the scheduler builds it.
SPEC_WORKLOADS = ("eagle", "eagle-1", "eagle+sliding", "eagle+sliding-only", "eagle+rswa", "mtp",
                  "ngram", "connector+eagle", "mtp+mamba",
                  "eagle-lookahead-hashes", "mtp-lookahead-hashes",
                  "eagle+sliding-lookahead-hashes")

#: The loggers quieted while a case runs: refused busy resets log a warning
#: per call on both pools.
_QUIET_LOGGERS = ("vllm.v1.core.block_pool", "kvpool")


def applies(line: VLLMLine) -> str | None:
    """``None``: the driver runs on every line, wherever vLLM's KV-cache
    manager is importable; otherwise why not."""
    try:
        # Not just ``import vllm``: a directory named vllm on sys.path would
        # satisfy that as an empty namespace package.
        import vllm.v1.core.kv_cache_manager  # noqa: F401
    except ImportError as exc:
        return f"vLLM's KV-cache manager is not importable here ({exc})"
    return None


def late_driver() -> bool:
    """Whether the installed vLLM's ``KVCacheManager`` has
    ``_workload.DRIVER_SPLIT`` (0.26.0 on): ``_workload33`` drives it."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from . import _workload

    return hasattr(KVCacheManager, _workload.DRIVER_SPLIT)


def driver() -> ModuleType:
    """The driver for the installed vLLM's manager API: ``_workload33`` from
    0.26.0 (``late_driver``), else ``_workload``."""
    if late_driver():
        from . import _workload33

        return _workload33
    from . import _workload

    return _workload


def scale_from_env() -> float:
    """``KVPOOL_MGR_SCALE``, default 1."""
    return float(os.environ.get(SCALE_VAR, "1"))


def scaled_count(num_requests: int, scale: float, least: int = 40) -> int:
    """``num_requests`` times ``scale``, but no fewer than ``least``."""
    return max(least, round(num_requests * scale))


def all_cores() -> dict[str, ModuleType]:
    """kvpool's cores that import here, by name: the pure-Python one always,
    the compiled one where it is built."""
    cores = {}
    for name, module in CORE_MODULES.items():
        try:
            cores[name] = importlib.import_module(module)
        except ImportError:
            pass
    return cores


def workloads(scale: float | None = None) -> dict[str, Any]:
    """The workloads, by key, for the installed vLLM (each as its driver's
    ``Workload``): those its driver and API have, every request count scaled
    by ``scale`` (default: ``KVPOOL_MGR_SCALE``) but to no fewer than 40."""
    from vllm.v1 import kv_cache_interface as vllm_kv_cache_interface

    vw = driver()
    late = late_driver()
    scale = scale_from_env() if scale is None else scale

    def _n(num_requests: int, least: int = 40) -> int:
        return scaled_count(num_requests, scale, least)

    out = {
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
    if late:
        out["shared-running-prefix"] = vw.FULL.scaled(
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
             {**connector,
              "groups": (vw.Group("full", 16),
                         vw.Group("sliding", 16, sliding_window=128, dtype="bfloat16"))}),
            ("connector+eagle", vw.FULL, 200, "KV connector with EAGLE (3 drafts)",
             {**connector, **eagle}),
        ):
            out[key] = base.scaled(name=name, num_requests=_n(n), num_blocks=NUM_BLOCKS, **changes)
        # One sliding-window group alone (vLLM's unitary coordinator), with
        # EAGLE: the window's extra contiguous block, then dropped.
        out["eagle+sliding-only"] = out["sliding-only"].scaled(
            name="EAGLE, 3 drafts, a sliding window alone", num_requests=_n(200), **eagle
        )
        # R-SWA (reference sliding window, Unlimited-OCR's attention): full
        # attention whose blocks between the prompt and the last 64 processed
        # tokens are freed as decoding goes on (nulls in the middle of a table);
        # alone, and under EAGLE (in-flight drafts hold the window back).
        out["rswa"] = vw.FULL.scaled(
            name="R-SWA: the gap between prompt and window freed",
            groups=(vw.Group("rswa", 16, sliding_window=64),),
            num_requests=_n(300),
            num_blocks=NUM_BLOCKS // 2,
        )
        out["eagle+rswa"] = out["rswa"].scaled(
            name="EAGLE, 3 drafts, R-SWA", num_requests=_n(200), **eagle
        )
        # Chunked local attention beside full attention (Llama 4): the blocks
        # before the current 64-token chunk are freed at each chunk boundary;
        # its lookup is vLLM's (nulls before the current chunk, then a forward
        # scan). With a KV connector too: the external tokens a chunk skipped.
        chunked = {"groups": (vw.Group("full", 16), vw.Group("chunked", 16, sliding_window=64))}
        out["full+chunked"] = vw.HYBRID.scaled(
            name="full + chunked local attention", num_requests=_n(300), num_blocks=NUM_BLOCKS,
            **chunked,
        )
        out["connector+chunked"] = vw.HYBRID.scaled(
            name="KV connector, full + chunked local attention", num_requests=_n(300),
            num_blocks=NUM_BLOCKS, **connector, **chunked,
        )
        # An encoder-decoder model (Whisper's decoder): full self-attention and
        # cross-attention over each request's 16-400 encoder tokens, allocated
        # when it is admitted (again after a preemption); prefix caching off, as
        # vLLM runs these models (its coordinator without prefix caching).
        out["full+cross"] = vw.FULL.scaled(
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
        out["full+mamba"] = vw.FULL.scaled(
            name="hybrid: full attention + Mamba, prefix caching off",
            groups=(vw.Group("full", 16),
                    vw.Group("mamba", vw.FULL.max_model_len, mamba_mode="none")),
            num_requests=_n(300), num_blocks=NUM_BLOCKS, **mamba_none,
        )
        out["mtp+mamba"] = vw.FULL.scaled(
            name="MTP (3 drafts): full attention + Mamba of 64-token blocks, prefix caching off",
            groups=(vw.Group("full", 16),
                    vw.Group("mamba", 64, mamba_mode="none", speculative_blocks=3)),
            # (Mamba's blocks freed as it goes: fewer blocks for the same pressure)
            num_requests=_n(300), num_blocks=NUM_BLOCKS // 2, **mamba_none, **eagle,
        )
        # ... and a KV connector's external tokens, of which the Mamba group
        # keeps the last one's state only.
        out["connector+mamba"] = out["mtp+mamba"].scaled(
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
            out["full+ring"] = vw.HYBRID.scaled(
                name="full + a circular buffer", num_requests=_n(300), num_blocks=NUM_BLOCKS,
                **ring)
            out["connector+ring"] = vw.HYBRID.scaled(
                name="KV connector, full + a circular buffer", num_requests=_n(300),
                num_blocks=NUM_BLOCKS, **connector, **ring)
            # ... with multi-module MTP: the hybrid coordinator's cacheable
            # tokens rounded down to the ring's 64-token scheduler block, an
            # EAGLE group's one block further within its finalized tokens; the
            # full-attention group's caching steps done in C.
            out["mtp+full+ring"] = vw.HYBRID.scaled(
                name="multi-module MTP, full + a circular buffer", num_requests=_n(200),
                num_blocks=NUM_BLOCKS, **ring, **eagle, multi_module_mtp=True)
            if vw.HASH_LOOKAHEAD:
                # ... with lookahead block hashes (0.33 on): a group caches no
                # further than the request's hashed tokens.
                out["eagle-lookahead+full+ring"] = vw.HYBRID.scaled(
                    name="EAGLE, lookahead block hashes, full + a circular buffer",
                    num_requests=_n(200), num_blocks=NUM_BLOCKS, **ring, **eagle,
                    hash_lookahead=True)
            # ... beside full attention and a sliding window, the ring's block
            # the hash block: the lookup is the simple hybrid's, the ring left
            # out (with EAGLE's drop, and the window's extra block).
            out["eagle+sliding+ring"] = vw.HYBRID.scaled(
                name="EAGLE, full + sliding window + a circular buffer", num_requests=_n(200),
                num_blocks=NUM_BLOCKS, **eagle,
                groups=(*vw.HYBRID.groups, vw.Group("ring", vw.HYBRID.groups[0].block_size)))
        if hasattr(vllm_kv_cache_interface, "KpoolTailSpec"):  # 0.30, 0.31
            out["full+kpool-tail"] = out["full+ring"].scaled(
                name="full + a kpool tail (a circular buffer over a sliding-window spec)",
                groups=(vw.Group("full", 16), vw.Group("kpool-tail", 64)))
        if vw.HASH_LOOKAHEAD:
            # 0.33 on, the engine's default for the EAGLE family (prefix caching
            # on, no connector): lookahead block hashes, no EAGLE drop, each
            # stored block's lookahead tokens in its event.
            for key, base, n, name, changes in (
                ("eagle-lookahead-hashes", vw.FULL, 300,
                 "EAGLE, 3 drafts, lookahead block hashes (1)",
                 eagle),
                ("mtp-lookahead-hashes", vw.FULL, 200,
                 "multi-module MTP, 3 drafts, lookahead block hashes (3)",
                 {**eagle, "multi_module_mtp": True}),
                ("eagle+sliding-lookahead-hashes", vw.HYBRID, 200,
                 "EAGLE, full + sliding window, lookahead block hashes", eagle),
            ):
                out[key] = base.scaled(name=name, num_requests=_n(n), num_blocks=NUM_BLOCKS,
                                             hash_lookahead=True, **changes)
        # Full attention and a sliding window, each of four hash blocks, fed
        # in chunks of one hash block: a prompt's tail registered as a partial
        # key of its block on a step that fills no block (then checked in C on
        # every later step).
        out["full64+sliding64-small-chunks"] = vw.HYBRID.scaled(
            name="full + sliding window of 64-token blocks, 16-token hash blocks, small chunks",
            groups=(vw.Group("full", 64), vw.Group("sliding", 64, sliding_window=128)),
            hash_block_size=16, token_budget=16, num_requests=_n(400), num_prefixes=6,
            arrivals_per_step=2, num_blocks=NUM_BLOCKS // 16)
        if vw.HASH_LOOKAHEAD:
            # ... with multi-module MTP and lookahead block hashes (0.33 on): the
            # request's hashes trail its tokens by 3, and the tail's boundary
            # stops at them (a boundary past them must go to vLLM's code).
            out["mtp-lookahead+full64+sliding64-small-chunks"] = out[
                "full64+sliding64-small-chunks"].scaled(
                name="multi-module MTP, lookahead block hashes, full + sliding window of "
                     "64-token blocks, small chunks",
                hash_lookahead=True, token_budget=32, num_blocks=40, **eagle, multi_module_mtp=True)
        # Two full-attention groups of one block size and different specs (an
        # EAGLE draft whose layers differ from the target's): the hybrid
        # coordinator's caching step fills a block in both at once, each cached
        # in C.
        out["eagle+draft-spec"] = vw.HYBRID.scaled(
            name="EAGLE, full attention + a draft's full attention of another spec",
            groups=(vw.Group("full", 16), vw.Group("full", 16, dtype="bfloat16")),
            num_requests=_n(200), num_blocks=NUM_BLOCKS, **eagle)
        out["mamba-cow"] = vw.FULL.scaled(
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

    if late and vw.MAMBA_CHECKPOINTS:
        # (0.30 on: MambaSpec's prefill-checkpoint blocks and their alignment)
        # Mamba "align" beside full attention of the hash block (so the
        # manager's own steps decide the caching), with prefill-checkpoint
        # blocks: a chunk crossing a state block checkpoints inside it.
        ckpt = {"checkpoint_blocks": 1, "checkpoint_alignment": 16}
        out["mamba-ckpt"] = vw.FULL.scaled(
            name="full attention + Mamba align: prefill checkpoints, partial hits",
            groups=(vw.Group("full", 16), vw.Group("mamba", 64, **ckpt)),
            hash_block_size=16, num_requests=_n(200), num_prefixes=6, arrivals_per_step=2,
            repeat_every=3, num_blocks=300, token_budget=256,
        )
        # ... in chunks of no more than a hash block or two (a small token
        # budget): prefill steps within a state block, the prompt's partial
        # tail cached on one of them.
        out["mamba-small-chunks"] = out["mamba-ckpt"].scaled(
            name="full attention + Mamba align: small prefill chunks",
            num_requests=_n(60), token_budget=16, num_blocks=100,
        )
        # ... and with EAGLE's drafts: the Mamba group's speculative blocks,
        # relocated as drafts are rejected.
        out["eagle+mamba-ckpt"] = out["mamba-ckpt"].scaled(
            name="EAGLE, full attention + Mamba align with speculative blocks, checkpoints",
            groups=(vw.Group("full", 16), vw.Group("mamba", 64, speculative_blocks=3, **ckpt)),
            **eagle,
        )
        # ... keeping only the states a later request can resume at (the
        # engine's default retention): a checkpoint only on the chunk that
        # reaches the prompt's end (0.31 on).
        out["mamba-ckpt-reachable"] = out["mamba-ckpt"].scaled(
            name="full attention + Mamba align: prefill checkpoints, reachable states kept",
            retention_interval=0,
        )
        # ... keeping one state per 128-token segment (two state blocks) and
        # the reachable ones: the caching step's sparse block mask, built in
        # C (issue 52).
        out["mamba-ckpt-segments"] = out["mamba-ckpt"].scaled(
            name="full attention + Mamba align: prefill checkpoints, a state per segment kept",
            retention_interval=128,
        )
        # ... with Mamba blocks of one hash block: a chunk crossing a state
        # block may checkpoint exactly one hash block past its start.
        out["mamba16-ckpt"] = out["mamba-ckpt"].scaled(
            name="full attention + Mamba align of the hash block: prefill checkpoints",
            groups=(vw.Group("full", 16), vw.Group("mamba", 16, **ckpt)),
            num_requests=_n(100), token_budget=32, num_blocks=100,
        )
        # ... and beside full attention of 4 state blocks: no partial hash
        # hits (the state block is the hash block), so the hits' alignment is
        # the scheduler block, and the Mamba lookup passes over the states it
        # finds between two of its multiples (issue 52: in C).
        out["full64+mamba16-ckpt"] = out["mamba-ckpt"].scaled(
            name="full attention of 64-token blocks + Mamba align of the hash block",
            groups=(vw.Group("full", 64), vw.Group("mamba", 16, **ckpt)),
            num_requests=_n(100), num_blocks=100,
        )
        # ... three Mamba groups of one spec (Qwen3-Next's layout): looked up
        # together, every group must hit.
        out["full+3mamba-ckpt"] = out["mamba-ckpt"].scaled(
            name="full attention + three Mamba align groups of one spec",
            groups=(vw.Group("full", 16), vw.Group("mamba", 64, **ckpt),
                    vw.Group("mamba", 64, **ckpt), vw.Group("mamba", 64, **ckpt)),
            num_blocks=600,
        )
        # ... and without checkpoint blocks: a running request's chunk that
        # crosses two state blocks or more moves its speculative blocks past the
        # new state's slot (kvpool does it in C).
        out["eagle+mamba-long-chunks"] = out["mamba-ckpt"].scaled(
            name="EAGLE, full attention + Mamba align with speculative blocks, long chunks",
            groups=(vw.Group("full", 16), vw.Group("mamba", 64, speculative_blocks=3)),
            **eagle,
        )

    if late and vw.MAMBA_MODE_ALL:
        # (0.30, 0.31: the deprecated mode "all", prefix caching on: each Mamba
        # block of the attention block size is a cached state; the manager's
        # code is its "none" mode's, with caching) Hits on shared prefixes,
        # eviction, preemption; with MTP, the speculative blocks too.
        out["mamba-all"] = vw.FULL.scaled(
            name="full attention + Mamba in mode 'all': every block's state cached",
            groups=(vw.Group("full", 16), vw.Group("mamba", 16, mamba_mode="all")),
            num_requests=_n(250), num_prefixes=6, arrivals_per_step=2, repeat_every=3,
            num_blocks=NUM_BLOCKS // 2, token_budget=256,
        )
        out["mtp+mamba-all"] = out["mamba-all"].scaled(
            name="MTP (3 drafts): full attention + Mamba in mode 'all' with speculative blocks",
            groups=(vw.Group("full", 16),
                    vw.Group("mamba", 16, mamba_mode="all", speculative_blocks=3)),
            num_requests=_n(150), **eagle,
        )
        # ... a Mamba model alone (vLLM's unitary coordinator): the group's own
        # count decides when a block is cached.
        out["mamba-only-all"] = out["mamba-all"].scaled(
            name="Mamba alone in mode 'all'",
            groups=(vw.Group("mamba", 16, mamba_mode="all"),), num_requests=_n(150),
            # (its blocks freed as it goes: a small pool for evictions)
            num_blocks=64,
        )
    return out


def event_fields() -> dict[str, tuple[str, ...]]:
    """The array-encoded events' field names (until vLLM 0.23), in wire
    order after the tag, from vLLM's own classes: to name a differing
    field."""
    import msgspec
    from vllm.distributed import kv_events as vllm_kv_events

    return {
        cls.__name__: tuple(f.name for f in msgspec.structs.fields(cls))
        for cls in (vllm_kv_events.BlockStored, vllm_kv_events.BlockRemoved)
    }


def broken_manager(manager_class: type) -> type:
    """kvpool's manager, broken in one detail: every 13th ``allocate_slots``
    taken by the compiled path leaves its new full blocks uncached (as if
    ``delay_cache_blocks`` were set), so later requests miss hits."""

    class BrokenKVCacheManager(manager_class):  # type: ignore[misc, valid-type]
        _calls = 0

        def allocate_slots(self, request: Any, num_new_tokens: int, *args: Any,
                           **kwargs: Any) -> Any:
            BrokenKVCacheManager._calls += 1
            if BrokenKVCacheManager._calls % 13 == 0 and not args:
                kwargs["delay_cache_blocks"] = True
            return super().allocate_slots(request, num_new_tokens, *args, **kwargs)

    return BrokenKVCacheManager


@contextlib.contextmanager
def quiet_pools() -> Iterator[None]:
    """The pools' loggers at ERROR inside the block (refused busy resets
    log a warning per call)."""
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _finals(r: Any, group: int) -> list[list[int]]:
    """Each finished request's last block table (ids) in KV-cache group
    ``group``."""
    return [e[3][group] for e in r.trace if e[0] == "final"]


def _check(holds: bool, failure: type[ProofFailure], message: str) -> None:
    if not holds:
        raise failure(message)


class Suite:
    """The checks of one vLLM, against kvpool's ``line`` (``None``: kvpool
    has no line for it; only vLLM's own checks then run): the workloads, the
    cores, and vLLM's reference run of each workload, made once and shared
    by the checks of that workload."""

    def __init__(self, line: VLLMLine | None, *, scale: float | None = None) -> None:
        import vllm

        self.line = line
        self.version = str(vllm.__version__)
        self.scale = scale_from_env() if scale is None else scale
        self.driver = driver()
        self.late = late_driver()
        self.workloads = workloads(self.scale)
        self.cores = all_cores()
        self.event_fields = event_fields()
        self._reference: dict[str, Any] = {}

    def n(self, num_requests: int, least: int = 40) -> int:
        """``num_requests`` at the suite's scale (``scaled_count``)."""
        return scaled_count(num_requests, self.scale, least)

    # -- what the checks are made of -------------------------------------

    def kvpool_line(self) -> VLLMLine:
        if self.line is None:
            raise ProofFailure(f"kvpool has no line for vLLM {self.version}")
        return self.line

    def pool_class(self, core: str | None = None) -> type:
        """kvpool's pool of the line over ``core`` (a name of ``cores``;
        default: the core in use) as ``install()`` puts it in."""
        line = self.kvpool_line()
        if core is None:
            return vllm_block_pool_class(line)
        if core not in self.cores:
            raise ProofFailure(f"kvpool's {core} core is not importable here")
        return vllm_block_pool_class(line, self.cores[core])

    def manager_declined(self) -> str | None:
        """Why kvpool's manager is not compared on this vLLM, or ``None``."""
        if self.line is None:
            return f"kvpool has no line for vLLM {self.version}"
        if self.line.manager is None:
            return f"kvpool's {self.line.name} line has no KV-cache manager"
        if "compiled" not in self.cores:
            return "kvpool's manager paths need the compiled core"
        return None

    def manager_class(self) -> type:
        """kvpool's ``KVCacheManager`` of the line."""
        reason = self.manager_declined()
        if reason is not None:
            raise ProofFailure(reason)
        return importlib.import_module(self.line.manager).KVCacheManager  # type: ignore[union-attr]

    def use_workload(self, key: str, patch: Patch) -> Any:
        """The workload ``key``, with the environment it runs in set on
        ``patch`` (raw-bytes event hashes for ``full-bytes-hashes``)."""
        if key == "full-bytes-hashes":
            patch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
        else:
            patch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
        return self.workloads[key]

    def forget(self, key: str) -> None:
        """Drop the reference run of ``key`` (its trace is large)."""
        self._reference.pop(key, None)

    def reference_run(self, key: str) -> Any:
        """vLLM's own manager and pool on workload ``key`` (once per suite),
        checked to exercise what the workload claims to; ``HarnessFailure``
        where it does not, or where the driver fails on this vLLM."""
        if key in self._reference:
            return self._reference[key]
        w = self.workloads[key]
        try:
            r = self.driver.run(w)
        except Exception as exc:
            raise HarnessFailure(
                f"vLLM {self.version}, workload {key}: the driver fails on vLLM's own manager "
                f"and pool ({type(exc).__name__}: {exc})") from exc
        self._check_reference(key, w, r)
        self._reference[key] = r
        return r

    def _check_reference(self, key: str, w: Any, r: Any) -> None:
        def claim(holds: bool, what: str) -> None:
            _check(holds, HarnessFailure,
                   f"vLLM {self.version}, workload {key}: vLLM's own run does not exercise "
                   f"{what}")

        claim(r.finished == w.num_requests,
              f"every request to the end ({r.finished} of {w.num_requests} finished)")
        claim(r.busy_resets_refused > 0, "a refused busy reset")
        claim(any(e[0] == "evict" for e in r.trace), "an eviction")
        if w.enable_caching:
            # (a Mamba model alone: a running request frees a block for each
            # it takes, and admissions wait for room, so nothing preempts it)
            claim(r.preemptions > 0 or all(g.kind == "mamba" for g in w.groups), "a preemption")
            claim(r.prefix_hit_tokens > 0, "a prefix-cache hit")
            claim(any(e[0] == "reset" and e[2] for e in r.trace), "an idle reset")
        if w.enable_events:
            claim(r.events > 0, "a KV event")
        if w.metrics_sample_rate:
            claim(any(e[0] == "step" and e[7] for e in r.trace), "an eviction sample")
        if key == "shared-running-prefix":
            claim(r.hits_on_blocks_in_use > 0, "a hit on a block in use")
        if key == "mamba-cow":
            claim(r.cow_copies > 0, "a copy on write")
        chunked = [i for i, g in enumerate(w.groups) if g.kind == "chunked"]
        if chunked:
            # Chunks left behind were freed: a finished request's chunked
            # table starts with a null block.
            claim(any(ids[:1] == [0] for ids in _finals(r, chunked[0])), "a freed chunk")
        mamba = [g for g in w.groups if g.kind == "mamba" and g.mamba_mode == "none"]
        if mamba:
            claim(r.preemptions > 0, "a preemption")
            finals = _finals(r, w.groups.index(mamba[0]))
            if mamba[0].block_size < w.max_model_len:
                # The blocks behind the last token were freed: a finished
                # request's table starts with a null block, and holds no
                # more than the state's two blocks (the last one, the one
                # being written) and its speculative ones.
                claim(any(ids[:1] == [0] for ids in finals), "a freed Mamba block")
                claim(all(len([b for b in ids if b]) <= 2 + mamba[0].speculative_blocks
                          for ids in finals), "Mamba tables of the state's blocks only")
            else:
                claim(all(len(ids) == 1 + mamba[0].speculative_blocks for ids in finals if ids),
                      "one Mamba state block a request")
        ring = [i for i, g in enumerate(w.groups) if g.kind in ("ring", "kpool-tail")]
        if ring:
            # One ring block a request, held to the end.
            finals = _finals(r, ring[0])
            claim(bool(finals) and all(len(ids) == 1 and ids[0] for ids in finals),
                  "one ring block a request")
        cross = [i for i, g in enumerate(w.groups) if g.kind == "cross"]
        if cross:
            # Encoder blocks held to the end, and allocated again for the
            # preempted requests.
            claim(any(_finals(r, cross[0])), "encoder blocks")
            claim(r.preemptions > 0, "a preemption")
        if any(g.kind == "rswa" for g in w.groups):
            # R-SWA freed gaps: a finished request's table holds a null
            # block (id 0) between two others.
            claim(any(0 in ids[1:] and any(ids[ids.index(0, 1):])
                      for e in r.trace if e[0] == "final" for ids in e[3]), "an R-SWA gap")
        if getattr(w, "spec_tokens", 0):
            # Drafts scheduled, some accepted, some rolled back.
            claim(0 < r.rejected_tokens < r.draft_tokens, "drafts both accepted and rejected")
        if getattr(w, "connector", False):
            claim(r.external_tokens > 0, f"external tokens ({r})")
            claim(r.async_loads > 0 and r.failed_loads > 0 and r.aborted_loads > 0,
                  f"asynchronous, failed and aborted loads ({r})")

    def candidate_run(self, pool_class: type, w: Any) -> Any:
        """vLLM's manager over ``pool_class`` on workload ``w``."""
        with pool_in_vllm(pool_class):
            built = type(self.driver.make_manager(w).block_pool)
            _check(built is pool_class, HarnessFailure,
                   f"vLLM {self.version}: the manager built a {built.__qualname__}, "
                   f"not the {pool_class.__qualname__} put in")
            return self.driver.run(w)

    def manager_run(self, manager_class: type, w: Any) -> tuple[Any, list]:
        """A run with kvpool's pool (compiled core) and ``manager_class``;
        the managers built."""
        managers: list = []
        with manager_in_vllm(manager_class, self.pool_class("compiled")):
            r = self.driver.run(w, on_manager=managers.append)
        _check(bool(managers) and all(type(m) is manager_class for m in managers),
               HarnessFailure,
               f"vLLM {self.version}: the scheduler's name did not build "
               f"{manager_class.__qualname__}")
        return r, managers

    def same(self, expected: Any, got: Any, label: str,
             failure: type[ProofFailure] = ProofFailure) -> None:
        """``failure`` naming the first difference between the two runs'
        traces, or their differing counters."""
        diff = first_difference(expected.trace, got.trace, self.event_fields)
        if diff:
            raise failure(f"vLLM {self.version}, {label}: {diff}")
        want, have = counters(expected), counters(got)
        if want != have:
            differ = {k: (have.get(k), want.get(k)) for k in want.keys() | have.keys()
                      if want.get(k) != have.get(k)}
            raise failure(f"vLLM {self.version}, {label}: the traces are equal, the counters "
                          f"differ (counter: (got, expected)): {differ}")

    # -- the checks, each a case -------------------------------------------

    def vllm_against_itself(self, key: str) -> Case:
        """vLLM's own pool, under another name, put in as kvpool's is: the
        same run as the reference."""

        def run(patch: Patch) -> None:
            from vllm.v1.core import block_pool as vllm_block_pool

            w = self.use_workload(key, patch)
            expected = self.reference_run(key)

            class VLLMBlockPool(vllm_block_pool.BlockPool):  # type: ignore[misc, valid-type]
                """vLLM's own pool, under another name: it must be the one built."""

            self.same(expected, self.candidate_run(VLLMBlockPool, w), "vLLM's pool again",
                      HarnessFailure)

        return self._case(f"vLLM against itself: {key}", run)

    def kvpool_against_vllm(self, key: str, core: str) -> Case:
        """kvpool's pool over ``core`` under vLLM's manager: the reference
        run."""

        def run(patch: Patch) -> None:
            w = self.use_workload(key, patch)
            expected = self.reference_run(key)
            pool_class = self.pool_class(core)
            self.same(expected, self.candidate_run(pool_class, w),
                      f"kvpool {self.kvpool_line().name} ({core})")

        return self._case(f"kvpool's pool ({core}) under vLLM's manager: {key}", run)

    def kvpool_manager_against_vllm(self, key: str) -> Case:
        """kvpool's manager over kvpool's pool against vLLM's manager over
        vLLM's pool: the same trace, events and counters; the compiled paths
        must have served the workload (or have refused it for the reason
        expected)."""

        def run(patch: Patch) -> None:
            w = self.use_workload(key, patch)
            manager_class = self.manager_class()
            expected = self.reference_run(key)
            got, managers = self.manager_run(manager_class, w)
            label = f"kvpool's {self.kvpool_line().name} manager"
            self.same(expected, got, label)
            for m in managers:
                self._check_served(key, w, got, m, manager_class, f"vLLM {self.version}, "
                                   f"{label}, workload {key}")

        return self._case(f"kvpool's manager against vLLM's: {key}", run)

    @staticmethod
    def _check_served(key: str, w: Any, got: Any, m: Any, manager_class: type,
                      where: str) -> None:
        """The compiled paths served manager ``m`` on workload ``w`` as they
        should (``ProofFailure`` naming what did not happen)."""

        def need(holds: bool, what: str, counts: Any = None) -> None:
            _check(holds, ProofFailure,
                   f"{where}: {what}" + ("" if counts is None else f" (counts: {counts})"))

        if key in FALLBACK:
            need(m._kvpool_plan is None and m.kvpool_fallback_reason == FALLBACK[key],
                 f"expected the fallback {FALLBACK[key]!r}, got {m.kvpool_fallback_reason!r}")
            return
        need(m.kvpool_fallback_reason is None,
             f"fell back to vLLM's code: {m.kvpool_fallback_reason}")
        if key in SPEC_WORKLOADS:
            # (lookahead hashes: no EAGLE drop, as the scheduler builds it)
            need(m.use_eagle == (w.eagle and not w.num_hash_lookahead_tokens),
                 f"use_eagle is {m.use_eagle}")
            lookahead = getattr(m.block_pool, "num_hash_lookahead_tokens", 0)
            need(lookahead == w.num_hash_lookahead_tokens,
                 f"the pool's num_hash_lookahead_tokens is {lookahead}, "
                 f"not {w.num_hash_lookahead_tokens}")
        counts = m._kvpool_plan.counts
        if getattr(w, "connector", False):
            # External tokens adopted in C.
            need(counts["external"] > 0, "no external tokens adopted in C", counts)
        need(counts["fast"] > counts["base"], "more calls in vLLM's code than in C", counts)
        if any(g.kind == "mamba" and g.mamba_mode == "align" for g in w.groups):
            # A Mamba group in "align" mode: every allocate_slots call is
            # done in C -- hits adopted on admission, and a hit ending inside
            # a block (a partial hit, where a block is larger than the hash
            # block) copied on write, a new request's or a running one's
            # after its prompt-tail step. Every lookup is done in C too
            # beside one full-attention spec (issue 52): the hybrid
            # coordinator's pass over full attention and Mamba, each at its
            # own block; none is handed to vLLM's method.
            looked_up = [g for g in w.groups if g.kind not in ("ring", "kpool-tail")]
            if [g.kind for g in looked_up].count("full") == 1 and all(
                    g.kind in ("full", "mamba") for g in looked_up):
                need(counts["lookups"] > 0 and counts["lookups_base"] == 0,
                     "a lookup in vLLM's code, or none in C", counts)
                need(got.prefix_hit_tokens > 0, f"no prefix-cache hit ({got})")
            else:
                need(counts["lookups"] == 0, "a lookup in C (these groups: vLLM's code)", counts)
            need(counts["base"] == 0 and counts["adopt"] > 0,
                 "an allocation in vLLM's code, or no hit adopted in C", counts)
            # The driver's remaining-blocks count (the scheduler's
            # _request_remaining_blocks) with the align predictor, in C.
            need(counts["coord_counts"] > 0 and counts["coord_base"] == 0,
                 "a remaining-blocks count in vLLM's code, or none in C", counts)
            # (partial hits: a Mamba block larger than the hash block)
            if any(g.kind == "mamba" and g.block_size > w.hash_block_size for g in w.groups):
                need(counts["cow"] > 0, "no copy on write in C", counts)
            # Its caching steps done in C too (issue 52): the coordinator's
            # never called, the state blocks cached from C -- under sparse
            # retention with the block mask built in C -- and no tail step
            # handed to a manager's own method.
            need(counts["cache_calls"] == 0 and counts["mamba_cache"] > 0,
                 "a caching step in the coordinator's code, or none in C", counts)
            need(counts["mamba_tail_calls"] == counts["full_tail_calls"] == 0,
                 "a tail step in vLLM's code", counts)
            if getattr(w, "retention_interval", None) is not None:
                need(counts["sparse_masks"] > 0, "no sparse-retention block mask built", counts)
        elif any(g.kind == "mamba" for g in w.groups) and w.enable_caching:
            # ... in 0.30/0.31's mode "all": the steps of running requests
            # in C, blocks cached in C (issue 52); an admission
            # with a hit (there are hits) vLLM's code, and so is every
            # lookup.
            need(got.prefix_hit_tokens > 0, f"no prefix-cache hit ({got})")
            need(counts["adopt"] == 0 and counts["lookups"] == 0,
                 "a hit adopted or looked up in C (Mamba 'all': vLLM's code)", counts)
            need(counts["base"] > 0, "no admission in vLLM's code", counts)
            # ... its caching steps in C (issue 52): none the coordinator's.
            need(counts["cache_calls"] == 0 and counts["mamba_cache"] > 0,
                 "a caching step in the coordinator's code, or none in C", counts)
        elif w.enable_caching:
            # Prefix-cache hits adopted, blocks cached (by the pool directly,
            # or through vLLM's coordinator).
            need(counts["adopt"] > 0, "no hit adopted in C", counts)
            need(counts["cache_calls"] + counts["cache_direct"] > 0, "no block cached", counts)
            # Every block the lookup reads the hash block: the prefix-cache
            # lookups are done in C (one full-attention group, or full + a
            # sliding window or chunked local attention, with EAGLE's drop
            # and the window's extra block; a circular buffer's group takes
            # no part, and beside full attention alone its block may make
            # the hits' alignment coarser); with another block size, or two
            # full-attention specs (vLLM's fixed-point loop), by vLLM's code.
            looked_up = [g for g in w.groups if g.kind not in ("ring", "kpool-tail")]
            if all(g.block_size == w.hash_block_size for g in looked_up) and (
                    len(looked_up) == 1
                    or w.scheduler_block_size == w.hash_block_size) and (
                    sum(g.kind == "full" for g in looked_up) <= 1):
                need(counts["lookups"] > 0, "no lookup in C", counts)
            else:
                need(counts["lookups"] == 0, "a lookup in C (these groups: vLLM's code)", counts)
            if [(g.kind, g.block_size) for g in w.groups] == [("full", w.hash_block_size)]:
                # ... and with events, the BlockStored of a request without
                # LoRA is built in C (every 7th has one: the line's own
                # builder), its lookahead tokens too.
                if w.enable_events:
                    need(counts["plain_events"] > 0, "no BlockStored built in C", counts)
            # A full-attention block larger than the hash block may register
            # a partial tail on any step: vLLM's code decides.
            if not any(g.kind == "full" and g.block_size != w.hash_block_size
                       for g in w.groups):
                need(counts["cache_skips"] > 0, "no caching step skipped in C", counts)
            # 0.30, 0.31: the scheduler's once-a-step common-prefix count
            # (the driver asks it every step) is done in C.
            if manager_class._kvpool_common_prefix_blocks is not None:
                need(counts["common_prefix"] > 0, "no common-prefix count in C", counts)

    def broken_pool_caught(self, base: str, fault: str) -> Case:
        """The comparison is not vacuous on this vLLM: ``base``'s pool
        (``"vllm"`` or ``"kvpool"``, the core in use) with the planted
        ``fault`` (``BROKEN_POOLS``) fails it, and the report names the first
        difference; the unbroken pool passes on the same workload."""

        def run(patch: Patch) -> None:
            from vllm.v1.core import block_pool as vllm_block_pool

            breakage, where = BROKEN_POOLS[fault]
            pool_class = vllm_block_pool.BlockPool if base == "vllm" else self.pool_class()
            w = self.use_workload("full", patch).scaled(num_requests=self.n(150))
            expected = self.driver.run(w)
            broken = self.candidate_run(breakage(pool_class), w)
            diff = first_difference(expected.trace, broken.trace)
            _check(diff is not None, HarnessFailure,
                   f"vLLM {self.version}: {breakage.__name__} over {base}'s pool went unnoticed")
            _check(where in diff, HarnessFailure,  # type: ignore[operator]
                   f"vLLM {self.version}: {breakage.__name__} over {base}'s pool: the report "
                   f"does not say {where!r}:\n{diff}")
            diff = first_difference(expected.trace, self.candidate_run(pool_class, w).trace)
            _check(diff is None, HarnessFailure if base == "vllm" else ProofFailure,
                   f"vLLM {self.version}, {base}'s pool unbroken: {diff}")

        owner = {"vllm": "vLLM's", "kvpool": "kvpool's"}[base]
        return self._case(f"a broken pool is caught: {fault} over {owner} pool", run)

    def broken_manager_caught(self) -> Case:
        """The manager comparison is not vacuous: kvpool's manager broken in
        one detail (``broken_manager``) fails it; unbroken it passes."""

        def run(patch: Patch) -> None:
            manager_class = self.manager_class()
            w = self.use_workload("full", patch).scaled(num_requests=self.n(150))
            expected = self.driver.run(w)
            broken, _ = self.manager_run(broken_manager(manager_class), w)
            diff = first_difference(expected.trace, broken.trace)
            _check(diff is not None, HarnessFailure,
                   f"vLLM {self.version}: a manager that skips caching went unnoticed")
            good, _ = self.manager_run(manager_class, w)
            diff = first_difference(expected.trace, good.trace)
            _check(diff is None, ProofFailure,
                   f"vLLM {self.version}, kvpool's manager unbroken: {diff}")

        return self._case("a broken manager is caught", run)

    def _case(self, name: str, run: Callable[[Patch], None]) -> Case:
        def quiet(patch: Patch) -> None:
            with quiet_pools():
                run(patch)

        return Case(name, quiet)

    def cases(self, cores: tuple[str, ...] = PROVE_CORES) -> list[Case]:
        """Every check, workload by workload (each workload's reference run
        dropped after its last check), then the planted faults."""
        manager = self.manager_declined() is None
        out: list[Case] = []
        for key in self.workloads:
            checks = [self.vllm_against_itself(key)]
            if self.line is not None:
                checks += [self.kvpool_against_vllm(key, core) for core in cores]
            if manager:
                checks.append(self.kvpool_manager_against_vllm(key))
            out += checks[:-1]
            out.append(self._then_forget(checks[-1], key))
        bases = ("vllm", "kvpool") if self.line is not None else ("vllm",)
        out += [self.broken_pool_caught(base, fault) for base in bases for fault in BROKEN_POOLS]
        if manager:
            out.append(self.broken_manager_caught())
        return out

    def _then_forget(self, case: Case, key: str) -> Case:
        def run(patch: Patch) -> None:
            try:
                case.run(patch)
            finally:
                self.forget(key)

        return Case(case.name, run)


def cases(line: VLLMLine, *, cores: tuple[str, ...] = PROVE_CORES,
          scale: float | None = None) -> list[Case]:
    """What ``--prove`` runs on ``line``: ``Suite(line, scale=scale).cases(cores)``."""
    return Suite(line, scale=scale).cases(cores)
