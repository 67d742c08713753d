"""vLLM's request block hasher vs kvpool's compiled one, in one process.

For each of vLLM's four ``prefix_caching_hash_algo`` values, both hashers
(``vllm.v1.core.kv_cache_utils.get_request_block_hasher`` and
``kvpool.vllm.hasher.get_request_block_hasher``, built with vLLM's own hash
function) hash the same requests, A/B interleaved (the order alternates
every round), and must return the same hashes:

* ``prompt``: a fresh 32k-token prompt (2048 blocks of 16): the ms per
  prompt, and the us per block it implies;
* ``decode``: a request of 2047 hashed blocks whose last 16 tokens complete
  one more block, as in a decode step: the us per call (one block each);
* ``prompt+lora+salt``: the prompt with a LoRA adapter and a cache salt
  (extra keys on every block);
* ``manager workload`` (sha256, unless ``--no-workload``): the requests of
  ``benchmarks/bench_vllm_manager.py``'s ``full`` workload
  (``tests/vllm/vllm_workload.py``: 4,000 requests, 1.75M prompt tokens,
  320k decode tokens, some with LoRA) built as vLLM ``Request`` objects, then
  fed their output tokens one at a time, as the engine does: the time spent
  in hasher calls (one ``perf_counter_ns`` pair around each, its own cost,
  measured on an empty hasher, subtracted).

A cell is the median over rounds with the interquartile range; the ratio is
the median of the per-round ratios (vLLM / kvpool), with its IQR. Run it
where vLLM is importable (and the xxhash package, for the xxhash pair)::

    python benchmarks/bench_hasher.py [--rounds 15] [--no-workload] [--json]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import random
import statistics
import sys
import time
from types import SimpleNamespace

import vllm
from vllm.lora.request import LoRARequest
from vllm.utils import hashing as vllm_hashing
from vllm.v1.core import kv_cache_utils
from vllm.v1.utils import ConstantList

import kvpool
from kvpool.vllm import hasher as vllm_hasher

BLOCK_SIZE = 16
PROMPT_TOKENS = 32 * 1024
ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DECODE_CALLS = 200


try:  # 0.34 keeps a request's tokens in an int32 buffer, which its hasher slices
    from vllm.v1.token_buffer import TokenBuffer
except ImportError:
    TokenBuffer = list


def make_request(tokens, lora=None, salt=None, block_hashes=None):
    """What a block hasher reads of vLLM's ``Request``: ``all_token_ids``
    wraps ``_all_token_ids`` (a list; 0.34: a ``TokenBuffer``), as there."""
    buffer = TokenBuffer(tokens)
    return SimpleNamespace(
        block_hashes=list(block_hashes or []),
        _all_token_ids=buffer,
        all_token_ids=ConstantList(buffer),
        num_tokens=len(tokens),
        mm_features=[],
        lora_request=lora,
        cache_salt=salt,
        prompt_embeds=None,
        _prompt_embeds_per_block_hashes={},
    )


def time_prompt(hasher, tokens, lora=None, salt=None):
    request = make_request(tokens, lora, salt)
    gc.disable()
    t0 = time.perf_counter_ns()
    hashes = hasher(request)
    t1 = time.perf_counter_ns()
    gc.enable()
    return (t1 - t0) / 1e6, hashes  # ms


def time_decode(hasher, tokens, prefix_hashes):
    request = make_request(tokens, block_hashes=prefix_hashes[:-1])
    block_hashes = request.block_hashes
    out = None
    gc.disable()
    t0 = time.perf_counter_ns()
    for _ in range(DECODE_CALLS):
        out = hasher(request)
    t1 = time.perf_counter_ns()
    gc.enable()
    assert len(block_hashes) == len(prefix_hashes) - 1
    return (t1 - t0) / 1e3 / DECODE_CALLS, out  # us per call


def workload_requests():
    """The manager benchmark's ``full`` workload: (prompt, outputs, lora) per
    request, or None where tests/vllm/vllm_workload.py does not import."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, os.pardir, "tests", "vllm"))
    try:
        import vllm_workload as vw
    except Exception as exc:  # noqa: BLE001  (any import problem: skip the case)
        print(f"!! manager workload skipped ({exc})", file=sys.stderr)
        return None
    return [(s.prompt, s.outputs, s.lora) for s in vw._request_specs(vw.FULL)]


