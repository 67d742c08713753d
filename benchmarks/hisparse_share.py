"""How much of a HiSparse KV-cache manager's scheduler-side time is vLLM's
separate Python objects (HiSparseCoordinator, the host pool, the connector)
rather than the manager/pool code kvpool compiles.

Builds, from the release's own code, on CPU (no model, no GPU, no worker):
  * the HiSparse group list with ``vllm.v1.hisparse.layout._lay_out_hisparse_groups``
    over DeepSeek-V3.2-like sparse-MLA + indexer specs (``--layout dsv32``), or
    the 4-group layout of the release's tests/v1/core/test_prefix_caching.py
    (``--layout min``);
  * the scheduler's KVCacheConfig (``generate_scheduler_kv_cache_config``);
  * vLLM's KVCacheManager over it (``--kvpool``: kvpool's, as
    ``kvpool.vllm.enabled()`` makes the scheduler build it), its
    HiSparseCoordinator bound through ``get_hisparse_coordinator`` (what
    HiSparseConnector.bind_kv_cache_manager does), and vLLM's
    ``HiSparseConnectorScheduler`` bound to that coordinator;
then drives it as the scheduler does: new_step_starts, allocate_slots for the
running requests (preempting from the back), get_computed_blocks +
allocate_slots for admissions, the connector's build_connector_meta every step,
take_new_block_ids, update_connector_output with every planned page transfer
and host copy reported done, free of finished requests, take_events.

Time is charged to the innermost of these categories (exclusive time):
  coord       HiSparseCoordinator methods (vllm/v1/hisparse/coordinator.py)
  host_pool   the Source group's private host pool (vLLM's
              SharedEventQueueBlockPool, a BlockPool subclass)
  conn        HiSparseConnectorScheduler's own code
  hs_mgr      the HiSparse single-type managers' own (overriding) methods
  base_mgr    SingleTypeKVCacheManager / FullAttentionManager methods
  dev_pool    the device pool
  kcm         the rest: KVCacheManager, the hybrid KVCacheCoordinator, ...
Modes: default, a perf_counter wrapper on every method of those classes (its
calibrated cost subtracted); ``--lean``, wrappers on coord/host_pool/conn
only (their time then includes the manager/pool code they call back into);
``--sample S``, no method wrappers, a SIGPROF sampler every S seconds of CPU
time that charges each sample to the innermost frame of a classified method
(frames of unclassified helpers count to the classified frame that called
them). ``--no-instrument``: only the outer manager/connector calls are timed.

Why kvpool leaves the HiSparse managers on vLLM's code
(docs/manager.md#scope-and-fallbacks): the share of vLLM's separate objects
bounds what any compiled manager could save. Run in vLLM 0.33.0's overlay
environment with a release's tree first on ``PYTHONPATH`` (as the manager
benchmark; no GPU, no model)::

    PYTHONPATH=$(bash .ci/vllm-src.sh 0.34.0):. python benchmarks/hisparse_share.py \
        --sample 0.001 --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import inspect
import math
import random
import signal
import sys
import time
from collections import Counter, defaultdict
from types import SimpleNamespace

ap = argparse.ArgumentParser()
ap.add_argument("--layout", choices=["dsv32", "min"], default="dsv32")
ap.add_argument("--layers", type=int, default=61)
ap.add_argument("--block-size", type=int, default=64)
ap.add_argument("--requests", type=int, default=300)
ap.add_argument("--prefixes", type=int, default=8)
ap.add_argument("--prefix-tokens", type=int, default=2048)
ap.add_argument("--suffix", type=int, nargs=2, default=[128, 1024])
ap.add_argument("--output", type=int, nargs=2, default=[16, 64])
ap.add_argument("--max-seqs", type=int, default=32)
ap.add_argument("--budget", type=int, default=4096)
ap.add_argument("--max-model-len", type=int, default=8192)
ap.add_argument("--num-blocks", type=int, default=6144)
ap.add_argument("--host-blocks", type=int, default=16384)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--rounds", type=int, default=1,
                help="run the workload this many times, each on a fresh manager")
mode = ap.add_mutually_exclusive_group()
mode.add_argument("--no-instrument", action="store_true")
mode.add_argument("--lean", action="store_true")
mode.add_argument("--sample", type=float, default=0.0, metavar="SECONDS")
ap.add_argument("--kvpool", action="store_true",
                help="build kvpool's KVCacheManager (and pool) as the scheduler would "
                     "under kvpool.vllm.enabled(); print its kvpool_fallback_reason")
args = ap.parse_args()
WRAPPERS = not (args.no_instrument or args.sample)

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.config.attention import HiSparseConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (  # noqa: E402
    HiSparseConnectorScheduler,
    HiSparseConnectorWorkerMetadata,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core import block_pool as vbp  # noqa: E402
from vllm.v1.core import kv_cache_coordinator as kcc  # noqa: E402
from vllm.v1.core import kv_cache_manager as kcm_mod  # noqa: E402
from vllm.v1.core import single_type_kv_cache_manager as stm  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.hisparse import coordinator as hcoord  # noqa: E402
from vllm.v1.hisparse import layout as hlayout  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupRole,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    SparseCacheRole,
    UniformTypeKVCacheSpecs,
)
from vllm.v1.request import Request  # noqa: E402

BS = args.block_size
print(f"vllm {vllm.__version__} from {vllm.__file__}")
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"cuda available: {torch.cuda.is_available()}")
print("args:", " ".join(sys.argv[1:]) or "(defaults)")


# ---------------------------------------------------------------- layout
def where(e):
    tb = e.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def mla(**kw):
    names = set(MLAAttentionSpec.__dataclass_fields__)
    return MLAAttentionSpec(**{k: v for k, v in kw.items() if k in names})


stub = SimpleNamespace(
    attention_config=SimpleNamespace(hisparse_config=HiSparseConfig()),
    model_config=SimpleNamespace(hf_config=SimpleNamespace(index_topk=2048),
                                 max_model_len=args.max_model_len),
    speculative_config=None,
    parallel_config=SimpleNamespace(
        tensor_parallel_size=1, pipeline_parallel_size=1,
        prefill_context_parallel_size=1, decode_context_parallel_size=1,
        world_size=1, distributed_executor_backend="mp", nnodes_within_dp=1),
    cache_config=SimpleNamespace(prefix_cache_retention_interval=None),
    kv_transfer_config=None,
)

if args.layout == "dsv32":
    # DeepSeek-V3.2-like: per layer one sparse-MLA cache (fp8_ds_mla, 656
    # bytes/token) leading its own indexer, and one indexer cache (132
    # bytes/token), with the roles deepseek_v2.py gives them.
    specs = {}
    for i in range(args.layers):
        specs[f"model.layers.{i}.self_attn.attn"] = mla(
            block_size=BS, num_kv_heads=1, head_size=656, dtype=torch.uint8,
            cache_dtype_str="fp8_ds_mla", topk_buffer_width=2048,
            is_index_group_leader=True)
    for i in range(args.layers):
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = mla(
            block_size=BS, num_kv_heads=1, max_tp_shards=1, head_size=132,
            dtype=torch.uint8, cache_role=SparseCacheRole.INDEXER)
    mla_group = KVCacheGroupSpec(list(specs), UniformTypeKVCacheSpecs.from_specs(specs))
    if hasattr(hlayout, "_lay_out_hisparse_groups"):  # 0.31 on
        groups = hlayout._lay_out_hisparse_groups(stub, [mla_group])
    else:  # 0.30: create_hisparse_layout lays the groups out
        _lay = hlayout.create_hisparse_layout(
            stub, [mla_group], args.host_blocks * 656 * BS * args.layers)
        groups = [_lay.source_group, *_lay.device_groups]
        print("create_hisparse_layout (0.30: it lays the groups out): ok on this platform")
    try:
        if not hasattr(hlayout, "_lay_out_hisparse_groups"):
            raise StopIteration
        hlayout.create_hisparse_layout(
            stub, groups, args.host_blocks * 656 * BS * args.layers)
        print("create_hisparse_layout: ok on this platform")
    except StopIteration:
        pass
    except Exception as e:  # noqa: BLE001
        print(f"create_hisparse_layout raised {type(e).__name__}: {e} [{where(e)}]")
    cfg = generate_scheduler_kv_cache_config([KVCacheConfig(
        num_blocks=args.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
        hisparse_host_num_blocks=args.host_blocks)])
else:
    # tests/v1/core/test_prefix_caching.py::make_hisparse_kv_cache_config
    src = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    cfg = KVCacheConfig(
        num_blocks=args.num_blocks, kv_cache_tensors=[],
        hisparse_host_num_blocks=args.host_blocks,
        kv_cache_groups=[
            KVCacheGroupSpec(["source"], src, role=KVCacheGroupRole.HISPARSE_SOURCE,
                             host_resident=True),
            KVCacheGroupSpec(["indexer"], src, enable_kv_transfer=False,
                             role=KVCacheGroupRole.HISPARSE_INDEXER),
            KVCacheGroupSpec(["resident"], HiSparseResidentSpec(block_size=BS, page_size=BS * 4),
                             enable_kv_transfer=False),
            KVCacheGroupSpec(["hot"], HiSparseHotSpec(block_size=BS, page_size=BS * 4,
                                                      blocks_per_request=2 * 2048 // BS),
                             enable_kv_transfer=False),
        ])

init_none_hash(sha256)
Manager = kcm_mod.KVCacheManager
if args.kvpool:
    import os

    import kvpool
    import kvpool.vllm as kv_vllm
    os.environ["KVPOOL_VLLM_MANAGER"] = "1"
    _kv_ctx = kv_vllm.enabled()
    _kv_ctx.__enter__()
    from vllm.v1.core.sched import scheduler as _vsched
    Manager = _vsched.KVCacheManager
    print(f"kvpool from {kvpool.__file__}, extension: {kvpool.USING_EXTENSION}; "
          f"manager class {Manager.__module__}.{Manager.__qualname__}")


def build():
    mgr = Manager(cfg, max_model_len=args.max_model_len, scheduler_block_size=BS,
                  hash_block_size=BS, enable_caching=True)
    coord = hcoord.get_hisparse_coordinator(mgr)
    conn = HiSparseConnectorScheduler(async_speculative=False)
    conn.bind_coordinator(coord)
    return mgr, coord, conn


def describe(mgr, coord):
    stms = mgr.coordinator.single_type_managers
    if args.kvpool:
        print(f"kvpool_fallback_reason: {getattr(mgr, 'kvpool_fallback_reason', '<none>')!r}")
    print(f"kv cache coordinator: {type(mgr.coordinator).__name__}; "
          f"{len(cfg.kv_cache_groups)} groups:")
    for gid, (g, m) in enumerate(zip(cfg.kv_cache_groups, stms)):
        extra = ""
        if hasattr(m.kv_cache_spec, "blocks_per_request"):
            extra = f" blocks_per_request={m.kv_cache_spec.blocks_per_request}"
        print(f"  {gid:2d} {type(g.kv_cache_spec).__name__:22s} "
              f"role={getattr(g, 'role', None)!s:17s} layers={len(g.layer_names):3d} -> "
              f"{type(m).__name__} pool={'host' if m.block_pool is not mgr.block_pool else 'device'}"
              f"{extra}")
    hp, dp = coord.host_manager.block_pool, mgr.block_pool
    print(f"device pool {type(dp).__module__}.{type(dp).__name__} {dp.num_gpu_blocks} blocks; "
          f"host pool {type(hp).__module__}.{type(hp).__name__} {hp.num_gpu_blocks} blocks; "
          f"transition_watermark {coord.transition_watermark}")


# ---------------------------------------------------------------- classification
CATS = ["coord", "host_pool", "conn", "hs_mgr", "base_mgr", "dev_pool", "kcm"]
CLASS_CATS = [(hcoord.HiSparseCoordinator, "coord"), (HiSparseConnectorScheduler, "conn")]
CLASS_CATS += [(c, "hs_mgr") for c in (stm.HiSparseSourceManager, stm._HiSparseAuxiliaryManager,
                                       stm.HiSparseHotManager, stm.HiSparseResidentManager)]
CLASS_CATS += [(c, "base_mgr") for c in (stm.SingleTypeKVCacheManager, stm.FullAttentionManager)]
CLASS_CATS += [(c, "kcm") for c in vars(kcc).values()
               if inspect.isclass(c) and c.__module__ == kcc.__name__]
CLASS_CATS += [(c, "kcm") for c in vars(kcm_mod).values()
               if inspect.isclass(c) and c.__module__ == kcm_mod.__name__]
POOL_CLASSES = [c for c in type(build()[0].block_pool).__mro__ if c is not object]
POOL_CLASSES += [c for c in vbp.BlockPool.__mro__ if c is not object and c not in POOL_CLASSES]
from vllm.v1.hisparse.block_pool import SharedEventQueueBlockPool  # noqa: E402
POOL_CLASSES.append(SharedEventQueueBlockPool)


def functions_of(cls):
    for name, v in vars(cls).items():
        if isinstance(v, property):
            for f in (v.fget, v.fset):
                if f is not None:
                    yield name, "property", v, f
        elif isinstance(v, (classmethod, staticmethod)):
            yield name, type(v).__name__, v, v.__func__
        elif inspect.isfunction(v):
            yield name, "function", v, v


# ---------------------------------------------------------------- timers
_pc = time.perf_counter
STACK: list[list] = []           # [category, segment start, root]
EXCL: dict = defaultdict(float)  # (root, category) -> seconds
NCALL: Counter = Counter()       # (root, category) -> calls
NCHILD: Counter = Counter()      # (root, category) -> wrapped calls it made
OUTER: dict = defaultdict(float)  # root -> inclusive seconds
OUTER_N: Counter = Counter()


def wrap(fn, cat, root_name=None):
    def w(*a, **k):
        now = _pc()
        st = STACK
        if st:
            top = st[-1]
            EXCL[(top[2], top[0])] += now - top[1]
            root = top[2]
            NCHILD[(root, top[0])] += 1
        else:
            root = root_name or cat
        st.append([cat, now, root])
        NCALL[(root, cat)] += 1
        try:
            return fn(*a, **k)
        finally:
            end = _pc()
            c, s, r = st.pop()
            EXCL[(r, c)] += end - s
            if st:
                st[-1][1] = end
            else:
                OUTER[root] += end - now
                OUTER_N[root] += 1
    w.__wrapped__ = fn
    return w


def wrap_class(cls, cat):
    for name, kind, v, f in list(functions_of(cls)):
        if name.startswith("__"):
            continue
        if kind == "property":
            setattr(cls, name, property(wrap(v.fget, cat) if v.fget else None, v.fset, v.fdel))
        elif kind == "classmethod":
            setattr(cls, name, classmethod(wrap(f, cat)))
        elif kind == "staticmethod":
            setattr(cls, name, staticmethod(wrap(f, cat)))
        else:
            setattr(cls, name, wrap(f, cat))


def wrap_instance(obj, cat):
    for klass in type(obj).__mro__:
        if klass is object:
            continue
        for name, v in vars(klass).items():
            if name.startswith("__") or not inspect.isfunction(v) or name in vars(obj):
                continue
            try:
                setattr(obj, name, wrap(getattr(obj, name), cat))
            except (AttributeError, TypeError):
                print(f"(cannot wrap {type(obj).__name__}.{name} on the instance)")
                return


MGR_CALLS = ["new_step_starts", "allocate_slots", "get_computed_blocks", "free",
             "take_events", "take_new_block_ids"]
CONN_CALLS = ["build_connector_meta", "update_connector_output"]


def instrument(mgr, coord, conn):
    if WRAPPERS:
        wrap_instance(coord.host_manager.block_pool, "host_pool")
        if not args.lean:
            wrap_instance(mgr.block_pool, "dev_pool")
    for name in MGR_CALLS:
        setattr(mgr, name, wrap(getattr(mgr, name), "kcm", f"mgr.{name}"))
    for name in CONN_CALLS:
        setattr(conn, name, wrap(getattr(conn, name), "conn", f"conn.{name}"))


if WRAPPERS:
    for cls, cat in CLASS_CATS:
        if args.lean and cat not in ("coord", "conn"):
            continue
        if cat == "conn":
            continue  # its two entry points are wrapped as roots
        wrap_class(cls, cat)


def _noop():
    return None


def calibrate(k=200, m=500):
    """What one wrapped call adds to its own category (c_in) and to its
    caller's (c_out), beyond a plain call."""
    child = wrap(_noop, "cal_in")
    r = range(k)

    def empty():
        for _ in r:
            pass

    def plain():
        for _ in r:
            _noop()

    def nested():
        for _ in r:
            child()
    pe, p0, p1 = (wrap(f, "cal_out", n) for f, n in
                  ((empty, "cale"), (plain, "cal0"), (nested, "cal1")))
    best = None
    for _ in range(5):
        for key in list(EXCL):
            if key[0] in ("cale", "cal0", "cal1"):
                EXCL[key] = 0.0
        for f in (pe, p0, p1):
            for _ in range(m):
                f()
        n = k * m
        call = (EXCL[("cal0", "cal_out")] - EXCL[("cale", "cal_out")]) / n
        c_in = EXCL[("cal1", "cal_in")] / n - call
        c_out = (EXCL[("cal1", "cal_out")] - EXCL[("cale", "cal_out")]) / n
        if best is None or c_in + c_out < best[0] + best[1]:
            best = (c_in, c_out)
    for d in (EXCL, NCALL, NCHILD, OUTER, OUTER_N):
        for key in [key for key in d if (key[0] if isinstance(key, tuple) else key)
                    in ("cale", "cal0", "cal1", "cal_out", "cal_in")]:
            del d[key]
    return best


