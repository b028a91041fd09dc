"""A recorded event in one line ("2 processes killed (cgroup /job, 3 so far)", "loss spiked"): the replay's event
list and anything else that lists a recording's events. A recording is read from disk: a field of the wrong type
(an older or damaged recording) is shown as it is, never an error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dltop.fmt import human_bytes, plural

# What the event list calls each kind.
KIND_LABELS = {
    "oom_kill": "OOM kill",
    "marker": "marker",
    "action": "action",
    "gpu_process": "GPU process",
    "hint": "hint",
    "start": "dltop start",
    "stop": "dltop stop",
}


def _get(d: Mapping[str, Any], key: str, missing: str = "?") -> str:
    value = d.get(key)
    return missing if value is None else str(value)


def _bytes(value: Any) -> str:
    return human_bytes(value) if isinstance(value, int | float) and not isinstance(value, bool) else "?"


def event_summary(kind: str, data: Mapping[str, Any]) -> str:
    """What happened, in one line: the fields a user looks for first for each kind, any other kind as key=value."""
    return " ".join(_summary(kind, data).splitlines())


def _summary(kind: str, data: Mapping[str, Any]) -> str:
    d = data if isinstance(data, Mapping) else {}
    if kind == "marker":
        return _get(d, "text", "")
    if kind == "oom_kill":
        kills = d.get("kills")
        who = plural(kills, "process", "processes") if isinstance(kills, int) else f"{_get(d, 'kills')} processes"
        where = f"cgroup {d['cgroup']}" if d.get("cgroup") else _get(d, "source", "vmstat")
        return f"{who} killed ({where}, {_get(d, 'total')} so far)"
    if kind == "gpu_process":
        mig = f" MIG {d['mig']}" if d.get("mig") is not None else ""
        used = f", {_bytes(d['used_bytes'])}" if d.get("used_bytes") is not None else ""
        return f"GPU{_get(d, 'gpu')}{mig} pid {_get(d, 'pid')} {_get(d, 'state', '')}: {_get(d, 'command', '')}{used}"
    if kind == "action":
        size = f" {_bytes(d['done_bytes'])}" if d.get("phase") == "finished" and d.get("done_bytes") is not None else ""
        outcome = f" {d['outcome']}" if d.get("outcome") else ""
        message = f": {d['message']}" if d.get("message") and d.get("outcome") in ("refused", "error") else ""
        return f"{_get(d, 'action')} {_get(d, 'target', '')} {_get(d, 'phase', '')}{outcome}{size}{message}"
    if kind == "hint":
        return f"{_get(d, 'state', '')} {_get(d, 'severity', '')}: {_get(d, 'text', _get(d, 'id'))}"
    if kind == "start":
        return f"pid {_get(d, 'pid')}, every {_get(d, 'interval_s')} s"
    if kind == "stop":
        return f"{_get(d, 'samples')} samples, {_get(d, 'dropped', '0')} dropped"
    return ", ".join(f"{k}={v}" for k, v in d.items())
