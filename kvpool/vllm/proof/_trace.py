"""Comparing two manager-driver traces (``kvpool.vllm.proof._workload``,
``._workload33``), shared by the manager suite of ``python -m kvpool.vllm
--prove`` (``kvpool.vllm.proof.manager``) and the differential tests against
a real vLLM (which import it as ``_manager_trace``): the first differing
entry, said as precisely as we can, with the calls that led to it (a
whole-trace diff of ~10^5 entries would be unreadable). Also the deliberately broken pools that prove such a comparison
can fail. Imports neither vLLM nor kvpool.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

STEP_FIELDS = (
    "events",
    "prefix_cache_stats",
    "usage",
    "free_blocks",
    "common_prefix_blocks",
    "eviction_samples",
)


def short(value: object, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def step_fields(entry: tuple) -> dict:
    """A ``("step", ...)`` entry by field, its event batch decoded. A
    ``KVEventBatch`` is array_like: ``[ts, events, ...]``; its events are
    arrays (``[tag, field, ...]``, until vLLM 0.23) or tagged maps
    (``{"type": tag, ...}``, from 0.24)."""
    _, _, batch, stats, usage, free, common, evictions = entry
    events = msgspec.msgpack.decode(batch)[1] if batch else []
    return dict(zip(STEP_FIELDS, (events, dict(stats), usage, free, common, evictions)))


def _event_fields(event: Any, event_fields: dict[str, tuple[str, ...]]) -> dict:
    if isinstance(event, dict):
        return event
    if isinstance(event, list) and event:
        names = event_fields.get(event[0], ())
        return {"type": event[0], **dict(zip(names, event[1:]))}
    return {"event": event}


def _explain_events(
    a: list, b: list, event_fields: dict[str, tuple[str, ...]]
) -> list[str]:
    lines = [f"  KV events differ ({len(a)} expected, {len(b)} got)"]
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        lines.append(f"  first differing event #{i}:")
        lines.append(f"    expected: {short(x)}")
        lines.append(f"    got:      {short(y)}")
        u, v = _event_fields(x, event_fields), _event_fields(y, event_fields)
        for key in sorted(set(u) | set(v)):
            if u.get(key) != v.get(key):
                lines.append(
                    f"    field {key}: expected {short(u.get(key))}, got {short(v.get(key))}"
                )
        return lines
    extra = a[len(b) :] or b[len(a) :]
    lines.append(f"  extra events: {short(extra)}")
    return lines


def explain(
    want: tuple, have: tuple, event_fields: dict[str, tuple[str, ...]] | None = None
) -> str:
    """What differs between two trace entries. ``event_fields``: the wire
    order of the fields of each array-encoded event class, by tag (from
    vLLM's own classes), to name a differing field."""
    if want[0] == have[0] == "step":
        lines = [f"after step {want[1]}:"]
        a, b = step_fields(want), step_fields(have)
        for name in STEP_FIELDS:
            if a[name] == b[name]:
                continue
            if name == "events":
                lines += _explain_events(a[name], b[name], event_fields or {})
            else:
                lines.append(f"  {name}: expected {short(a[name])}, got {short(b[name])}")
        if a == b:
            lines.append(
                f"  decoded fields equal, msgpack bytes differ: {want[2]!r} vs {have[2]!r}"
            )
        return "\n".join(lines)
    return f"expected (vLLM's pool): {short(want)}\ngot (kvpool):           {short(have)}"


def first_difference(
    expected: list[tuple],
    got: list[tuple],
    event_fields: dict[str, tuple[str, ...]] | None = None,
) -> str | None:
    """None if the traces are equal, else the first differing entry with
    what differs and the calls that led to it."""
    for i, (want, have) in enumerate(zip(expected, got)):
        if want != have:
            context = "\n  ".join(
                short(e if e[0] != "step" else e[:2]) for e in expected[max(0, i - 6) : i]
            )
            return (
                f"first difference at trace entry {i}\n"
                f"{explain(want, have, event_fields)}\npreceded by:\n  {context}"
            )
    if len(expected) != len(got):
        return f"trace lengths {len(expected)} != {len(got)} (equal up to the shorter)"
    return None


def counters(run: Any) -> dict:
    """A driver ``Run``'s decision counts (not its timings or its trace)."""
    return {
        f.name: getattr(run, f.name)
        for f in dataclasses.fields(run)
        if f.name not in ("trace", "manager_seconds", "manager_calls", "wall_seconds")
    }


def free_order_broken(base: type) -> type:
    """``base`` (a pool class) with one deliberate bug: ``free_blocks`` frees
    in the opposite order (so the free queue, hence later allocations and
    evictions, differ)."""

    class FreeOrderBroken(base):  # type: ignore[misc, valid-type]
        def free_blocks(self, ordered_blocks, *args, **kwargs):
            return super().free_blocks(list(ordered_blocks)[::-1], *args, **kwargs)

    return FreeOrderBroken


def events_broken(base: type) -> type:
    """``base`` (a pool class) with one deliberate bug: it drops the last
    event of every batch it hands out."""

    class EventsBroken(base):  # type: ignore[misc, valid-type]
        def take_events(self):
            return super().take_events()[:-1]

    return EventsBroken