def time_workload(hasher, specs):
    """ms spent inside ``hasher`` while the workload's requests are built
    and decoded token by token, and their block hashes."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    spent = [0]
    clock = time.perf_counter_ns

    def timed(request):
        t0 = clock()
        out = hasher(request)
        spent[0] += clock() - t0
        return out

    extra = {"eos_token_id": None} if "eos_token_id" in inspect.signature(Request).parameters else {}
    params = SamplingParams(max_tokens=100_000)
    gc.disable()
    requests = []
    for i, (prompt, outputs, lora) in enumerate(specs):
        request = Request(
            request_id=str(i), prompt_token_ids=list(prompt), sampling_params=params,
            pooling_params=None, lora_request=lora, block_hasher=timed, **extra,
        )
        for token in outputs:
            request.append_output_token_ids(token)
        requests.append(request)
    gc.enable()
    return spent[0] / 1e6, [r.block_hashes for r in requests]


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], statistics.median(values), q[2]


def measure_ab(measure, hashers, rounds):
    """A/B rounds of ``measure(hasher) -> (time, result)``; the results of
    the two hashers must be equal. Returns {name: [times]}, [ratios]."""
    times = {"vllm": [], "kvpool": []}
    ratios = []
    gc.collect()
    for r in range(rounds + 1):  # round 0 warms up
        order = ("vllm", "kvpool") if r % 2 else ("kvpool", "vllm")
        got, results = {}, {}
        for name in order:
            got[name], results[name] = measure(hashers[name])
        if results["vllm"] != results["kvpool"]:
            raise SystemExit("!! the hashes differ")
        if r:
            for name in order:
                times[name].append(got[name])
            ratios.append(got["vllm"] / got["kvpool"])
    return times, ratios


def run(rounds: int, workload: bool) -> list[dict]:
    rng = random.Random(0)
    tokens = [rng.randrange(150_000) for _ in range(PROMPT_TOKENS)]
    lora = LoRARequest("adapter", 1, "/adapters/adapter")
    rows = []
    for algorithm in ALGORITHMS:
        hash_fn = vllm_hashing.get_hash_fn_by_name(algorithm)
        try:
            kv_cache_utils.init_none_hash(hash_fn)
            hash_fn(b"probe")
        except ModuleNotFoundError as exc:
            print(f"!! {algorithm}: skipped ({exc})", file=sys.stderr)
            continue
        hashers = {
            "vllm": kv_cache_utils.get_request_block_hasher(BLOCK_SIZE, hash_fn),
            "kvpool": vllm_hasher.get_request_block_hasher(BLOCK_SIZE, hash_fn),
        }
        assert getattr(hashers["kvpool"], "kvpool", False)
        _, full = time_prompt(hashers["vllm"], tokens)
        cases = {
            "prompt": lambda h: time_prompt(h, tokens),
            "decode": lambda h: time_decode(h, tokens, full),
            "prompt+lora+salt": lambda h: time_prompt(h, tokens, lora, "salt"),
        }
        if workload and algorithm == "sha256":
            specs = workload_requests()
            if specs is not None:
                overhead, _ = time_workload(lambda request: [], specs)
                cases["manager workload"] = lambda h: (
                    lambda t, res: (t - overhead, res))(*time_workload(h, specs))
        for case, measure in cases.items():
            times, ratios = measure_ab(measure, hashers, rounds if case != "manager workload" else max(3, rounds // 3))
            unit = "us/call" if case == "decode" else "ms"
            row = {"algorithm": algorithm, "case": case, "unit": unit}
            for name in ("vllm", "kvpool"):
                row[name] = quartiles(times[name])
            row["ratio"] = quartiles(ratios)
            if case in ("prompt", "prompt+lora+salt"):
                blocks = PROMPT_TOKENS // BLOCK_SIZE
                row["us_per_block"] = {n: row[n][1] * 1000 / blocks for n in ("vllm", "kvpool")}
            rows.append(row)
    return rows


def header() -> str:
    from kvpool import _hasher

    return (
        f"vLLM {vllm.__version__} vs kvpool {kvpool.__version__} request block hasher "
        f"(SHA-256 back-end: {_hasher.SHA256_BACKEND}), block size {BLOCK_SIZE}, "
        f"{PROMPT_TOKENS}-token prompt\n"
        f"Python {platform.python_version()} | {platform.processor() or platform.machine()} | "
        f"{platform.platform()}"
    )


def render(rows: list[dict], rounds: int) -> str:
    lines = [header(), f"median [IQR] over {rounds} A/B rounds", ""]
    lines.append(
        f"| {'algorithm':<11} | {'case':<16} | {'vLLM':>22} | {'kvpool':>22} | "
        f"{'us/block vLLM -> kvpool':>23} | {'speed-up':>17} |"
    )
    lines.append("|" + "|".join("-" * w for w in (13, 18, 24, 24, 25, 19)) + "|")
    for row in rows:
        def cell(q, unit=row["unit"]):
            return f"{q[1]:.3f} [{q[0]:.3f}-{q[2]:.3f}] {unit}"

        per_block = ""
        if "us_per_block" in row:
            per_block = f"{row['us_per_block']['vllm']:.2f} -> {row['us_per_block']['kvpool']:.3f}"
        ratio = row["ratio"]
        lines.append(
            f"| {row['algorithm']:<11} | {row['case']:<16} | {cell(row['vllm']):>22} | "
            f"{cell(row['kvpool']):>22} | {per_block:>23} | "
            f"{ratio[1]:5.1f}x [{ratio[0]:.1f}-{ratio[2]:.1f}] |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-workload", action="store_true",
                        help="skip the manager-workload case (about a minute)")
    args = parser.parse_args(argv)
    rows = run(args.rounds, not args.no_workload)
    if args.json:
        print(json.dumps({"header": header(), "rounds": args.rounds, "rows": rows}, indent=1))
    else:
        print(render(rows, args.rounds))


if __name__ == "__main__":
    main()