C_IN, C_OUT = calibrate() if WRAPPERS else (0.0, 0.0)

# ---------------------------------------------------------------- sampler
SAMPLES: Counter = Counter()     # (root, category) -> samples
CODE_CAT: dict = {}
POOL_CODES: set = set()
ROOT_CODES: dict = {}
if args.sample:
    for cls, cat in CLASS_CATS:
        for name, kind, v, f in functions_of(cls):
            CODE_CAT.setdefault(f.__code__, cat)
    for cls in POOL_CLASSES:
        for name, kind, v, f in functions_of(cls):
            POOL_CODES.add(f.__code__)
    for name in MGR_CALLS:
        ROOT_CODES[getattr(kcm_mod.KVCacheManager, name).__code__] = f"mgr.{name}"
        f = getattr(Manager, name)
        if hasattr(f, "__code__"):
            ROOT_CODES[f.__code__] = f"mgr.{name}"
    for name in CONN_CALLS:
        ROOT_CODES[getattr(HiSparseConnectorScheduler, name).__code__] = f"conn.{name}"
    HOST_POOL = [None]

    def on_sample(signum, frame):
        cat = None
        root = None
        f = frame
        while f is not None:
            code = f.f_code
            if cat is None:
                if code in POOL_CODES:
                    cat = "host_pool" if f.f_locals.get("self") is HOST_POOL[0] else "dev_pool"
                else:
                    cat = CODE_CAT.get(code)
            r = ROOT_CODES.get(code)
            if r is not None:
                root = r
            f = f.f_back
        if root is None:
            root = "driver"
        SAMPLES[(root, cat or "other")] += 1


