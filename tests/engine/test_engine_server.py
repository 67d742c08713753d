"""End to end through vLLM's OpenAI-compatible server: the server stock, then
the same server with ``KVPOOL_VLLM=1`` (the plugin installs kvpool in the
engine-core process the server spawns), each on a loopback port, driven over
HTTP by this test with prompts as token ids.

Three phases per server, compared between the two:

1. a batch of completions (one of them streamed): every token id, the
   prefix-cache counters, the KV events;
2. an aborted streaming request (the client hangs up after a few chunks),
   then ``POST /reset_prefix_cache`` while the server is up: the server must
   answer and stay healthy (what the aborted request got to is timing, so
   neither its tokens nor its events are compared);
3. the batch again after the reset: the same tokens as phase 1 (a cold cache
   gives the same output), and the same events and counter deltas in both
   servers, from the ``AllBlocksCleared`` on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engine_run import EventCollector, free_port, prompts  # noqa: E402
from test_engine_identity import JOBS, _per_block  # noqa: E402

SCENARIO = {"num_prefixes": 4, "prefix_tokens": 96, "tail_tokens": 24, "num_requests": 16,
            "seed": 11}
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tiny_model import make_model

    return make_model(tmp_path_factory.mktemp("tiny-llama-server"))


def _logging_config(log: Path) -> Path:
    """vLLM's logging, plus kvpool's INFO lines (which say what install() put
    in), to the server's output."""
    path = log.with_suffix(".logging.json")
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stdout"}
    path.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "handlers": {"out": handler},
        "loggers": {name: {"handlers": ["out"], "level": "INFO", "propagate": False}
                    for name in ("vllm", "kvpool")},
    }))
    return path


def _free_ports(n: int) -> int:
    """A loopback port P with P .. P+n-1 all free (vLLM's publisher of
    data-parallel rank r connects to the endpoint's port plus r)."""
    import socket

    while True:
        first = free_port()
        try:
            socks = []
            for k in range(n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", first + k))
            return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()


def _planted_plugin(where: Path, call: str) -> Path:
    """A directory that, on ``PYTHONPATH``, gives vLLM one more general
    plugin (an installed distribution's entry point, as kvpool's own is):
    loaded in every vLLM process the server starts, engine cores too, it
    runs ``engine_run.<call>`` there (e.g. ``install_broken(2)``: kvpool in,
    then its pool with a planted bug). Test code, for the proofs."""
    root = where / "planted-plugin"
    info = root / "kvpool_planted_fault-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvpool-planted-fault\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nplanted = kvpool_planted_fault:load\n")
    (root / "kvpool_planted_fault.py").write_text(
        f"def load():\n    import engine_run\n    engine_run.{call}\n")
    return root


