"""A recorded event in one line ("OOM kill: 2 in cgroup /job", "marker: loss went to NaN"): the replay's event list
and the report's timeline. A recording is read from disk: a field of the wrong type (an older or damaged
recording) is shown as it is, never an error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dltop.fmt import human_bytes, printable


def describe_event(kind: str, data: Mapping[str, Any]) -> str:
    """What happened, in one line, starting with what kind of event it is; what came from outside (a command the
    process chose, a cgroup's name) with its control characters escaped, as `fmt.printable` shows them."""
    return printable(" ".join(_describe(kind, data if isinstance(data, Mapping) else {}).splitlines()))


def _bytes(value: Any) -> str:
    return human_bytes(value) if isinstance(value, int) and not isinstance(value, bool) else "?"


def _describe(kind: str, d: Mapping[str, Any]) -> str:
    how = _DESCRIBE.get(kind)
    return how(kind, d) if how is not None else f"{kind}: {dict(d)}"


def _oom_kill(_: str, d: Mapping[str, Any]) -> str:
    where = f"cgroup {d.get('cgroup')}" if d.get("source") == "cgroup" else "the kernel (vmstat)"
    return f"OOM kill: {d.get('kills')} in {where}{_victims(d)}"


def _victims(d: Mapping[str, Any]) -> str:
    """Who was killed: the kernel log's victims (pid, command, cgroup), or the processes gone since the last
    sample where the log could not be read, said as such; nothing for a recording from before victims."""
    victims, source = d.get("victims"), d.get("victims_from")
    if not isinstance(victims, list):
        return ""
    named = [_victim(v) for v in victims if isinstance(v, Mapping)]
    if source == "kmsg":
        return f": killed {'; '.join(named)} (kernel log)" if named else ": the victim not in the kernel log"
    why = f"; kernel log: {d['kmsg_status']}" if d.get("kmsg_status") else ""
    if not named:
        return f": victim unknown (no process of the last sample gone{why})"
    return f": victim unknown, gone since the last sample: {'; '.join(named)} (from the last sample{why})"


def _victim(v: Mapping[str, Any]) -> str:
    extra = [f"cgroup {v['cgroup']}" if v.get("cgroup") else "", f"uid {v['uid']}" if v.get("uid") is not None
             else "", f"{_bytes(v['rss_bytes'])} resident" if isinstance(v.get("rss_bytes"), int) else "",
             f"{_bytes(v['gpu_bytes'])} on a GPU" if isinstance(v.get("gpu_bytes"), int) else "",
             f"user {v['user']}" if v.get("user") else ""]
    more = ", ".join(x for x in extra if x)
    return f"pid {v.get('pid')} {v.get('command') or '?'}" + (f" ({more})" if more else "")


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
