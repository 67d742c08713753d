"""kvpool's request block hasher against vLLM's own, in a vLLM environment.

Shared by ``tests/vllm/test_hasher_vllm.py`` (vLLM 0.15.1 / 0.16.0),
``tests/vllm33/test_hasher_vllm33.py`` (0.33.0) and
``tests/vllm_release/test_hasher_release.py`` (each release of a hasher
line), which import these tests after checking the vLLM line. Imports vLLM: import it only where vLLM is.

Two ``Request`` objects of vLLM's own class with the same prompt and extra
inputs, one built with vLLM's ``get_request_block_hasher``, the other with
kvpool's, then fed the same output tokens in random chunks: their
``block_hashes`` must be equal after every step, for the four algorithms,
plain / LoRA / cache-salt / multimodal / prompt-embeds requests and both
``NONE_HASH`` conventions (vLLM's ``init_none_hash`` without and with
``PYTHONHASHSEED``).
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass

import pytest
import torch
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils import hashing as vllm_hashing
from vllm.v1.core import kv_cache_utils
from vllm.v1.request import Request

from kvpool.vllm import hasher as vllm_hasher

try:
    import xxhash  # noqa: F401  (vLLM's xxhash algorithms need it)

    HAVE_XXHASH = True
except ImportError:
    HAVE_XXHASH = False

ALGORITHMS = [
    pytest.param(name, marks=pytest.mark.skipif(
        name.startswith("xxhash") and not HAVE_XXHASH,
        reason="vLLM's xxhash algorithms need the xxhash package",
    ))
    for name in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
]
KINDS = ["plain", "lora", "salt", "lora_salt", "mm", "mm_lora_salt", "embeds", "odd_tokens"]

#: Does this vLLM's hasher take ``num_hash_lookahead_tokens`` (0.33)?
HAS_LOOKAHEAD = (
    "num_hash_lookahead_tokens"
    in inspect.signature(kv_cache_utils.get_request_block_hasher).parameters
)

# 0.34's Request keeps its tokens in an int32 buffer (vllm.v1.token_buffer).
try:
    import vllm.v1.token_buffer  # noqa: F401

    INT32_TOKENS = True
except ImportError:
    INT32_TOKENS = False

# 0.15 / 0.16's Request takes a required ``eos_token_id``; 0.33's has none.
EOS_KWARG = {"eos_token_id": None} if "eos_token_id" in inspect.signature(Request).parameters else {}


@dataclass
class Spec:
    """The inputs of one request, to build it twice."""

    prompt: list[int] | None
    embeds: torch.Tensor | None
    mm: list[tuple[str, int, int]]
    lora: LoRARequest | None
    salt: str | None

    def build(self, request_id: str, hasher) -> Request:
        mm_features = [
            MultiModalFeatureSpec(
                data=None,
                modality="image",
                identifier=identifier,
                mm_position=PlaceholderRange(offset=offset, length=length),
            )
            for identifier, offset, length in self.mm
        ] or None
        return Request(
            **EOS_KWARG,
            request_id=request_id,
            prompt_token_ids=list(self.prompt) if self.prompt is not None else None,
            sampling_params=SamplingParams(max_tokens=10_000),
            pooling_params=None,
            prompt_embeds=self.embeds,
            mm_features=mm_features,
            lora_request=self.lora,
            cache_salt=self.salt,
            block_hasher=hasher,
        )


def _token(rng: random.Random, odd: bool) -> int:
    if not odd:
        return rng.randrange(150_000)
    # Every pickle / CBOR integer width, and ints beyond int64 (pickled by
    # Python: the fallback path); only those an int32 holds where the
    # release keeps tokens in an int32 buffer (0.34).
    widths = [
        rng.randrange(256), rng.randrange(65_536), rng.randrange(2**31),
        -rng.randrange(1, 2**31), True,
    ]
    if not INT32_TOKENS:
        widths += [rng.randrange(2**31, 2**63), -rng.randrange(2**63), rng.randrange(2**64, 2**70)]
    return rng.choice(widths)


def random_spec(rng: random.Random, kind: str, block_size: int) -> Spec:
    length = rng.randrange(0, 12 * block_size)
    odd = kind == "odd_tokens"
    prompt = [_token(rng, odd) for _ in range(length)]
    embeds = None
    if kind == "embeds":
        length = max(length, 1)
        embeds = torch.randn(length, 4, dtype=torch.float16)
        prompt = None
    mm: list[tuple[str, int, int]] = []
    if kind.startswith("mm"):
        # Sorted, non-overlapping placeholders; identifiers repeat (the same
        # image twice) and are sometimes non-ASCII.
        pos = rng.randrange(0, block_size + 1)
        names = ["img-a", "img-b", "\u56fe\u50cf"]
        while pos < length and len(mm) < 6:
            size = rng.randrange(1, 3 * block_size)
            mm.append((rng.choice(names), pos, size))
            pos += size + rng.randrange(0, 2 * block_size)
    lora = None
    if "lora" in kind:
        name = rng.choice(["adapter", "\u00e9-adapter"])
        # The name and the path are sometimes one object (pickle's memo).
        lora = LoRARequest(name, rng.randrange(1, 9), name if rng.random() < 0.5 else "/l/" + name)
    salt = None
    if "salt" in kind:
        salt = rng.choice(["s", "salt-\u2603", "x" * 300])
    return Spec(prompt, embeds, mm, lora, salt)


@pytest.fixture(params=["init", "seeded"])
def none_hash_mode(request, monkeypatch):
    """``init``: vLLM's ``init_none_hash`` without ``PYTHONHASHSEED`` (random
    bytes up to 0.28 and for the xxhash pair; ``hash_fn("vllm-none-hash")``
    from 0.29); ``seeded``: with ``PYTHONHASHSEED`` set."""
    if request.param == "init":
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", "12345")
    saved = getattr(kv_cache_utils, "NONE_HASH", None)
    yield request.param
    if saved is not None:
        kv_cache_utils.NONE_HASH = saved


def _hashers(algorithm: str, block_size: int, lookahead: int):
    hash_fn = vllm_hashing.get_hash_fn_by_name(algorithm)
    kv_cache_utils.init_none_hash(hash_fn)
    extra = (lookahead,) if lookahead else ()
    theirs = kv_cache_utils.get_request_block_hasher(block_size, hash_fn, *extra)
    ours = vllm_hasher.get_request_block_hasher(block_size, hash_fn, *extra)
    assert getattr(ours, "kvpool", False), "kvpool's compiled hasher was not used"
    return theirs, ours


def check_same_hashes(seed: int, algorithm: str, kind: str, lookahead: int = 0) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 3, 4, 16, 16, 16, 64])
    theirs, ours = _hashers(algorithm, block_size, lookahead)
    spec = random_spec(rng, kind, block_size)
    a = spec.build("a", theirs)
    b = spec.build("b", ours)
    assert a.block_hashes == b.block_hashes
    for _ in range(rng.randrange(1, 8)):
        chunk = [_token(rng, kind == "odd_tokens") for _ in range(rng.randrange(1, 3 * block_size))]
        a.append_output_token_ids(chunk if len(chunk) > 1 else chunk[0])
        b.append_output_token_ids(chunk if len(chunk) > 1 else chunk[0])
        assert a.block_hashes == b.block_hashes
    assert len(a.block_hashes) == (a.num_tokens - lookahead) // block_size


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", range(6))
def test_same_hashes_as_vllm(seed, algorithm, kind, none_hash_mode):
    check_same_hashes(seed, algorithm, kind)


def test_none_hash_read_at_call_time(none_hash_mode):
    theirs, ours = _hashers("sha256", 4, 0)
    kv_cache_utils.NONE_HASH = b"\x42" * 32
    spec = Spec(list(range(9)), None, [], None, None)
    assert spec.build("a", theirs).block_hashes == spec.build("b", ours).block_hashes


def test_other_hash_fn_gets_vllms_hasher():
    def custom(obj):
        return vllm_hashing.sha256(obj)[:8]

    kv_cache_utils.init_none_hash(vllm_hashing.sha256)
    hasher = vllm_hasher.get_request_block_hasher(4, custom)
    assert not getattr(hasher, "kvpool", False)
    spec = Spec(list(range(9)), None, [], None, None)
    assert all(len(h) == 8 for h in spec.build("a", hasher).block_hashes)


def test_install_rebinds_the_engine_core_name(monkeypatch):
    import vllm.v1.engine.core as engine_core

    monkeypatch.delenv(vllm_hasher.ENV_VAR, raising=False)
    original = engine_core.get_request_block_hasher
    assert original is kv_cache_utils.get_request_block_hasher
    assert vllm_hasher.install_hasher()
    try:
        assert vllm_hasher.hasher_installed()
        assert not vllm_hasher.install_hasher()  # idempotent
        assert engine_core.get_request_block_hasher is vllm_hasher.get_request_block_hasher
        assert kv_cache_utils.get_request_block_hasher is original  # vLLM's own stays
    finally:
        assert vllm_hasher.uninstall_hasher()
    assert engine_core.get_request_block_hasher is original
    assert not vllm_hasher.hasher_installed()
    assert not vllm_hasher.uninstall_hasher()


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_env_var_keeps_vllms_hasher(monkeypatch, value):
    import vllm.v1.engine.core as engine_core

    monkeypatch.setenv(vllm_hasher.ENV_VAR, value)
    original = engine_core.get_request_block_hasher
    assert not vllm_hasher.install_hasher()
    assert engine_core.get_request_block_hasher is original
    assert not vllm_hasher.hasher_installed()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "odd_tokens"])
def test_blocks_are_hashed_in_c(monkeypatch, kind):
    """vLLM's hash function is never called by kvpool's hasher for requests
    of vLLM's shapes: every block went through the C serialiser."""
    calls = []
    real = vllm_hashing.sha256

    def spy(obj):
        calls.append(obj)
        return real(obj)

    monkeypatch.setattr(vllm_hashing, "sha256", spy)
    kv_cache_utils.init_none_hash(real)
    hasher = vllm_hasher.get_request_block_hasher(16, spy)
    assert getattr(hasher, "kvpool", False)
    for seed in range(5):
        request = random_spec(random.Random(seed), kind, 16).build("r", hasher)
        request.append_output_token_ids(list(range(40)))
    assert calls == []


