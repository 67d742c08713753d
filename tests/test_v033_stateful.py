"""The hypothesis state machine of the 0.33 line: ``kvpool.v0_33`` pools over
every core, side by side, driven by the operation families of the vLLM 0.33
differential tests (``_release_driver.py``: requests with shared prefixes, hits
and touch, get_new_blocks, cache_full_blocks with and without block_mask,
partial entries and promotions, move_block_hashes, outside ref_cnt writes,
free_blocks per group and deferred, unpin_blocks with reuse watchers, sliding
windows, evict_blocks, _maybe_evict_cached_block, reset_prefix_cache, the
offload connector's iter_blocks_after / _insert_block_hash / event appends,
free-queue methods, frees mixing in blocks of a pool of the other core, in
both directions; caching on and off, hybrid block sizes, events, metrics,
lookahead tokens, media). After every step: the SPEC section 2 invariants on
every pool (ref_cnt == 0 iff in the free queue, each block once in the queue,
num_free matching it, every hash key of a block in the map under it and every
map entry pointing back) and identical observable state in every core.

Misuse (SPEC section 6: vLLM asserts or corrupts, kvpool refuses) must raise
the same exception type in every core and change nothing.

Sizes: ``KVPOOL_HYPOTHESIS_EXAMPLES`` (conftest) scales the run; the ``ci``
profile makes it deterministic.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from types import ModuleType
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

from _helpers import run_state_machine_under_dev_mode
from _release_driver import Config, Driver, FakeRequest, Features, Side, pool_state

ENV_INT_HASHES = "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"
REFUSALS = (ValueError, RuntimeError, TypeError)

_pool_classes: dict[tuple[str, str], type] = {}


def line_module(name: str) -> ModuleType:
    # A plain import: without the line these tests fail (ImportError).
    return importlib.import_module(name)


def pool_class(line: str, core: ModuleType) -> type:
    cls = _pool_classes.get((line, core.__name__))
    if cls is None:
        cls = _pool_classes[(line, core.__name__)] = line_module(line).make_block_pool_class(core)
    return cls


def chain_hasher(cfg: Config):
    """Chained block hashes at hash_block_size (each over the block's tokens,
    its lookahead tokens and the request's LoRA / salt / mm keys), as vLLM's
    hasher makes them, with sha256 over a repr instead of pickle."""
    hbs, lookahead = cfg.hash_block_size, cfg.lookahead

    def hasher(req: FakeRequest) -> list[bytes]:
        out: list[bytes] = []
        parent = b"none-hash"
        tokens = req.all_token_ids
        for start in range(0, req.num_tokens - lookahead - hbs + 1, hbs):
            extra = (
                req.lora_request.lora_name if req.lora_request else None,
                req.cache_salt if start == 0 else None,
                [
                    f.identifier
                    for f in req.mm_features
                    if f.mm_position.offset < start + hbs
                    and start < f.mm_position.offset + f.mm_position.length
                ],
            )
            data = repr((tokens[start : start + hbs + lookahead], extra)).encode()
            parent = hashlib.sha256(parent + data).digest()
            out.append(parent)
        return out

    return hasher


class PoolMachine33(RuleBasedStateMachine):
    cores: list[ModuleType] = []
    #: The line the machine drives (a subclass drives another).
    LINE = "kvpool.v0_33"

    def __init__(self) -> None:
        super().__init__()
        self.driver: Driver | None = None
        self.saved_env = os.environ.get(ENV_INT_HASHES)

    def teardown(self) -> None:
        if self.saved_env is None:
            os.environ.pop(ENV_INT_HASHES, None)
        else:
            os.environ[ENV_INT_HASHES] = self.saved_env

    @initialize(r=st.randoms(use_true_random=False))
    def make_pools(self, r):
        cfg = Config.random(r)
        os.environ[ENV_INT_HASHES] = "1" if cfg.int_hashes else "0"
        v33 = line_module(self.LINE)
        # The line's API as the driver uses it, read off its own pool.
        features = Features.detect(pool_class(self.LINE, self.cores[0]), v33.BlockStored)
        sides = []
        for i, core in enumerate(self.cores):
            # The other pool of cross-pool frees is built over the other core.
            other_core = self.cores[(i + 1) % len(self.cores)]
            collector = (
                v33.KVCacheMetricsCollector(sample_rate=cfg.sample_rate) if cfg.metrics else None
            )
            args, kwargs = cfg.pool_args(collector)
            pool = pool_class(self.LINE, core)(*args, **kwargs)
            foreign = pool_class(self.LINE, other_core)(
                cfg.foreign_blocks, True, cfg.hash_block_size
            )
            sides.append(Side(core.__name__, pool, foreign, v33.BlockStored, collector))
        self.driver = Driver(
            cfg,
            sides,
            hasher=chain_hasher(cfg),
            label=f"{self.LINE} over {[c.__name__ for c in self.cores]}",
            check_invariants_on=[s.label for s in sides],
            features=features,
        )

    # -- misuse: refused the same way everywhere, nothing changed ------------

    MISUSE = (
        "double_free",
        "same_block_twice",
        "negative_allocation",
        "pop_more_than_free",
        "unpin_free_block",
        "unpin_null_block",
        "hash_set_twice",
        "promotion_not_smaller",
        "move_into_hashed",
        "evict_out_of_range",
        "append_queued_block",
    )

    # One rule, so that the workload's weights hold and misuse stays about
    # one step in ten.
    STEPS = [name for name, weight in sorted(Driver.OPS.items()) for _ in range(weight)] + [
        f"misuse:{kind}" for kind in MISUSE
    ]

    @rule(step=st.sampled_from(STEPS), r=st.randoms(use_true_random=False))
    def one_step(self, step, r):
        if step.startswith("misuse:"):
            self.misuse(step.removeprefix("misuse:"), r)
        else:
            self.driver.do(step, r)

    def misuse(self, kind, r):
        call = getattr(self, f"_misuse_{kind}")(r)
        if call is None:
            return  # the situation does not exist right now
        d = self.driver
        before = [self._state(s) for s in d.sides]
        outcomes = []
        for side in d.sides:
            try:
                call(side)
            except REFUSALS as exc:
                outcomes.append(type(exc))
            else:
                outcomes.append(None)
        assert None not in outcomes, f"{kind}: not refused ({outcomes})\n{d.context()}"
        assert len(set(outcomes)) == 1, f"{kind}: the cores disagree: {outcomes}"
        after = [self._state(s) for s in d.sides]
        for side, b, a in zip(d.sides, before, after):
            changed = [k for k in b if b[k] != a[k]]
            assert not changed, f"{kind} changed {changed} of {side.label}\n{d.context()}"
        d.check()

    def _state(self, side: Side) -> dict[str, Any]:
        features = self.driver.features
        state = pool_state(side.pool, side.collector, features)
        state["events"] = [repr(e) for e in side.pool.kv_event_queue]
        state["foreign"] = pool_state(side.foreign, None, features)
        return state

    def _misuse_double_free(self, r):
        free = self.driver.free_ids()
        if not free:
            return None
        victim = r.choice(free)
        running = self.driver.running_ids()[:2]  # valid ones first: not decremented either
        return lambda s: s.pool.free_blocks(self.driver.blocks(s, running + [victim]))

    def _misuse_same_block_twice(self, r):
        once = [i for i in self.driver.running_ids() if self.driver.ref_block(i).ref_cnt == 1]
        if not once:
            return None
        i = r.choice(once)
        return lambda s: s.pool.free_blocks([s.pool.blocks[i], s.pool.blocks[i]])

    def _misuse_negative_allocation(self, r):
        k = -r.randint(1, 3)
        return lambda s: s.pool.get_new_blocks(k)

    def _misuse_pop_more_than_free(self, r):
        k = self.driver.ref.get_num_free_blocks() + r.randint(1, 3)
        return lambda s: s.pool.free_block_queue.popleft_n(k)

    def _misuse_unpin_free_block(self, r):
        free = self.driver.free_ids()
        if not free:
            return None
        i = r.choice(free)
        return lambda s: s.pool.unpin_blocks([s.pool.blocks[i]], lambda b: None)

    def _misuse_unpin_null_block(self, r):
        return lambda s: s.pool.unpin_blocks([s.pool.null_block], lambda b: None)

    def _misuse_hash_set_twice(self, r):
        hashed = [i for i in self.driver.hashed_ids() if i]
        if not hashed:
            return None
        i = r.choice(hashed)
        key = r.randbytes(32) + (0).to_bytes(4, "big")
        return lambda s: s.pool.blocks[i].set_block_hash(key, num_tokens=4)

    def _misuse_promotion_not_smaller(self, r):
        """cache_full_blocks over a block already cached as a full block."""
        d = self.driver
        cands = []
        for q in d.requests:
            for g, ids in q.blocks.items():
                bs = d.cfg.group_block_sizes[g]
                for j in range(min(q.num_cached[g], len(d._view(q.fake, bs)))):
                    b = d.ref_block(ids[j])
                    n = b.block_hash_num_tokens
                    if not b.is_null and n is not None and n >= (j + 1) * bs:
                        cands.append((q, g, j, bs))
        if not cands:
            return None
        q, g, j, bs = r.choice(cands)
        ids = q.blocks[g]
        return lambda s: s.pool.cache_full_blocks(q.fake, d.blocks(s, ids), j, j + 1, bs, g)

    def _misuse_move_into_hashed(self, r):
        hashed = [i for i in self.driver.hashed_ids() if i]
        running = self.driver.running_ids()
        if not hashed or not running:
            return None
        src, dst = r.choice(running), r.choice(hashed)
        if src == dst:
            return None
        return lambda s: s.pool.move_block_hashes(s.pool.blocks[src], s.pool.blocks[dst])

    def _misuse_evict_out_of_range(self, r):
        n = self.driver.cfg.num_blocks
        bad = r.choice((n, n + r.randint(1, 5), -r.randint(1, 3)))
        return lambda s: s.pool.evict_blocks([0, bad])

    def _misuse_append_queued_block(self, r):
        free = self.driver.free_ids()
        if not free:
            return None
        i = r.choice(free)
        how = r.choice(("append", "append_n", "prepend_n"))
        if how == "append":
            return lambda s: s.pool.free_block_queue.append(s.pool.blocks[i])
        return lambda s: getattr(s.pool.free_block_queue, how)([s.pool.blocks[i]])


def test_state_machine(all_cores):
    machine = type("PoolMachine33OverCores", (PoolMachine33,), {"cores": all_cores})
    run_state_machine_as_test(machine, settings=settings())


def test_state_machine_under_dev_mode(no_c_extensions):
    """The state machine again, in ``python -X dev``: memory errors in the
    compiled core show up there as crashes rather than passing by."""
    run_state_machine_under_dev_mode("test_v033_stateful.py", no_c_extensions)