class Server:
    """``data_parallel_size`` > 1: that many engine cores behind vLLM's DP
    coordinator, each publishing its KV events on its own port (kept per
    rank in ``collectors``), and vLLM's own logging setup (each line names
    its process: ``EngineCore_DP0``, ...)."""

    def __init__(self, model_dir: Path, log: Path, *, kvpool: bool,
                 data_parallel_size: int = 1, planted: str | None = None) -> None:
        self.port = free_port()
        self.events_port = _free_ports(data_parallel_size)
        self.collectors = [EventCollector(self.events_port + rank)
                           for rank in range(data_parallel_size)]
        self.collector = self.collectors[0]
        for collector in self.collectors:
            collector.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_SERVER_DEV_MODE="1")
        if data_parallel_size > 1:
            env["VLLM_LOGGING_LEVEL"] = "INFO"
        else:
            env["VLLM_LOGGING_CONFIG_PATH"] = str(_logging_config(log))
        if kvpool:
            env["KVPOOL_VLLM"] = "1"
        if planted:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(_planted_plugin(log.parent, planted)), str(HERE),
                 *filter(None, [env.get("PYTHONPATH")])])
        events = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://127.0.0.1:{self.events_port}"}
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--skip-tokenizer-init", "--block-size", "32", "--enforce-eager", "--dtype", "float32",
             "--host", "127.0.0.1", "--port", str(self.port), "--enable-prefix-caching",
             "--num-gpu-blocks-override", "256", "--max-model-len", "1024", "--seed", "0",
             "--kv-events-config", json.dumps(events),
             "--data-parallel-size", str(data_parallel_size)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}); see {log}")
            try:
                if self.get("/health").status == 200:
                    return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(1)
        raise RuntimeError(f"the server did not come up; see {log}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str):
        return urllib.request.urlopen(self.url(path), timeout=30)

    def post(self, path: str, body: dict | None = None, timeout: float = 300):
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(self.url(path), data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(request, timeout=timeout)

    def complete(self, prompt: list[int], *, stream: bool = False, max_tokens: int = MAX_TOKENS):
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True, "stream": stream}
        return self.post("/v1/completions", body)

    @property
    def model(self) -> str:
        with self.get("/v1/models") as response:
            return json.load(response)["data"][0]["id"]

    def counters(self) -> dict[str, float]:
        out = {}
        with self.get("/metrics") as response:
            for line in response.read().decode().splitlines():
                for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
                    if line.startswith(name):
                        out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        for collector in self.collectors[1:]:
            collector.close()


def streamed_tokens(response) -> list[int]:
    tokens: list[int] = []
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            tokens += choice.get("token_ids") or []
    return tokens


def run_batch(server: Server, batch: list[list[int]]) -> list[list[int]]:
    """The requests one after the other (the last one streamed), results in
    request order. One at a time, so that what the scheduler sees, and so
    the events, the counters and their batching, does not depend on when
    HTTP requests happen to arrive."""
    results = []
    for i, prompt in enumerate(batch):
        stream = i == len(batch) - 1
        with server.complete(prompt, stream=stream) as response:
            if stream:
                results.append(streamed_tokens(response))
            else:
                results.append(json.load(response)["choices"][0]["token_ids"])
    return results


def session(model_dir: Path, log: Path, *, kvpool: bool) -> dict:
    batch = prompts(SCENARIO)
    server = Server(model_dir, log, kvpool=kvpool)
    try:
        phase1 = {"tokens": run_batch(server, batch), "counters": server.counters()}
        server.collector.wait_quiet()
        phase1["events"] = server.collector.take()

        # Phase 2: hang up on a long streamed request after a few chunks.
        response = server.complete(batch[0] + [5, 6, 7], stream=True, max_tokens=400)
        for _ in range(3):
            response.readline()
        response.close()
        time.sleep(2)
        with server.post("/reset_prefix_cache") as reset:
            assert reset.status == 200
        assert server.get("/health").status == 200
        server.collector.wait_quiet()
        server.collector.take()
        before = server.counters()

        tokens = run_batch(server, batch)
        after = server.counters()
        server.collector.wait_quiet()
        phase3 = {"tokens": tokens,
                  "counters": {k: after[k] - before.get(k, 0.0) for k in after},
                  "events": server.collector.take()}
    finally:
        server.stop()
        server.collector.close()
    return {"phase1": phase1, "phase3": phase3}


def side_by_side(*calls):
    """The calls' results, the calls (a stock and a kvpool server's session)
    run at once (``KVPOOL_ENGINE_JOBS=1``: one after the other). Each server
    gets its requests one at a time, so neither's output depends on timing."""
    with ThreadPoolExecutor(min(JOBS, 2)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def test_server_identical_with_kvpool(model_dir: Path, tmp_path: Path) -> None:
    stock, ours = side_by_side(
        lambda: session(model_dir, tmp_path / "stock.log", kvpool=False),
        lambda: session(model_dir, tmp_path / "kvpool.log", kvpool=True))
    log = (tmp_path / "kvpool.log").read_text()
    assert "kvpool BlockPool of the" in log, "kvpool was not installed in the server's engine"
    for phase in ("phase1", "phase3"):
        assert all(stock[phase]["tokens"]), f"{phase}: a request generated nothing"
        assert ours[phase]["tokens"] == stock[phase]["tokens"], phase
        assert ours[phase]["counters"] == stock[phase]["counters"], phase
        assert stock[phase]["counters"]["vllm:prefix_cache_hits_total"] > 0, phase
        assert ours[phase]["events"] == stock[phase]["events"], phase
        assert stock[phase]["events"], f"{phase}: no KV events"
    # A cold cache gives the same output as the first time.
    assert stock["phase3"]["tokens"] == stock["phase1"]["tokens"]


#: The data-parallel server: two engine cores (``--data-parallel-size 2``).
DP = 2


def dp_session(model_dir: Path, log: Path, *, kvpool: bool, planted: str | None = None) -> dict:
    batch = prompts(SCENARIO)
    log.parent.mkdir(parents=True, exist_ok=True)
    server = Server(model_dir, log, kvpool=kvpool, data_parallel_size=DP, planted=planted)
    try:
        tokens = run_batch(server, batch)
        counters = server.counters()
        events = []
        for collector in server.collectors:
            collector.wait_quiet()
            events.append(collector.take())
    finally:
        server.stop()
        server.collector.close()
    return {"tokens": tokens, "counters": counters, "events": events}


def test_data_parallel_server_identical_with_kvpool(model_dir: Path, tmp_path: Path) -> None:
    """Two engine cores, each its own scheduler: kvpool's pool and manager
    in every one (its lines in vLLM's log name ``EngineCore_DP0`` and
    ``EngineCore_DP1``), each rank's KV events carrying that rank, and the
    same tokens, counters and events (rank by rank, block by block) as the
    stock server. The requests go one at a time, so the coordinator's
    choice of core does not depend on timing."""
    from test_engine_logging import VLLM_LINE

    stock, ours = side_by_side(
        lambda: dp_session(model_dir, tmp_path / "stock.log", kvpool=False),
        lambda: dp_session(model_dir, tmp_path / "kvpool.log", kvpool=True))
    said = [m.groupdict() for m in map(VLLM_LINE.match, (tmp_path / "kvpool.log").read_text()
                                       .splitlines()) if m]
    for rank in range(DP):
        core = [line["message"] for line in said if line["process"] == f"EngineCore_DP{rank}"]
        assert any("KV-cache manager: kvpool's" in m for m in core), (rank, core)
        assert any("is served by" in m and "kvpool's compiled paths" in m for m in core), core
    assert not [line for line in (tmp_path / "stock.log").read_text().splitlines()
                if "kvpool BlockPool of the" in line]
    assert all(stock["tokens"]) and ours["tokens"] == stock["tokens"]
    assert ours["counters"] == stock["counters"]
    for rank in range(DP):
        ranks = {tuple(rest) for _, rest in ours["events"][rank]}
        assert ranks == {(rank,)}, (rank, ranks)
        assert _per_block(ours["events"][rank]) == _per_block(stock["events"][rank]), rank
    # Both cores served requests.
    assert all(ours["events"][rank] for rank in range(DP)), [len(e) for e in ours["events"]]


@pytest.mark.proof
def test_a_broken_pool_in_the_engine_cores_is_caught(model_dir: Path, tmp_path: Path) -> None:
    """The proof of the data-parallel test: kvpool's pool in both engine
    cores returns another block on every second prefix-cache hit (put in by
    a planted general plugin); the tokens or the events must differ from
    the stock server's."""
    stock, broken = side_by_side(
        lambda: dp_session(model_dir, tmp_path / "stock" / "stock.log", kvpool=False),
        lambda: dp_session(model_dir, tmp_path / "broken" / "broken.log", kvpool=True,
                           planted="install_broken(2)"))
    said = (tmp_path / "broken" / "broken.log").read_text()
    assert said.count("KV-cache manager: kvpool's") >= DP, "kvpool was not put in"
    caught = [what for what, differs in (
        ("tokens", broken["tokens"] != stock["tokens"]),
        ("events", any(_per_block(broken["events"][r]) != _per_block(stock["events"][r])
                       for r in range(DP))),
    ) if differs]
    print("caught:", caught)
    assert caught
