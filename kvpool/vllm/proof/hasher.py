"""The hasher check: kvpool's request block hasher against the installed
vLLM's own.

Two ``Request`` objects of vLLM's own class with the same prompt and extra
inputs, one built with vLLM's ``get_request_block_hasher``, the other with
kvpool's, then fed the same output tokens in random chunks: their
``block_hashes`` must be equal after every step, for the four algorithms,
plain / LoRA / cache-salt / multimodal / prompt-embeds requests and both
``NONE_HASH`` conventions (vLLM's ``init_none_hash`` without and with
``PYTHONHASHSEED``). Planted faults in kvpool's hasher must each be caught.

``python -m kvpool.vllm --prove`` runs ``cases(line)``; the repository's
``tests/_hasher_vllm.py`` runs the same checks under pytest on each release.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import Any

import torch
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils import hashing as vllm_hashing
from vllm.v1.core import kv_cache_utils
from vllm.v1.request import Request

from .. import hasher as vllm_hasher
from ._base import Case, HarnessFailure, Patch, ProofFailure, patched

NAME = "hasher check"

try:
    import xxhash  # noqa: F401  (vLLM's xxhash algorithms need it)

    HAVE_XXHASH = True
except ImportError:
    HAVE_XXHASH = False

#: vLLM's hash algorithms for prefix caching (the xxhash pair needs the
#: xxhash package).
ALGORITHM_NAMES = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
ALGORITHMS = [n for n in ALGORITHM_NAMES if HAVE_XXHASH or not n.startswith("xxhash")]
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


def none_hash_mode(patch: Patch, mode: str) -> None:
    """``init``: vLLM's ``init_none_hash`` without ``PYTHONHASHSEED`` (random
    bytes up to 0.28 and for the xxhash pair; ``hash_fn("vllm-none-hash")``
    from 0.29); ``seeded``: with ``PYTHONHASHSEED`` set. vLLM's
    ``NONE_HASH`` is restored with the patch."""
    if mode == "init":
        patch.delenv("PYTHONHASHSEED", raising=False)
    else:
        patch.setenv("PYTHONHASHSEED", "12345")
    saved = getattr(kv_cache_utils, "NONE_HASH", None)
    if saved is not None:
        patch.setattr(kv_cache_utils, "NONE_HASH", saved)


NONE_HASH_MODES = ("init", "seeded")


def _hashers(algorithm: str, block_size: int, lookahead: int):
    hash_fn = vllm_hashing.get_hash_fn_by_name(algorithm)
    kv_cache_utils.init_none_hash(hash_fn)
    extra = (lookahead,) if lookahead else ()
    theirs = kv_cache_utils.get_request_block_hasher(block_size, hash_fn, *extra)
    ours = vllm_hasher.get_request_block_hasher(block_size, hash_fn, *extra)
    if not getattr(ours, "kvpool", False):
        raise ProofFailure("kvpool's compiled hasher was not used")
    return theirs, ours


def _same(where: str, a: Request, b: Request) -> None:
    if a.block_hashes != b.block_hashes:
        i = next((i for i, (x, y) in enumerate(zip(a.block_hashes, b.block_hashes)) if x != y),
                 min(len(a.block_hashes), len(b.block_hashes)))
        ours = b.block_hashes[i] if i < len(b.block_hashes) else "none"
        theirs = a.block_hashes[i] if i < len(a.block_hashes) else "none"
        raise ProofFailure(f"{where}: block_hashes[{i}] of {a.num_tokens} tokens: kvpool's {ours!r}, "
                           f"vLLM's {theirs!r} (kvpool has {len(b.block_hashes)} hashes, vLLM "
                           f"{len(a.block_hashes)})")


def check_same_hashes(seed: int, algorithm: str, kind: str, lookahead: int = 0) -> None:
    """Two requests of vLLM's own class, one hashed by vLLM's hasher, one by
    kvpool's, fed the same tokens in random chunks: ``ProofFailure`` at the
    first step whose hashes differ."""
    where = f"seed {seed}, {algorithm}, {kind} request" + (f", lookahead {lookahead}" if lookahead else "")
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 3, 4, 16, 16, 16, 64])
    theirs, ours = _hashers(algorithm, block_size, lookahead)
    spec = random_spec(rng, kind, block_size)
    a = spec.build("a", theirs)
    b = spec.build("b", ours)
    _same(f"{where}, the prompt", a, b)
    for step in range(rng.randrange(1, 8)):
        chunk = [_token(rng, kind == "odd_tokens") for _ in range(rng.randrange(1, 3 * block_size))]
        a.append_output_token_ids(chunk if len(chunk) > 1 else chunk[0])
        b.append_output_token_ids(chunk if len(chunk) > 1 else chunk[0])
        _same(f"{where}, output chunk {step}", a, b)
    if len(a.block_hashes) != (a.num_tokens - lookahead) // block_size:
        raise HarnessFailure(f"{where}: vLLM hashed {len(a.block_hashes)} blocks of {a.num_tokens} tokens")


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
    if real is None:
        raise ProofFailure("kvpool's compiled hasher is not available")
    caught = []
    with patched() as patch:
        patch.setattr(vllm_hasher, "_compiled_hasher", lambda: _PlantedHasherModule(real, fault))
        for seed in range(12):
            try:
                check_same_hashes(seed, "sha256", PLANTED_FAULTS[fault])
            except ProofFailure:
                caught.append(seed)
    if not caught:
        raise HarnessFailure(f"the planted fault {fault!r} was not caught in 12 seeds")


def applies(line: Any) -> str | None:
    if not line.hasher:
        return f"the {line.name} line keeps vLLM's hasher"
    return None


def cases(line: Any) -> list[Case]:
    """kvpool's hasher against the installed vLLM's: every algorithm, kind
    of request and ``NONE_HASH`` convention over six seeds (and the
    lookaheads, four seeds, where vLLM has them), then every planted fault
    caught."""

    def same(seed: int, algorithm: str, kind: str, mode: str, lookahead: int = 0) -> Case:
        def run(patch: Patch) -> None:
            none_hash_mode(patch, mode)
            check_same_hashes(seed, algorithm, kind, lookahead)

        extra = f", lookahead {lookahead}" if lookahead else ""
        return Case(f"seed {seed}, {algorithm}, {kind}, NONE_HASH {mode}{extra}", run)

    out = [same(seed, algorithm, kind, mode)
           for mode in NONE_HASH_MODES for seed in range(6)
           for algorithm in ALGORITHMS for kind in KINDS]
    if HAS_LOOKAHEAD:
        out += [same(seed, algorithm, kind, mode, lookahead)
                for mode in NONE_HASH_MODES for lookahead in (1, 3) for seed in range(4)
                for algorithm in ALGORITHMS for kind in KINDS]
    out += [Case(f"planted fault {fault} caught", lambda patch, f=fault: planted_faults_are_caught(f))
            for fault in sorted(PLANTED_FAULTS)]
    return out
