"""A recorded event in one line ("OOM kill: 2 in cgroup /job", "marker: loss went to NaN"): the replay's event list
and the report's timeline. A recording is read from disk: a field of the wrong type (an older or damaged
recording) is shown as it is, never an error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dltop.fmt import human_bytes


def describe_event(kind: str, data: Mapping[str, Any]) -> str:
    """What happened, in one line, starting with what kind of event it is."""
    return " ".join(_describe(kind, data if isinstance(data, Mapping) else {}).splitlines())


def _bytes(value: Any) -> str:
    return human_bytes(value) if isinstance(value, int) and not isinstance(value, bool) else "?"


def _describe(kind: str, d: Mapping[str, Any]) -> str:
    how = _DESCRIBE.get(kind)
    return how(kind, d) if how is not None else f"{kind}: {dict(d)}"


def _oom_kill(_: str, d: Mapping[str, Any]) -> str:
    where = f"cgroup {d.get('cgroup')}" if d.get("source") == "cgroup" else "the kernel (vmstat)"
    return f"OOM kill: {d.get('kills')} in {where}"


def _gpu_process(_: str, d: Mapping[str, Any]) -> str:
    mig = f" MIG {d['mig']}" if d.get("mig") is not None else ""
    mem = f", {_bytes(d['used_bytes'])}" if d.get("used_bytes") is not None else ""
    return f"GPU {d.get('gpu')}{mig}: pid {d.get('pid')} {d.get('state')} ({d.get('command') or '?'}{mem})"


def _action(_: str, d: Mapping[str, Any]) -> str:
    # Who ran it (a shell's warm reaches the recorder through the journal): a recording before it says nothing.
    by = f", by pid {d['pid']} uid {d.get('uid')}" if isinstance(d.get("pid"), int) else ""
    if d.get("phase") == "started":
        return f"{d.get('action')} {d.get('target')}: started{by}"
    # An ok run's message repeats the bytes and the target; a refusal's or an error's says why.
    why = f" {d['message']}" if d.get("outcome") != "ok" and d.get("message") else ""
    return f"{d.get('action')} {d.get('target')}: {d.get('outcome')} ({_bytes(d.get('done_bytes'))}){by}{why}"


def _hint(_: str, d: Mapping[str, Any]) -> str:
    return f"hint {d.get('state')}: {d.get('id')} ({d.get('severity')}) {d.get('text') or ''}".rstrip()


def _gap(_: str, d: Mapping[str, Any]) -> str:
    return f"gap: {d.get('samples')} samples not recorded ({d.get('cause')})"


def _marker(_: str, d: Mapping[str, Any]) -> str:
    return f"marker: {d.get('text')}"


def _recorder(kind: str, d: Mapping[str, Any]) -> str:
    return f"recorder {kind} (pid {d.get('pid')})"


def _view(_: str, d: Mapping[str, Any]) -> str:
    return f"view: the {d.get('tab')} tab on screen"


_DESCRIBE: dict[str, Callable[[str, Mapping[str, Any]], str]] = {
    "oom_kill": _oom_kill, "gpu_process": _gpu_process, "action": _action, "hint": _hint, "gap": _gap,
    "marker": _marker, "start": _recorder, "stop": _recorder, "view": _view}
