"""The soak run's verdict, shared by ``test_engine_soak.py`` (a short run in
CI) and ``benchmarks/soak_vllm_engine.py`` (a long one): many waves of
requests through one engine, stock and with kvpool inside.

Each run (``engine_run.py`` with ``waves``) records after every wave the
process's RSS and its number of live objects tracked by the collector (the
harness keeps its own data as bytes and text, which the collector does not
track, so the count is the engine's). vLLM freezes what it built at start
(``gc.freeze()``), so the count starts small and a leak shows at once.

kvpool must add nothing: every wave generates the same tokens as stock and
every request its full ``max_tokens``; from the end of the warm-up waves to
the last wave, kvpool's live objects may grow by at most ``OBJECTS_SLACK``
more than stock's, and its RSS by at most ``RSS_SLACK_MIB`` more.
"""

from __future__ import annotations

OBJECTS_SLACK = 32
RSS_SLACK_MIB = 32


def growth(run: dict, warmup: int) -> tuple[int, float]:
    """Live objects and RSS (MiB) gained from after wave ``warmup`` to the last."""
    base, last = run["waves"][warmup - 1], run["waves"][-1]
    return last["objects"] - base["objects"], (last["rss_kib"] - base["rss_kib"]) / 1024


def problems(stock: dict, ours: dict, scenario: dict, warmup: int) -> list[str]:
    """What is wrong with kvpool's soak run against stock's (empty: nothing)."""
    out = []
    waves = scenario["waves"]
    if len(ours["tokens"]) != waves or len(stock["tokens"]) != waves:
        out.append(f"waves run: stock {len(stock['tokens'])}, kvpool {len(ours['tokens'])}, "
                   f"asked {waves}")
    for i, (a, b) in enumerate(zip(stock["tokens"], ours["tokens"])):
        if a != b:
            out.append(f"wave {i + 1}: kvpool's tokens differ from stock's")
        short = sum(len(t) != scenario["max_tokens"] for t in b)
        if short or len(b) != scenario["num_requests"]:
            out.append(f"wave {i + 1}: {len(b)} of {scenario['num_requests']} requests answered, "
                       f"{short} with fewer than {scenario['max_tokens']} tokens")
    if ours["metrics"] != stock["metrics"]:
        out.append(f"counters differ: stock {stock['metrics']}, kvpool {ours['metrics']}")
    (s_obj, s_rss), (o_obj, o_rss) = growth(stock, warmup), growth(ours, warmup)
    if o_obj > max(s_obj, 0) + OBJECTS_SLACK:
        out.append(f"live objects grew by {o_obj} over waves {warmup}-{waves} with kvpool, "
                   f"{s_obj} stock (slack {OBJECTS_SLACK})")
    if o_rss > max(s_rss, 0) + RSS_SLACK_MIB:
        out.append(f"RSS grew by {o_rss:.0f} MiB over waves {warmup}-{waves} with kvpool, "
                   f"{s_rss:.0f} MiB stock (slack {RSS_SLACK_MIB} MiB)")
    return out
