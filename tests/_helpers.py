"""Helpers shared by the tests and by the scripts they run in subprocesses.

The checks raise ``AssertionError`` explicitly instead of using ``assert``: the
``python -O`` subprocess test imports this module too, and there an ``assert``
would silently vanish.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec

from kvpool.block_pool import make_block_pool_class

_pool_classes: dict[str, type] = {}


def load_script(path: Path, name: str) -> ModuleType:
    """A script of the checkout that is not in a package (``tools/*.py``),
    imported once as module ``name``."""
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def block_pool_class(core: Any) -> type:
    """The ``BlockPool`` facade over ``core``, built once per core."""
    cls = _pool_classes.get(core.__name__)
    if cls is None:
        cls = _pool_classes[core.__name__] = make_block_pool_class(core)
    return cls


# ---------------------------------------------------------------------------
# Fake engine objects


class FakeLoRARequest:
    """The two attributes of vLLM's ``LoRARequest`` that events read."""

    def __init__(self, adapter_id: int, name: str) -> None:
        self.adapter_id = adapter_id
        self.name = name


class FakeRequest:
    """What ``BlockPool.cache_full_blocks`` reads of a vLLM ``Request``."""

    def __init__(
        self,
        block_hashes: Sequence[Any],
        all_token_ids: list[int] | None = None,
        lora_request: FakeLoRARequest | None = None,
        hash_block_size: int = 16,
    ) -> None:
        self.block_hashes = block_hashes
        if all_token_ids is None:
            all_token_ids = list(range(len(block_hashes) * hash_block_size))
        self.all_token_ids = all_token_ids
        self.lora_request = lora_request


class PlainRequest:
    """What the 0.24-0.33 lines' pools read of a vLLM ``Request`` without
    LoRA, multimodal items, cache salt or prompt embeds: ``num_blocks``
    distinct block hashes and ``block_size`` tokens per block."""

    lora_request = None
    mm_features: list[Any] = []
    cache_salt = None
    prompt_embeds = None
    session_id = None

    def __init__(self, num_blocks: int, block_size: int = 4) -> None:
        self.block_hashes = make_hashes(num_blocks)
        self.all_token_ids = list(range(100, 100 + block_size * num_blocks))


def make_hashes(n: int, tag: bytes = b"h") -> list[bytes]:
    """``n`` distinct 32-byte block hashes (like vLLM's sha256 ones)."""
    return [hashlib.sha256(tag + i.to_bytes(4, "big")).digest() for i in range(n)]


def hash_chain(contents: Sequence[int], parent: bytes = b"root") -> list[bytes]:
    """Prefix-chained hashes: equal prefixes give equal hashes, as in vLLM."""
    out = []
    for c in contents:
        parent = hashlib.blake2b(parent + bytes([c]), digest_size=16).digest()
        out.append(parent)
    return out


def key(block_hash: bytes, group_id: int = 0) -> bytes:
    """The map key of ``block_hash`` in ``group_id`` (written out, not imported,
    so a bug in ``kvpool.hashing`` cannot hide itself)."""
    return block_hash + group_id.to_bytes(4, "big")


def event_hash(block_hash: bytes) -> int:
    """A hash as events carry it by default: the low 64 bits, big-endian."""
    return int.from_bytes(block_hash, "big") & (2**64 - 1)


# ---------------------------------------------------------------------------
# State snapshots


def block_id_or_none(block: Any) -> int | None:
    return None if block is None else block.block_id


def ids(blocks: Iterable[Any]) -> list[int]:
    return [b.block_id for b in blocks]


def encode_events(events: Iterable[Any]) -> bytes:
    return msgspec.msgpack.encode(list(events))


def queue_state(queue: Any, members: Sequence[Any] = ()) -> dict[str, Any]:
    """Everything observable about a free queue (and the given blocks)."""
    return {
        "order": ids(queue.get_all_free_blocks()),
        "num_free_blocks": queue.num_free_blocks,
        "links": [
            (b.block_id, block_id_or_none(b.prev_free_block), block_id_or_none(b.next_free_block))
            for b in members
        ],
        "head_next": block_id_or_none(queue.fake_free_list_head.next_free_block),
        "tail_prev": block_id_or_none(queue.fake_free_list_tail.prev_free_block),
        "blocks": [(b.block_id, b.ref_cnt, b.block_hash, b.is_null) for b in members],
    }


def map_state(hash_map: Any, keys: Iterable[bytes]) -> dict[str, Any]:
    return {
        "len": len(hash_map),
        "contents": {k: block_id_or_none(hash_map.get_one_block(k)) for k in sorted(set(keys))},
    }


def pool_state(pool: Any, extra_keys: Iterable[bytes] = ()) -> dict[str, Any]:
    """Everything observable about a pool: free queue order, every block's
    ``ref_cnt``/hash/flags/links, the map under every known key, the event
    queue (as bytes) and the metrics collector."""
    blocks = pool.blocks
    keys = {b.block_hash for b in blocks if b.block_hash is not None}
    keys.update(extra_keys)
    state: dict[str, Any] = queue_state(pool.free_block_queue, blocks)
    state["get_num_free_blocks"] = pool.get_num_free_blocks()
    state["map_object"] = id(pool.cached_block_hash_to_block)
    state["map"] = map_state(pool.cached_block_hash_to_block, keys)
    state["events"] = encode_events(pool.kv_event_queue)
    collector = pool.metrics_collector
    if collector is not None:
        state["metrics"] = (
            {
                block_id: (m.birth_time_ns, m.last_access_ns, tuple(m.access_history))
                for block_id, m in collector.block_metrics.items()
            },
            list(collector._eviction_events),
        )
    return state


def _diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    changed = [k for k in before if before[k] != after.get(k)]
    return "; ".join(f"{k}: {before[k]!r} -> {after.get(k)!r}" for k in changed)


def check_raises(
    exc_type: type[BaseException],
    fn: Callable[..., Any],
    *args: Any,
    match: str | None = None,
    **kwargs: Any,
) -> BaseException:
    """Call ``fn`` and check it raises exactly ``exc_type`` (not a subclass,
    not another type) with a message matching ``match``."""
    try:
        fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - checked just below
        if type(exc) is not exc_type:
            raise AssertionError(
                f"expected {exc_type.__name__}, got {type(exc).__name__}: {exc}"
            ) from exc
        if match is not None and not re.search(match, str(exc)):
            raise AssertionError(f"message {str(exc)!r} does not match {match!r}") from exc
        return exc
    raise AssertionError(f"expected {exc_type.__name__}, nothing was raised")


def check_pool_unchanged(
    pool: Any,
    exc_type: type[BaseException],
    fn: Callable[..., Any],
    *args: Any,
    match: str | None = None,
    extra_keys: Iterable[bytes] = (),
    **kwargs: Any,
) -> BaseException:
    """``fn(*args)`` raises exactly ``exc_type`` and the pool is as it was."""
    extra_keys = list(extra_keys)
    before = pool_state(pool, extra_keys)
    exc = check_raises(exc_type, fn, *args, match=match, **kwargs)
    after = pool_state(pool, extra_keys)
    if after != before:
        raise AssertionError(f"the failed call changed the pool: {_diff(before, after)}")
    check_invariants(pool)
    return exc


def check_queue_unchanged(
    queue: Any,
    members: Sequence[Any],
    exc_type: type[BaseException],
    fn: Callable[..., Any],
    *args: Any,
    match: str | None = None,
) -> BaseException:
    before = queue_state(queue, members)
    exc = check_raises(exc_type, fn, *args, match=match)
    after = queue_state(queue, members)
    if after != before:
        raise AssertionError(f"the failed call changed the queue: {_diff(before, after)}")
    return exc


# ---------------------------------------------------------------------------
# Invariants (SPEC section 2)


def _fail(pool: Any, msg: str) -> None:
    raise AssertionError(f"invariant broken ({type(pool).__module__}): {msg}")


def check_invariants(pool: Any) -> None:
    blocks = pool.blocks
    n = pool.num_gpu_blocks
    queue = pool.free_block_queue
    if len(blocks) != n:
        _fail(pool, f"{len(blocks)} blocks for num_gpu_blocks={n}")
    for i, b in enumerate(blocks):
        if b.block_id != i:
            _fail(pool, f"blocks[{i}].block_id == {b.block_id}")
    null = pool.null_block
    # The null block's ref_cnt is kept where the release keeps it (vLLM
    # before 0.33: the core's rule _kvpool_counts_null), else it stays 0.
    counted = getattr(type(pool), "_kvpool_counts_null", False)
    if null is not blocks[0] or not null.is_null or (null.ref_cnt != 0 and not counted):
        _fail(pool, f"bad null block {null!r}")
    if null.block_hash is not None:
        _fail(pool, f"the null block carries a hash: {null!r}")

    free = queue.get_all_free_blocks()
    free_ids = ids(free)
    if len(set(free_ids)) != len(free_ids):
        _fail(pool, f"duplicate ids in the free queue {free_ids}")
    if not (len(free) == queue.num_free_blocks == pool.get_num_free_blocks()):
        _fail(
            pool,
            f"len(free)={len(free)}, num_free_blocks={queue.num_free_blocks}, "
            f"get_num_free_blocks()={pool.get_num_free_blocks()}",
        )
    for b in free:
        if b is not blocks[b.block_id]:
            _fail(pool, f"a foreign block in the free queue: {b!r}")
    if 0 in free_ids:
        _fail(pool, "the null block is in the free queue")
    free_set = set(free_ids)
    for b in blocks[1:]:
        if (b.ref_cnt == 0) != (b.block_id in free_set):
            _fail(pool, f"ref_cnt/free-queue mismatch for {b!r}")

    # The links walk the queue in order; a block outside has no neighbours.
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    if head.block_id != -1 or tail.block_id != -1:
        _fail(pool, "sentinel ids are not -1")
    if head.prev_free_block is not None or tail.next_free_block is not None:
        _fail(pool, "a sentinel links outward")
    chain = [head, *free, tail]
    for left, right in zip(chain, chain[1:]):
        if left.next_free_block is not right or right.prev_free_block is not left:
            _fail(pool, f"broken links between {left!r} and {right!r}")
    for b in blocks:
        if b.block_id not in free_set and (
            b.prev_free_block is not None or b.next_free_block is not None
        ):
            _fail(pool, f"a block outside the queue has neighbours: {b!r}")

    # A block has a hash iff the map holds it under that key.
    hash_map = pool.cached_block_hash_to_block
    keys = {b.block_hash for b in blocks if b.block_hash is not None}
    if len(hash_map) != len(keys):
        _fail(pool, f"len(map)={len(hash_map)} but {len(keys)} distinct hashes on blocks")
    for k in keys:
        found = hash_map.get_one_block(k)
        if found is None or found is not blocks[found.block_id] or found.block_hash != k:
            _fail(pool, f"map lookup of {k!r} gives {found!r}")

    usage = pool.get_usage()
    expected = 0 if n == 1 else 1.0 - len(free) / (n - 1)
    if usage != expected:
        _fail(pool, f"get_usage()={usage!r}, expected {expected!r}")


# ---------------------------------------------------------------------------
# A pool in a realistic, non-trivial state


class BusyPool:
    """A pool with caching, events and a sampling-everything collector, holding
    running cached blocks, a running uncached block, free cached blocks, free
    uncached blocks and a key cached twice."""

    def __init__(self, pool_cls: type, num_gpu_blocks: int = 12) -> None:
        from kvpool import KVCacheMetricsCollector

        self.collector = KVCacheMetricsCollector(sample_rate=1.0)
        pool = pool_cls(
            num_gpu_blocks, True, 16, enable_kv_cache_events=True, metrics_collector=self.collector
        )
        self.pool = pool
        self.hashes = make_hashes(8)
        # Running: 3 cached blocks and one not yet full.
        self.running = pool.get_new_blocks(4)
        pool.cache_full_blocks(FakeRequest(self.hashes), self.running, 0, 3, 16, 0)
        # Freed but still cached (eviction candidates).
        self.free_cached = pool.get_new_blocks(3)
        pool.cache_full_blocks(FakeRequest(self.hashes[3:]), self.free_cached, 0, 3, 16, 0)
        pool.free_blocks(reversed(self.free_cached))
        # A second block under the key of running[0], in group 1 too.
        self.duplicate = pool.get_new_blocks(1)
        pool.cache_full_blocks(FakeRequest(self.hashes[:1]), self.duplicate, 0, 1, 16, 0)
        self.other_group = pool.get_new_blocks(1)
        pool.cache_full_blocks(FakeRequest(self.hashes[:1]), self.other_group, 0, 1, 16, 1)
        self.free_uncached = [
            b for b in pool.free_block_queue.get_all_free_blocks() if b.block_hash is None
        ]
        self.keys = [key(h, g) for h in self.hashes for g in (0, 1)]
        if not self.free_uncached or pool.get_num_free_blocks() < 4:
            raise AssertionError("BusyPool needs a larger num_gpu_blocks")
        check_invariants(pool)

    def unchanged(
        self, exc_type: type[BaseException], fn: Callable[..., Any], *args: Any, **kw: Any
    ) -> BaseException:
        return check_pool_unchanged(self.pool, exc_type, fn, *args, extra_keys=self.keys, **kw)


# ---------------------------------------------------------------------------
# A state machine again under ``python -X dev``


def run_state_machine_under_dev_mode(
    test_file: str, no_c_extensions: bool, default_examples: int = 100, passed: int = 1
) -> None:
    """Run ``test_state_machine`` of ``test_file`` (a path from this
    directory) in a ``python -X dev`` subprocess (debug allocator hooks,
    faulthandler, all warnings, ResourceWarning an error), so that memory
    errors in the compiled core show up as crashes rather than passing by;
    the ``ci`` hypothesis profile with ``KVPOOL_DEV_MODE_EXAMPLES`` examples
    (default ``default_examples``). ``passed``: how many tests that selects
    (a parametrized ``test_state_machine``: more than one)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import kvpool

    tests_dir = Path(__file__).resolve().parent
    env = dict(os.environ)
    package_root = str(Path(kvpool.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env["KVPOOL_HYPOTHESIS_EXAMPLES"] = env.get("KVPOOL_DEV_MODE_EXAMPLES", str(default_examples))
    env["KVPOOL_HYPOTHESIS_PROFILE"] = "ci"
    cmd = [
        sys.executable,
        "-X",
        "dev",
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(tests_dir / test_file),
        "-k",
        "test_state_machine and not dev_mode",
        "-W",
        "error::ResourceWarning",
    ]
    if no_c_extensions:
        cmd.append("--no-c-extensions")
    # cwd is the tests directory so that `-m` does not put a source checkout
    # in front of the kvpool under test.
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tests_dir, timeout=900)
    if proc.returncode != 0:
        raise AssertionError(proc.stdout[-4000:] + proc.stderr[-4000:])
    if not re.search(rf"\b{passed} passed\b", proc.stdout):
        raise AssertionError(proc.stdout[-2000:])
