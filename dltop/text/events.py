"""A recorded event in one line ("OOM kill (cgroup /job): 1", "marker: loss spiked"): the replay's event list and
anything else that lists a recording's events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dltop.fmt import human_bytes, plural

# What the event list calls each kind, in the words of the screen that showed it live.
KIND_LABELS = {
    "oom_kill": "OOM kill",
    "marker": "marker",
    "action": "action",
    "gpu_process": "GPU process",
    "hint": "hint",
    "start": "dltop start",
    "stop": "dltop stop",
}


def event_summary(kind: str, data: Mapping[str, Any]) -> str:
    """What happened, in a line: the fields a user looks for first for each kind, every other kind as key=value."""
    d = dict(data)
    if kind == "marker":
        return str(d.get("text", ""))
    if kind == "oom_kill":
        where = f"cgroup {d['cgroup']}" if d.get("cgroup") else str(d.get("source", "vmstat"))
        return f"{plural(int(d.get('kills', 1)), 'process', 'processes')} killed ({where}, {d.get('total', '?')} so far)"
    if kind == "gpu_process":
        mig = f" MIG {d['mig']}" if d.get("mig") is not None else ""
        used = f", {human_bytes(d['used_bytes'])}" if isinstance(d.get("used_bytes"), int) else ""
        return f"GPU{d.get('gpu', '?')}{mig} pid {d.get('pid', '?')} {d.get('state', '')}: {d.get('command', '')}{used}"
    if kind == "action":
        done = d.get("done_bytes")
        size = f" {human_bytes(done)}" if isinstance(done, int) and d.get("phase") == "finished" else ""
        outcome = f" {d['outcome']}" if d.get("outcome") else ""
        return f"{d.get('action', '?')} {d.get('target', '')} {d.get('phase', '')}{outcome}{size}".strip()
    if kind == "hint":
        return f"{d.get('state', '')} {d.get('severity', '')}: {d.get('text', d.get('id', ''))}"
    if kind == "start":
        return f"pid {d.get('pid', '?')}, every {d.get('interval_s', '?')}s"
    if kind == "stop":
        return f"{d.get('samples', '?')} samples, {d.get('dropped', 0)} dropped"
    return ", ".join(f"{k}={v}" for k, v in d.items())
