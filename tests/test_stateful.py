"""Differential state machine: the same random engine workload on a pool of
every core and on a plain reference model, compared after every step.

The workload is what a scheduler does: requests with shared prefixes look up
their longest cache hit, touch it, allocate the rest, cache their full blocks
as they fill, drop blocks that slid out of a window (replaced by the null
block) and free in reverse order; plus evict_blocks, reset_prefix_cache,
take_events, and misuse that must raise the same exception type everywhere
and change nothing. After every step: the SPEC section 2 invariants on each
pool, and identical state (free-queue order, ref counts, hash keys, the map,
queued events as msgpack bytes, sampled metrics) in every pool and the model.

Sizes: ``KVPOOL_HYPOTHESIS_EXAMPLES`` (conftest) scales the run; the ``ci``
hypothesis profile makes it deterministic.
"""

from __future__ import annotations

import logging
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvpool import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheMetricsCollector

from _helpers import (
    FakeLoRARequest,
    FakeRequest,
    block_pool_class,
    check_invariants,
    encode_events,
    event_hash,
    hash_chain,
    ids,
    key,
    pool_state,
    run_state_machine_under_dev_mode,
)

HASH_BLOCK_SIZE = 2
# Groups 0 and 1 share a block size (looked up together); group 2's blocks are
# twice as large, so its hashes are pairs of the request's hashes.
BLOCK_SIZE = {0: 2, 1: 2, 2: 4}
GROUP_SETS = [(0,), (1,), (0, 1), (2,)]
MAX_REQUESTS = 6


class Model:
    """The pool's observable behaviour written as plainly as possible: lists
    and dicts, block ids only."""

    def __init__(self, n: int, caching: bool) -> None:
        self.n = n
        self.caching = caching
        self.ref = [0] * n
        self.hash: list[bytes | None] = [None] * n
        self.free = list(range(1, n))
        self.map: dict[bytes, list[int]] = {}
        self.events: list[Any] = []
        self.sampled: set[int] = set()  # metrics, sample_rate=1.0
        self.metric_evictions = 0

    def get_cached(self, h: bytes, groups) -> list[int] | None:
        out = []
        for g in groups:
            found = self.map.get(key(h, g))
            if not found:
                return None
            out.append(found[0])
        return out

    def longest_hit(self, hashes, groups, max_blocks) -> list[list[int]]:
        result: list[list[int]] = [[] for _ in groups]
        limit = len(hashes) if max_blocks is None else min(max_blocks, len(hashes))
        for h in hashes[:limit]:
            hit = self.get_cached(h, groups)
            if hit is None:
                break
            for lst, i in zip(result, hit):
                lst.append(i)
        return result

    def _drop_hash(self, i: int) -> None:
        k = self.hash[i]
        holders = self.map.get(k) if k is not None else None
        if not holders or i not in holders:
            return
        holders.remove(i)
        if not holders:
            del self.map[k]
        self.hash[i] = None
        self.events.append(BlockRemoved(block_hashes=[event_hash(k[:-4])], medium="GPU"))

    def _close_metrics(self, i: int) -> None:
        if i in self.sampled:
            self.sampled.discard(i)
            self.metric_evictions += 1

    def allocate(self, k: int) -> list[int]:
        if k > len(self.free):
            raise ValueError
        got, self.free = self.free[:k], self.free[k:]
        for i in got:
            if self.caching:
                self._drop_hash(i)
                self._close_metrics(i)
            self.sampled.add(i)
            self.ref[i] = 1
        return got

    def touch(self, block_ids) -> None:
        for i in block_ids:
            if i == 0:
                # The null block's count is kept (as vLLM 0.15 keeps it),
                # but it never leaves or joins the queue.
                self.ref[0] += 1
                continue
            if i in self.free:
                self.free.remove(i)
            self.ref[i] += 1

    def free_blocks(self, block_ids) -> None:
        block_ids = list(block_ids)
        self.ref[0] -= block_ids.count(0)
        real = [i for i in block_ids if i != 0]
        for i in real:
            self.ref[i] -= 1
        self.free.extend(i for i in real if self.ref[i] == 0)

    def cache(self, hashes, block_ids, start, stop, block_size, group, tokens, lora) -> None:
        if start >= stop:
            return
        stored = []
        for j, i in enumerate(block_ids[start:stop]):
            if i == 0:
                continue
            h = hashes[start + j]
            self.hash[i] = key(h, group)
            self.map.setdefault(key(h, group), []).append(i)
            stored.append(event_hash(h))
        self.events.append(
            BlockStored(
                block_hashes=stored,
                parent_block_hash=None if start == 0 else event_hash(hashes[start - 1]),
                token_ids=tokens[start * block_size : stop * block_size],
                block_size=block_size,
                lora_id=lora.adapter_id if lora else None,
                medium="GPU",
                lora_name=lora.name if lora else None,
            )
        )

    def evict(self, block_ids) -> None:
        for i in block_ids:
            self._drop_hash(i)
        for i in block_ids:
            self._close_metrics(i)

    def reset(self) -> bool:
        if self.n - len(self.free) != 1:
            return False
        self.hash = [None] * self.n
        self.map = {}
        self.sampled.clear()
        self.metric_evictions = 0
        self.events.append(AllBlocksCleared())
        return True