# ---------------------------------------------------------------- workload
def run_workload(mgr, coord, conn, seed):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 30000) for _ in range(args.prefix_tokens)]
                for _ in range(args.prefixes)]
    hasher = get_request_block_hasher(BS, sha256)

    def make_request(i):
        prompt = list(prefixes[i % args.prefixes]) + [
            rng.randrange(1, 30000) for _ in range(rng.randint(*args.suffix))]
        sp = SamplingParams(max_tokens=rng.randint(*args.output), ignore_eos=True)
        return Request(request_id=f"r{i}", prompt_token_ids=prompt, sampling_params=sp,
                       pooling_params=None, block_hasher=hasher)

    waiting = [make_request(i) for i in range(args.requests)]
    running: list = []
    stats = Counter()
    gc.collect()
    gc.disable()
    if args.sample:
        signal.setitimer(signal.ITIMER_PROF, args.sample, args.sample)
    cpu0 = time.process_time()
    t_start = _pc()
    while waiting or running:
        stats["steps"] += 1
        mgr.new_step_starts()
        budget = args.budget
        scheduled: dict[str, int] = {}
        start_tokens: dict[str, int] = {}
        new_reqs, cached_ids, cached_new_ids = [], [], []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            blocks = mgr.allocate_slots(req, n)
            if blocks is None:
                victim = running.pop()
                mgr.free(victim)
                conn.requests.pop(victim.request_id, None)
                victim.num_computed_tokens = 0
                waiting.insert(0, victim)
                stats["preemptions"] += 1
                preempted = True
                if victim is req:
                    break
                continue
            scheduled[req.request_id] = n
            start_tokens[req.request_id] = req.num_computed_tokens
            cached_ids.append(req.request_id)
            cached_new_ids.append(blocks.get_block_ids(allow_none=True))
            budget -= n
            i += 1
        while not preempted and waiting and len(running) < args.max_seqs and budget > 0:
            req = waiting[0]
            computed, num_computed, _ = mgr.get_computed_blocks(req)
            n = min(req.num_tokens - num_computed, budget)
            blocks = mgr.allocate_slots(req, n, num_new_computed_tokens=num_computed,
                                        new_computed_blocks=computed)
            if blocks is None:
                stats["admission_refused"] += 1
                break
            waiting.pop(0)
            running.append(req)
            conn.requests[req.request_id] = req       # update_state_after_alloc
            stats["admitted"] += 1
            stats["hit_tokens"] += num_computed
            stats["prompt_tokens"] += req.num_prompt_tokens
            req.num_computed_tokens = num_computed
            scheduled[req.request_id] = n
            start_tokens[req.request_id] = num_computed
            new_reqs.append(SimpleNamespace(req_id=req.request_id,
                                            num_computed_tokens=num_computed,
                                            block_ids=mgr.get_block_ids(req.request_id)))
            budget -= n
        out = SimpleNamespace(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=SimpleNamespace(
                req_ids=cached_ids,
                num_computed_tokens=[start_tokens[r] for r in cached_ids],
                new_block_ids=cached_new_ids),
            num_scheduled_tokens=dict(scheduled),
            has_sync_kv_loads=False)
        meta = conn.build_connector_meta(out)
        mgr.take_new_block_ids()
        finished = []
        by_id = {r.request_id: r for r in running}
        for rid, n in scheduled.items():
            req = by_id[rid]
            req.num_computed_tokens += n
            if req.num_computed_tokens >= req.num_tokens:
                req.append_output_token_ids(rng.randrange(1, 30000))
                stats["output_tokens"] += 1
                if req.num_output_tokens >= req.sampling_params.max_tokens:
                    finished.append(req)
        transfers = meta.command.page_transfers if meta.command is not None else []
        counts = {t.transfer_id: 1 for t in transfers}
        stats["page_transfers"] += len(transfers)
        stats["host_copies"] += len(meta.host_block_copies)
        conn.update_connector_output(SimpleNamespace(
            finished_recving=None, failed_recving=set(),
            kv_connector_worker_meta=HiSparseConnectorWorkerMetadata(
                enqueued_transfer_counts=counts, completed_transfer_counts=counts,
                completed_host_copy_dst_ids=tuple(
                    c.dst_block_id for c in meta.host_block_copies))))
        for req in finished:
            running.remove(req)
            conn.requests.pop(req.request_id, None)
            mgr.free(req)
        mgr.take_events()
    wall = _pc() - t_start
    cpu = time.process_time() - cpu0
    if args.sample:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
    gc.enable()
    stats["host_free_end"] = coord.host_manager.block_pool.get_num_free_blocks()
    stats["dev_free_end"] = mgr.block_pool.get_num_free_blocks()
    return stats, wall, cpu


