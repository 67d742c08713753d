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


class Server:
    def __init__(self, model_dir: Path, log: Path, *, kvpool: bool) -> None:
        self.port = free_port()
        self.events_port = free_port()
        self.collector = EventCollector(self.events_port)
        self.collector.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_SERVER_DEV_MODE="1", VLLM_LOGGING_CONFIG_PATH=str(_logging_config(log)))
        if kvpool:
            env["KVPOOL_VLLM"] = "1"
        events = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://127.0.0.1:{self.events_port}"}
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--skip-tokenizer-init", "--block-size", "32", "--enforce-eager", "--dtype", "float32",
             "--host", "127.0.0.1", "--port", str(self.port), "--enable-prefix-caching",
             "--num-gpu-blocks-override", "256", "--max-model-len", "1024", "--seed", "0",
             "--kv-events-config", json.dumps(events)],
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


def test_server_identical_with_kvpool(model_dir: Path, tmp_path: Path) -> None:
    # Both servers at once (KVPOOL_ENGINE_JOBS=1: one after the other): each
    # gets its requests one at a time, so neither's output depends on timing.
    jobs = max(1, int(os.environ.get("KVPOOL_ENGINE_JOBS", "2")))
    with ThreadPoolExecutor(min(jobs, 2)) as pool:
        stock_f = pool.submit(session, model_dir, tmp_path / "stock.log", kvpool=False)
        ours_f = pool.submit(session, model_dir, tmp_path / "kvpool.log", kvpool=True)
        stock, ours = stock_f.result(), ours_f.result()
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