def test_kv_cache_utils_rebound_to_kvpools(monkeypatch):
    """A harness may rebind vLLM's own name to kvpool's (to run a workload
    with it): kvpool's factory still finds vLLM's, never itself."""
    kv_cache_utils.init_none_hash(vllm_hashing.sha256)
    theirs = kv_cache_utils.get_request_block_hasher(4, vllm_hashing.sha256)
    vllm_hasher._vllm_get_request_block_hasher(kv_cache_utils)
    monkeypatch.setattr(kv_cache_utils, "get_request_block_hasher", vllm_hasher.get_request_block_hasher)
    ours = kv_cache_utils.get_request_block_hasher(4, vllm_hashing.sha256)
    assert getattr(ours, "kvpool", False)
    spec = Spec(list(range(30)), None, [("img", 2, 5)], None, "salt")
    assert spec.build("a", theirs).block_hashes == spec.build("b", ours).block_hashes


@pytest.mark.skipif(not HAS_LOOKAHEAD, reason="this vLLM has no lookahead hashing (0.33 on)")
@pytest.mark.parametrize("lookahead", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", range(4))
def test_same_hashes_with_lookahead(seed, algorithm, kind, lookahead, none_hash_mode):
    check_same_hashes(seed, algorithm, kind, lookahead)


# ----------------------------------------------------------- planted faults

def _fault_keys(fault: str, request, key):
    """One block's extra keys as a broken hasher would give them."""
    if key is None:
        return None
    if fault == "salt_dropped":
        salt = request.cache_salt
        key = tuple(e for e in key if e != salt and e != ("cache_salt", salt))
    elif fault == "neighbour_lora_key":
        # The other convention of the LoRA key: the name alone (up to 0.30)
        # against ("lora", name, path) (0.31 on), whichever this release is not.
        lora = request.lora_request
        tagged = ("lora", lora.lora_name, lora.lora_path)
        key = tuple(
            tagged if e == lora.lora_name
            else lora.lora_name if isinstance(e, tuple) and e[:1] == ("lora",)
            else e
            for e in key
        )
    return key or None


class _PlantedHasherModule:
    """``kvpool._hasher`` as ``kvpool.vllm.hasher`` uses it, with one fault
    planted in the ``RequestBlockHasher`` it builds: the extra keys, the
    ``NONE_HASH`` it reads, the serialiser or the lookahead."""

    __name__ = "kvpool._hasher"

    def __init__(self, real, fault: str) -> None:
        self.real = real
        self.fault = fault

    def RequestBlockHasher(self, algorithm, block_size, lookahead, holder,
                           token_list_type, extra_keys, fallback, vllm_hasher, *rest):
        fault = self.fault
        if fault in ("salt_dropped", "neighbour_lora_key"):
            def planted_keys(request, start, num_blocks, _keys=extra_keys):
                keys = _keys(request, start, num_blocks)
                return None if keys is None else [_fault_keys(fault, request, k) for k in keys]

            extra_keys = planted_keys
        elif fault == "none_hash_wrong":
            class holder:  # a NONE_HASH that is not vLLM's
                NONE_HASH = b"\x00" * 32
        elif fault == "serialiser_swapped":
            algorithm ^= 1  # pickle <-> CBOR, the same digest
        elif fault == "lookahead_off_by_one":
            lookahead += 1
        return self.real.RequestBlockHasher(algorithm, block_size, lookahead, holder,
                                            token_list_type, extra_keys, fallback, vllm_hasher,
                                            *rest)


#: A planted fault -> the kind of request that must reveal it.
PLANTED_FAULTS = {
    "salt_dropped": "salt",
    "neighbour_lora_key": "lora",
    "none_hash_wrong": "plain",
    "serialiser_swapped": "plain",
    "lookahead_off_by_one": "plain",
}


def planted_faults_are_caught(fault: str) -> None:
    """``check_same_hashes`` must fail for some of a few seeds when kvpool's
    hasher has ``fault``: the shared tests have teeth on this release."""
    real = vllm_hasher._compiled_hasher()
    assert real is not None, "kvpool's compiled hasher is not available"
    caught = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_hasher, "_compiled_hasher", lambda: _PlantedHasherModule(real, fault))
        for seed in range(12):
            try:
                check_same_hashes(seed, "sha256", PLANTED_FAULTS[fault])
            except AssertionError:
                caught.append(seed)
    assert caught, f"the planted fault {fault!r} was not caught in 12 seeds"