if args.sample:
    signal.signal(signal.SIGPROF, on_sample)
all_stats = []
for rnd in range(args.rounds):
    mgr, coord, conn = build()
    if rnd == 0:
        describe(mgr, coord)
    instrument(mgr, coord, conn)
    if args.sample:
        HOST_POOL[0] = coord.host_manager.block_pool
    stats, wall, cpu = run_workload(mgr, coord, conn, args.seed)
    all_stats.append(stats)
    print(f"round {rnd}: driver wall {wall:.3f} s, cpu {cpu:.3f} s; "
          + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())))
assert all(s == all_stats[0] for s in all_stats), "rounds made different decisions"

# ---------------------------------------------------------------- report
print(f"\nworkload: {args.requests} requests, {args.prefixes} shared prefixes of "
      f"{args.prefix_tokens} tokens, suffix {args.suffix}, output {args.output}, "
      f"block {BS}, max_seqs {args.max_seqs}, budget {args.budget}; layout {args.layout}; "
      f"{args.rounds} round(s)")
if WRAPPERS:
    print(f"wrapper cost calibrated at {(C_IN + C_OUT) * 1e6:.2f} us per wrapped call "
          f"({C_IN * 1e6:.2f} to its own category, {C_OUT * 1e6:.2f} to its caller's); "
          "corrected figures subtract these per call")