class Request:
    """A fake running request: per group, its block ids and how many are cached."""

    def __init__(self, contents, partial, groups, lora) -> None:
        self.contents = contents
        self.hashes = hash_chain(contents)
        self.tokens = [t for c in contents for t in (2 * c, 2 * c + 1)] + [99] * partial
        self.groups = groups
        self.block_size = BLOCK_SIZE[groups[0]]
        scale = self.block_size // HASH_BLOCK_SIZE
        self.group_hashes = [
            b"".join(self.hashes[i : i + scale])
            for i in range(0, len(self.hashes) - scale + 1, scale)
        ]
        self.lora = lora
        self.blocks: dict[int, list[int]] = {}
        self.num_cached: dict[int, int] = {}

    @property
    def num_full(self) -> int:
        return len(self.tokens) // self.block_size

    @property
    def num_needed(self) -> int:
        return -(-len(self.tokens) // self.block_size)

    def fake(self, block_hashes=None) -> FakeRequest:
        return FakeRequest(
            self.hashes if block_hashes is None else block_hashes, self.tokens, self.lora
        )


class PoolMachine(RuleBasedStateMachine):
    cores: list[Any] = []

    def __init__(self) -> None:
        super().__init__()
        self.pools: list[Any] = []
        self.model: Model | None = None
        self.requests: list[Request] = []
        self.known_keys: set[bytes] = set()

    # -- plumbing -------------------------------------------------------

    def on_all(self, fn):
        """Run ``fn(pool)`` on every pool; all must return or all must raise
        the same exception type. Returns the results (or the exception type)."""
        outcomes = []
        for pool in self.pools:
            try:
                outcomes.append(("ok", fn(pool)))
            except Exception as exc:  # noqa: BLE001 - compared below
                outcomes.append(("raised", type(exc)))
        kinds = {(kind, value if kind == "raised" else None) for kind, value in outcomes}
        assert len(kinds) == 1, f"the cores disagree: {outcomes}"
        return outcomes

    def results(self, fn) -> list[Any]:
        outcomes = self.on_all(fn)
        assert outcomes[0][0] == "ok", f"unexpected {outcomes[0][1].__name__}"
        return [value for _, value in outcomes]

    def misuse(self, expected: type[Exception], fn) -> None:
        """``fn(pool)`` must raise exactly ``expected`` in every core and
        change nothing."""
        before = [pool_state(pool, self.known_keys) for pool in self.pools]
        outcomes = self.on_all(fn)
        assert outcomes[0] == ("raised", expected), (
            f"expected {expected.__name__}, got {outcomes[0]}"
        )
        after = [pool_state(pool, self.known_keys) for pool in self.pools]
        assert after == before

    def blocks_of(self, pool, block_ids):
        return [pool.blocks[i] for i in block_ids]

    # -- setup ----------------------------------------------------------

    @initialize(n=st.integers(1, 24), caching=st.sampled_from([True, True, True, False]))
    def make_pools(self, n, caching):
        self.pools = [
            block_pool_class(core)(
                n,
                caching,
                HASH_BLOCK_SIZE,
                enable_kv_cache_events=True,
                metrics_collector=KVCacheMetricsCollector(sample_rate=1.0),
            )
            for core in self.cores
        ]
        self.foreign = [block_pool_class(core)(4, True, HASH_BLOCK_SIZE) for core in self.cores]
        self.model = Model(n, caching)

    # -- the engine's workload ------------------------------------------

    def _lookup(self, hashes, groups, max_blocks) -> list[list[int]]:
        expected = self.model.longest_hit(hashes, groups, max_blocks)
        for pool in self.pools:
            got = pool.find_longest_cache_hit(hashes, groups, max_blocks)
            assert [ids(lst) for lst in got] == expected
            # The per-block API gives the same answer.
            limit = len(hashes) if max_blocks is None else min(max_blocks, len(hashes))
            per_block: list[list[int]] = [[] for _ in groups]
            for h in hashes[:limit]:
                hit = pool.get_cached_block(h, list(groups))
                if hit is None:
                    break
                for lst, b in zip(per_block, hit):
                    lst.append(b.block_id)
            assert per_block == expected
        return expected

    @precondition(lambda self: len(self.requests) < MAX_REQUESTS)
    @rule(
        contents=st.lists(st.integers(0, 2), min_size=1, max_size=6),
        partial=st.integers(0, 1),
        group_set=st.sampled_from(GROUP_SETS),
        max_hit=st.none() | st.integers(0, 4),
        cache_now=st.integers(0, 3),
        lora=st.booleans(),
    )
    def add_request(self, contents, partial, group_set, max_hit, cache_now, lora):
        lora_request = FakeLoRARequest(1, "lora-a") if lora else None
        self._add_request(contents, partial, group_set, max_hit, cache_now, lora_request)

    @precondition(lambda self: 0 < len(self.requests) < MAX_REQUESTS)
    @rule(
        r=st.integers(0, MAX_REQUESTS),
        keep=st.integers(0, 6),
        tail=st.lists(st.integers(0, 2), max_size=3),
        cache_now=st.integers(0, 3),
    )
    def add_request_sharing_prefix(self, r, keep, tail, cache_now):
        """A request that starts like a running one: the prefix-cache hit path."""
        other = self.requests[r % len(self.requests)]
        contents = other.contents[:keep] + tail
        self._add_request(contents, 0, other.groups, None, cache_now, other.lora)

    def _add_request(self, contents, partial, group_set, max_hit, cache_now, lora):
        req = Request(contents, partial, group_set, lora)
        hits = self._lookup(req.group_hashes, group_set, max_hit)
        touched: list[list[int]] = []
        for g, hit in zip(group_set, hits):
            self.results(lambda pool: pool.touch(self.blocks_of(pool, hit)))
            self.model.touch(hit)
            touched.append(hit)
            need = req.num_needed - len(hit)
            try:
                new = self.model.allocate(need)
            except ValueError:
                # Not enough room: every core refuses too; give back what was taken.
                self.misuse(ValueError, lambda pool: pool.get_new_blocks(need))
                for t in reversed(touched):
                    self.results(lambda pool: pool.free_blocks(reversed(self.blocks_of(pool, t))))
                    self.model.free_blocks(list(reversed(t)))
                return
            got = self.results(lambda pool: ids(pool.get_new_blocks(need)))
            assert all(x == new for x in got), (got, new)
            req.blocks[g] = hit + new
            req.num_cached[g] = len(hit)
            touched[-1] = req.blocks[g]
        self.requests.append(req)
        if cache_now:
            self._cache(req, cache_now)

    def _cache(self, req: Request, k: int) -> None:
        if not self.model.caching:
            return  # an engine with prefix caching off never caches blocks
        for g in req.groups:
            start = req.num_cached[g]
            stop = min(req.num_full, start + k)
            if stop <= start:
                continue
            self.results(
                lambda pool: pool.cache_full_blocks(
                    req.fake(), self.blocks_of(pool, req.blocks[g]), start, stop, req.block_size, g
                )
            )
            self.model.cache(
                req.group_hashes,
                req.blocks[g],
                start,
                stop,
                req.block_size,
                g,
                req.tokens,
                req.lora,
            )
            req.num_cached[g] = stop
            self.known_keys.update(key(h, g) for h in req.group_hashes[start:stop])

    @precondition(lambda self: self.requests)
    @rule(r=st.integers(0, MAX_REQUESTS), k=st.integers(1, 3))
    def cache_more(self, r, k):
        self._cache(self.requests[r % len(self.requests)], k)

    @precondition(lambda self: self.requests)
    @rule(r=st.integers(0, MAX_REQUESTS))
    def finish_request(self, r):
        req = self.requests.pop(r % len(self.requests))
        for g in req.groups:
            block_ids = req.blocks[g]
            self.results(lambda pool: pool.free_blocks(reversed(self.blocks_of(pool, block_ids))))
            self.model.free_blocks(list(reversed(block_ids)))

    @precondition(lambda self: self.requests)
    @rule(r=st.integers(0, MAX_REQUESTS), k=st.integers(1, 3))
    def slide_window(self, r, k):
        """Blocks that left a sliding window are freed and replaced by the null block."""
        req = self.requests[r % len(self.requests)]
        for g in req.groups:
            block_ids = req.blocks[g]
            removed = [
                block_ids[i] for i in reversed(range(min(k, len(block_ids)))) if block_ids[i] != 0
            ]
            self.results(lambda pool: pool.free_blocks(self.blocks_of(pool, removed)))
            self.model.free_blocks(removed)
            for i in range(min(k, len(block_ids))):
                block_ids[i] = 0

    @rule(
        contents=st.lists(st.integers(0, 2), max_size=7),
        group_set=st.sampled_from(GROUP_SETS + [(), (1, 0)]),
        max_blocks=st.none() | st.integers(0, 8),
    )
    def lookup(self, contents, group_set, max_blocks):
        hashes = hash_chain(contents)
        if group_set == (2,):
            hashes = [a + b for a, b in zip(hashes[::2], hashes[1::2])]
        before = [pool_state(pool, self.known_keys) for pool in self.pools]
        self._lookup(hashes, group_set, max_blocks)
        assert [pool_state(pool, self.known_keys) for pool in self.pools] == before

    @rule(block_ids=st.lists(st.integers(0, 23), max_size=4))
    def evict_blocks(self, block_ids):
        valid = [i for i in block_ids if i < self.model.n]
        self.results(lambda pool: pool.evict_blocks(valid))
        self.model.evict(valid)

    @rule(now=st.integers(0, 3))
    def reset_prefix_cache(self, now):
        if now:
            return  # a reset wipes the cache: keep it rare (1 in 4)
        got = self.results(lambda pool: pool.reset_prefix_cache())
        assert got == [self.model.reset()] * len(self.pools)

    @rule()
    def take_events_and_metrics(self):
        got = self.results(lambda pool: encode_events(pool.take_events()))
        expected = encode_events(self.model.events)
        self.model.events = []
        assert got == [expected] * len(self.pools)
        got = self.results(lambda pool: len(pool.metrics_collector.drain_events()))
        assert got == [self.model.metric_evictions] * len(self.pools)
        self.model.metric_evictions = 0

    # -- misuse: same exception everywhere, nothing changed --------------
    # One rule picks the kind, so that misuse does not crowd out the workload;
    # a kind whose situation does not exist right now does nothing.

    MISUSE_KINDS = (
        "over_allocate",
        "negative_allocation",
        "double_free",
        "same_block_twice",
        "foreign_block_free",
        "foreign_block_touch",
        "non_block",
        "evict_out_of_range",
        "cache_twice",
        "too_few_hashes",
        "non_bytes_hash",
    )

    @rule(kind=st.sampled_from(MISUSE_KINDS), i=st.integers(0, 100), k=st.integers(1, 3))
    def misuse_attempt(self, kind, i, k):
        getattr(self, f"_misuse_{kind}")(i, k)

    def _running_ids(self) -> list[int]:
        """Distinct non-null blocks held by running requests."""
        return list(
            dict.fromkeys(
                b for req in self.requests for g in req.groups for b in req.blocks[g] if b
            )
        )

    def _misuse_over_allocate(self, i, k):
        need = len(self.model.free) + k
        self.misuse(ValueError, lambda pool: pool.get_new_blocks(need))

    def _misuse_negative_allocation(self, i, k):
        self.misuse(ValueError, lambda pool: pool.get_new_blocks(-k))

    def _misuse_double_free(self, i, k):
        if not self.model.free:
            return
        victim = self.model.free[i % len(self.model.free)]
        # Valid blocks first: they must not be decremented either.
        running = self._running_ids()[:k]
        self.misuse(
            ValueError, lambda pool: pool.free_blocks(self.blocks_of(pool, running + [victim]))
        )

    def _misuse_same_block_twice(self, i, k):
        running = self._running_ids()
        if not running:
            return
        victim = running[i % len(running)]
        self.misuse(
            ValueError, lambda pool: pool.free_blocks(self.blocks_of(pool, [victim, victim]))
        )

    # Never the foreign null block (id 0): whether another pool's null block is
    # skipped like the own one or refused is not pinned down by the contract.
    def _misuse_foreign(self, i, method_name):
        def call(pool):
            foreign = self.foreign[self.pools.index(pool)].blocks[1 + i % 3]
            return getattr(pool, method_name)(pool.blocks[1:2] + [foreign])

        self.misuse(ValueError, call)

    def _misuse_foreign_block_free(self, i, k):
        self._misuse_foreign(i, "free_blocks")

    def _misuse_foreign_block_touch(self, i, k):
        self._misuse_foreign(i, "touch")

    def _misuse_non_block(self, i, k):
        if i % 2:
            valid = self._running_ids()[:k]
            self.misuse(
                TypeError, lambda pool: pool.free_blocks(self.blocks_of(pool, valid) + [None])
            )
        else:
            self.misuse(TypeError, lambda pool: pool.touch(pool.blocks[1:2] + [None]))

    def _misuse_evict_out_of_range(self, i, k):
        bad_id = self.model.n + i % 8 if i % 3 else -k
        self.misuse(ValueError, lambda pool: pool.evict_blocks([0, bad_id]))

    def _misuse_cache_twice(self, i, k):
        positions = [
            (req, g, j)
            for req in self.requests
            for g in req.groups
            for j, b in enumerate(req.blocks[g][: len(req.group_hashes)])
            if b and self.model.hash[b] is not None
        ]
        if not positions:
            return
        req, g, j = positions[i % len(positions)]
        self.misuse(
            RuntimeError,
            lambda pool: pool.cache_full_blocks(
                req.fake(), self.blocks_of(pool, req.blocks[g]), j, j + 1, req.block_size, g
            ),
        )

    def _uncached_full(self):
        """(request, group) pairs with full, non-null blocks not cached yet."""
        if not self.model.caching:
            return []
        return [
            (req, g)
            for req in self.requests
            for g in req.groups
            if any(req.blocks[g][req.num_cached[g] : req.num_full])
        ]

    def _misuse_too_few_hashes(self, i, k):
        candidates = self._uncached_full()
        if not candidates:
            return
        req, g = candidates[i % len(candidates)]
        start, stop = req.num_cached[g], req.num_full
        short = req.hashes[: (stop - 1) * (req.block_size // HASH_BLOCK_SIZE)]
        self.misuse(
            ValueError,
            lambda pool: pool.cache_full_blocks(
                req.fake(short), self.blocks_of(pool, req.blocks[g]), start, stop, req.block_size, g
            ),
        )

    def _misuse_non_bytes_hash(self, i, k):
        candidates = self._uncached_full()
        if not candidates:
            return
        req, g = candidates[i % len(candidates)]
        start, stop = req.num_cached[g], req.num_full
        j = next(j for j in range(start, stop) if req.blocks[g][j])
        bad = list(req.hashes)
        bad[j * (req.block_size // HASH_BLOCK_SIZE)] = 12345
        self.misuse(
            TypeError,
            lambda pool: pool.cache_full_blocks(
                req.fake(bad), self.blocks_of(pool, req.blocks[g]), start, stop, req.block_size, g
            ),
        )

    # -- after every step -----------------------------------------------

    @invariant()
    def same_state_everywhere(self):
        if self.model is None:
            return
        m = self.model
        expected_events = encode_events(m.events)
        for pool in self.pools:
            check_invariants(pool)
            assert ids(pool.free_block_queue.get_all_free_blocks()) == m.free
            assert [b.ref_cnt for b in pool.blocks] == m.ref
            assert [b.block_hash for b in pool.blocks] == m.hash
            hash_map = pool.cached_block_hash_to_block
            assert len(hash_map) == len(m.map)
            for k in self.known_keys:
                found = hash_map.get_one_block(k)
                assert (found.block_id if found else None) == (m.map[k][0] if k in m.map else None)
            assert encode_events(pool.kv_event_queue) == expected_events
            assert set(pool.metrics_collector.block_metrics) == m.sampled
            assert len(pool.metrics_collector._eviction_events) == m.metric_evictions


def test_state_machine(all_cores, monkeypatch, caplog):
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    caplog.set_level(logging.ERROR, logger="kvpool.block_pool")  # refused resets warn
    machine = type("PoolMachineOverCores", (PoolMachine,), {"cores": all_cores})
    run_state_machine_as_test(machine, settings=settings())


def test_state_machine_under_dev_mode(no_c_extensions):
    """The state machine again, in ``python -X dev``: memory errors in the
    compiled core show up there as crashes rather than passing by."""
    run_state_machine_under_dev_mode("test_stateful.py", no_c_extensions)