print("outer calls (inclusive, all rounds):")
for k in sorted(OUTER, key=lambda k: -OUTER[k]):
    if k.startswith(("mgr.", "conn.")):
        print(f"  {k:28s} {OUTER_N[k]:7d} calls {OUTER[k]:8.4f} s "
              f"{OUTER[k] / OUTER_N[k] * 1e6:8.1f} us/call")
T_mgr = sum(v for k, v in OUTER.items() if k.startswith("mgr."))
T_conn = sum(v for k, v in OUTER.items() if k.startswith("conn."))
print(f"  manager calls total {T_mgr:.4f} s; connector calls total {T_conn:.4f} s")

mgr_roots = {f"mgr.{n}" for n in MGR_CALLS}
conn_roots = {f"conn.{n}" for n in CONN_CALLS}


def summarize(title, tot, unit, extra=None):
    T = sum(tot.values())
    if not T:
        return
    print(f"\n{title}: {T:.4f} {unit}")
    for c in CATS + ["other"]:
        if tot.get(c):
            e = extra(c) if extra else ""
            print(f"  {c:10s} {tot[c]:10.4f} {unit} {100 * tot[c] / T:6.1f}%{e}")
    py = tot.get("coord", 0) + tot.get("host_pool", 0) + tot.get("conn", 0)
    if args.sample:
        p = py / T
        half = 1.96 * math.sqrt(p * (1 - p) / T)
        print(f"  vLLM's separate objects (coord + host_pool + conn): {100 * p:.1f}% "
              f"(95% binomial interval {100 * (p - half):.1f}-{100 * (p + half):.1f}%) -> "
              f"Amdahl bound if everything else took no time: {1 / p:.2f}x "
              f"({1 / (p + half):.2f}-{1 / max(p - half, 1e-9):.2f}x)")
    else:
        print(f"  vLLM's separate objects (coord + host_pool + conn): {100 * py / T:.1f}% -> "
              f"Amdahl bound if everything else took no time: {T / py if py else float('inf'):.2f}x")
    if not args.lean and tot.get("hs_mgr"):
        py2 = py + tot["hs_mgr"]
        print(f"  ... and with the HiSparse managers' own overrides (hs_mgr) also left: "
              f"{100 * py2 / T:.1f}% -> bound {T / py2:.2f}x")


for title, roots in (("inside manager calls", mgr_roots), ("inside connector calls", conn_roots),
                     ("manager + connector calls", mgr_roots | conn_roots)):
    if WRAPPERS:
        raw = {c: sum(v for (r, cc), v in EXCL.items() if cc == c and r in roots) for c in CATS}
        n = {c: sum(v for (r, cc), v in NCALL.items() if cc == c and r in roots) for c in CATS}
        ch = {c: sum(v for (r, cc), v in NCHILD.items() if cc == c and r in roots) for c in CATS}
        tot = {c: max(raw[c] - n[c] * C_IN - ch[c] * C_OUT, 0.0) for c in CATS}
        R = sum(raw.values())
        summarize(f"{title}, wrapper time corrected (measured {R:.4f} s)", tot, "s",
                  lambda c: f"  {n[c]:8d} calls (raw {raw[c]:.4f} s {100 * raw[c] / R:5.1f}%)")
    elif args.sample:
        tot = Counter()
        for (r, c), v in SAMPLES.items():
            if r in roots:
                tot[c] += v
        summarize(f"{title}, samples", dict(tot), "samples")
if args.sample:
    print(f"\nsamples outside manager/connector calls: "
          f"{sum(v for (r, c), v in SAMPLES.items() if r == 'driver')}; "
          f"per root: " + ", ".join(
              f"{r}={sum(v for (rr, c), v in SAMPLES.items() if rr == r)}"
              for r in sorted({r for r, c in SAMPLES})))
    for r in sorted(mgr_roots | conn_roots):
        t = {c: v for (rr, c), v in SAMPLES.items() if rr == r}
        T = sum(t.values())
        if T:
            print(f"  {r:28s} {T:6d} samples: " + " ".join(
                f"{c}={100 * v / T:.0f}%" for c, v in sorted(t.items(), key=lambda x: -x[1])))
