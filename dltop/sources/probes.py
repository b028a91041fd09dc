"""Probe files: what training and serving processes with `dltop.probe` publish about themselves (docs/probe.md).

A cheap directory listing every refresh. Each file is checked before it is believed — the directory private,
the file a regular one of the right owner, at most 4 KiB, format 1, its process alive with the start time the
file names — and whatever fails is an `IgnoredProbe` with the reason, never an exception. No symlink is
followed: the directory is opened with O_DIRECTORY|O_NOFOLLOW and each file through its descriptor.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import itertools
import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from dltop.config import Settings
from dltop.model.probes import (
    NO_LOSS,
    NO_SAMPLES,
    NO_TOKENS,
    IgnoredProbe,
    ProbeDevice,
    ProbeEpoch,
    ProbeLoader,
    ProbesPart,
    ProcessProbe,
)
from dltop.probe.files import (
    DIR_FLAGS,
    FORMAT,
    KEEP_EXITED_S,
    MAX_FILE_BYTES,
    MEMFD_LINK,
    SEALS,
    check_dir,
    pid_namespace,
    proc_stat,
    signal_file,
)
from dltop.sources.base import Source
from dltop.sources.gpu_procs import parse_cmdline
from dltop.sources.procio import with_job_reads
from dltop.sources.rendezvous import MAX_FDS, ProbeDir, Rendezvous

FILE_NAME = re.compile(r"[0-9]{1,10}\.json")
MAX_ENTRIES = 4096  # names looked at per folder (each folder is one user's own: a cut costs only that user)
MAX_LIVE = 256  # files of live processes read per folder (a user runs at most so many probed processes)
READ_BUDGET_S = 0.5  # one reading's time for the files; what is left is said, per folder
MEMFD_BUDGET_S = 0.25  # one reading's time for the memfd probes
NOT_WATCHED = "the process watched no model, optimizer or cache (probe.watch_model / watch_optimizer / watch_kv)"
NO_TRACK = "the process iterates no loader through probe.track()"
NONFINITE = ("nan", "inf", "-inf")
MAX_LOSS = 1e15  # a loss beyond this either way is not a measurement
MAX_RATE = 1e12  # samples or tokens a second
MAX_EXITED = 8  # exited processes kept per user (the newest): older ones are listed as ignored
EXIT_HOWS = ("exit", "exception")


T = TypeVar("T")


class Malformed(ValueError):
    """A probe file that is JSON but not of format 1's shape."""


# Bounds on what a probe may claim: anything outside is another user's typo or attack, not a measurement.
MAX_BYTES = 1 << 50  # 1 PiB on one device
MAX_COUNT = 1 << 53  # steps, shapes, recompiles: a float64 still counts them exactly
MAX_SECONDS = 10 * 365 * 86400.0  # a duration of ten years
MAX_DEPTH = 8  # format 1 nests 4 deep (devices.cuda:0.memory_stats); json's own recursion is not a bound
MAX_TEXT = 4096
PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


# A JSON string, or an unterminated one to the end (the scan below ignores all that a string holds). One match
# per string (the unrolled form: no per-byte alternation), so a run of '\\"' costs one pass, not one per quote.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(raw: bytes, limit: int) -> int:
    """How deep `raw` (JSON) nests arrays and objects, counting up to `limit` + 1: checked before parsing, so a
    file of 4,000 '[' costs a scan, never a RecursionError in the parser. Strings are cut out and the rest
    reduced to its brackets in C first (a byte-by-byte loop took three times as long)."""
    depth = deepest = 0
    for b in _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKET):
        if b in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def _type_name(kind: type | tuple[type, ...]) -> str:
    return getattr(kind, "__name__", "a number")


def _out_of_range(v: float, low: float, high: float) -> str | None:
    """Why `v` is not a number from `low` to `high` (None when it is)."""
    if isinstance(v, float) and not math.isfinite(v):
        return f"{v} is not a finite number"
    if v < low:
        return "negative" if low == 0 else "below the range"
    if v > high:
        return "an absurd number (over 1 PiB)" if high == MAX_BYTES else f"an absurd number (over {high:.4g})"
    return None


class _Fields:
    """Reads one object's fields, each validated; a field that fails and may be absent becomes None with a note
    (`notes[path] = why`), one that must be there raises Malformed."""

    def __init__(self, doc: dict[str, Any], where: str, notes: dict[str, str]) -> None:
        self.doc, self.where, self.notes = doc, where, notes

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _bad(self, key: str, why: str, optional: bool) -> None:
        if not optional:
            raise Malformed(f"{self._path(key)}: {why}")
        self.notes[self._path(key)] = f"{self._path(key)}: {why}"

    def check(self) -> None:
        """Raise Malformed with the first field that failed."""
        if self.notes:
            raise Malformed(next(iter(self.notes.values())))

    def sub(self, key: str) -> _Fields:
        """The fields of the object at `key` (none when it is absent or not an object), noted where these are."""
        return _Fields(self.get(key, dict, optional=True) or {}, self._path(key), self.notes)

    def array(self, key: str) -> list[Any]:
        """The array at `key`: empty where it is absent or no array (noted)."""
        return self.get(key, list, optional=True) or []

    def get(self, key: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
        value = self.doc.get(key)
        if value is None:
            if not optional:
                raise Malformed(f"{self._path(key)}: missing")
            return None
        # bool is an int in Python; a count that is true or false is not a count
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))):
            self._bad(key, f"expected {_type_name(kind)}, got {type(value).__name__}", optional)
            return None
        if isinstance(value, str) and len(value) > MAX_TEXT:
            self._bad(key, f"{len(value)} characters (over {MAX_TEXT})", optional)
            return None
        return value

    def num(self, key: str, optional: bool = False, high: float = MAX_SECONDS) -> float | None:
        """A finite number from 0 to `high`."""
        value = self.get(key, (int, float), optional)
        if value is None:
            return None
        # an int of 400 digits is not a float; a NaN is named as itself (it compares false to any bound)
        v = float(value) if isinstance(value, float) or -1e308 < value < 1e308 else math.inf
        why = _out_of_range(v, 0, high)
        if why:
            self._bad(key, why, optional)
            return None
        return v

    def time(self, key: str, optional: bool = False) -> float | None:
        """An epoch timestamp (seconds): after 2000 and at most a day ahead of this clock."""
        v = self.num(key, optional, high=time.time() + 86400)
        if v is not None and v < 946684800:
            self._bad(key, f"{v:g} is before the year 2000", optional)
            return None
        return v

    def count(self, key: str, optional: bool = False, high: int = MAX_COUNT) -> int | None:
        value = self.get(key, int, optional)
        why = None if value is None else _out_of_range(value, 0, high)
        if why:
            self._bad(key, why, optional)
            return None
        return value  # type: ignore[no-any-return]


def _believed(items: Iterable[tuple[str, Any]], notes: dict[str, str], build: Callable[[_Fields], T]) -> tuple[T, ...]:
    """What `build` makes of each (path, object); one that is no object or cannot be believed is left out, noted."""
    out = []
    for where, d in items:
        if not isinstance(d, dict):
            notes[where] = f"{where} ignored: expected an object"
            continue
        try:
            out.append(build(_Fields(d, where, {})))
        except Malformed as e:
            notes[where] = f"{where} left out: {str(e).removeprefix(where + '.')}"
    return tuple(out)


def _device(f: _Fields) -> ProbeDevice:
    """One device's numbers; Malformed when one of them cannot be believed."""
    stats = _memory_stats(f.doc.get("memory_stats") or {}, f.where)
    sizes = {key: f.count(key, optional=True, high=MAX_BYTES) or 0 for key in _TOTALS}
    pci = f.get("pci_bus_id", str, optional=True)
    if pci is not None and not PCI_ADDRESS.fullmatch(pci):
        raise Malformed(f"{f.where}.pci_bus_id: not a PCI address (domain:bus:device.function in hex)")
    runtime = f.get("runtime", str, optional=True)
    if runtime not in (None, "cuda", "hip"):
        raise Malformed(f"{f.where}.runtime: expected cuda or hip")
    f.check()
    return ProbeDevice(device=f.where.removeprefix("devices."), **sizes,
                       memory_stats={str(k): v for k, v in stats.items()},
                       uuid=f.get("uuid", str, optional=True), pci_bus_id=pci, runtime=runtime)


def _memory_stats(stats: Any, where: str) -> dict[Any, int]:
    """A device's torch.cuda.memory_stats(): counts, else Malformed."""
    if not isinstance(stats, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT
                                              for v in stats.values()):
        raise Malformed(f"{where}.memory_stats: expected counts from 0 to {MAX_COUNT}")
    return stats


def _epoch(f: _Fields) -> ProbeEpoch:
    """One closed epoch; Malformed when one of its numbers cannot be believed."""
    epoch = ProbeEpoch(index=f.count("index") or 0, started_at=f.time("started_at") or 0.0,
                       ended_at=f.time("ended_at") or 0.0, duration_s=f.num("duration_s") or 0.0,
                       data_wait_s=f.num("data_wait_s") or 0.0, steps=f.count("steps") or 0,
                       data_cached_delta_bytes=_delta(f, "data_cached_delta_bytes"),
                       data_cached_source=_source(f),
                       # a probe before 0.x named the machine's figure page_cache_delta_bytes
                       machine_cached_delta_bytes=_delta(f, "machine_cached_delta_bytes"
                                                         if "machine_cached_delta_bytes" in f.doc
                                                         else "page_cache_delta_bytes"),
                       gpu_util=f.num("gpu_util", optional=True, high=100.0),
                       samples=f.count("samples", optional=True), tokens=f.count("tokens", optional=True),
                       loss=_loss(f, "loss"), loss_nonfinite=_nonfinite(f, "loss_nonfinite"))
    f.check()
    if epoch.data_wait_s > epoch.duration_s * 1.01 + 0.01:
        raise Malformed(f"{f.where}.data_wait_s: {epoch.data_wait_s:g} is longer than the epoch")
    return epoch


MAX_LOADERS = 4  # the probe's own bound: more in a file are left out with a note
LOADER_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,32}")


def _loaders(doc: Any, notes: dict[str, str]) -> tuple[ProbeLoader, ...]:
    """The loaders timed apart from the main one; each that cannot be believed is left out with a note."""
    if doc is None:
        return ()
    if not isinstance(doc, dict):
        notes["loaders"] = "loaders ignored: expected an object"
        return ()
    out = []
    for i, (name, d) in enumerate(doc.items()):
        where = f"loaders.{name}" if LOADER_NAME.fullmatch(str(name)) else f"loaders[{i}]"
        if i >= MAX_LOADERS:
            notes["loaders"] = f"loaders: over {MAX_LOADERS}, the rest left out"
            break
        if where.startswith("loaders["):
            notes[where] = f"{where} left out: a name of letters, digits and ._:- (1 to 32) expected"
            continue
        if not isinstance(d, dict):
            notes[where] = f"{where} left out: expected an object"
            continue
        try:
            out.append(_loader(str(name), d, where))
        except Malformed as e:
            notes[where] = f"{where} left out: {str(e).removeprefix(where + '.')}"
    return tuple(out)


def _loader(name: str, d: dict[str, Any], where: str) -> ProbeLoader:
    """One loader's numbers; Malformed when one of them cannot be believed."""
    f = _Fields(d, where, {})
    steps, recent = f.count("steps"), f.count("recent_steps", optional=True)
    wait_s, step_s = f.num("recent_wait_s", optional=True), f.num("recent_step_s", optional=True)
    age = f.num("last_step_age_s", optional=True)
    f.check()
    if wait_s is not None and step_s is not None and wait_s > step_s * 1.01 + 0.01:
        raise Malformed(f"{where}.recent_wait_s: {wait_s:g} is longer than its steps")
    fraction, step_time = _timing(recent, wait_s, step_s)
    return ProbeLoader(name=name, steps=steps or 0, step_time_s=step_time, data_wait_fraction=fraction,
                       last_step_age_s=age)


def _timing(recent: int | None, wait_s: float | None, step_s: float | None) -> tuple[float | None, float | None]:
    """(data wait fraction, step time) of `recent` steps that took `step_s`, `wait_s` of it waiting; or Nones."""
    if recent and step_s and wait_s is not None:
        return min(wait_s / step_s, 1.0), step_s / recent
    return None, None


def _loss(f: _Fields, key: str) -> float | None:
    """A loss: a finite number, negative or not (a log-likelihood), within MAX_LOSS either way."""
    value = f.get(key, (int, float), optional=True)
    if value is None:
        return None
    v = float(value) if isinstance(value, float) or -1e308 < value < 1e308 else math.inf
    if not math.isfinite(v) or abs(v) > MAX_LOSS:
        f._bad(key, f"{v:g} is not a finite number" if not math.isfinite(v) else
               f"an absurd number (over {MAX_LOSS:g} either way)", optional=True)
        return None
    return v


def _nonfinite(f: _Fields, key: str) -> str | None:
    """Which of nan, inf or -inf a loss that is not a number was."""
    value = f.get(key, str, optional=True)
    if value is not None and value not in NONFINITE:
        f._bad(key, f"expected one of {', '.join(NONFINITE)}", optional=True)
        return None
    return value  # type: ignore[no-any-return]


def _rate(f: _Fields, key: str, total: int | None, recent: float | None, step_s: float | None,
          unavailable: dict[str, str], missing: str, idle: str) -> tuple[float | None, int | None]:
    """Samples or tokens a second over the recent steps (`key`: "samples" or "tokens" in `data`), and the total;
    the reason in `unavailable[key + "_per_s"]` where there is no rate."""
    name, recent_key = f"{key}_per_s", f"recent_{key}"
    got = f.count(recent_key, optional=True)
    if total is None:
        unavailable[name] = missing
        return None, None
    if got is None or not recent or not step_s:
        unavailable[name] = idle
        return None, total
    why = (f"{got} is more than the {total} in all" if got > total else
           f"an absurd rate (over {MAX_RATE:g} a second)" if got / step_s > MAX_RATE else None)
    if why is not None:
        f._bad(recent_key, why, optional=True)
        unavailable[name] = f"{f._path(recent_key)}: not believable"
        return None, total
    return got / step_s, total


def _loss_doc(f: _Fields, unavailable: dict[str, str]) -> dict[str, Any]:
    """The last loss logged: the ProcessProbe's loss fields, or why there is none in `unavailable["loss"]`."""
    doc = f.get("loss", dict, optional=True)
    if doc is None:
        unavailable["loss"] = f.notes.get("loss", NO_LOSS)
        return {}
    fl = _Fields(doc, "loss", f.notes)
    value, nonfinite = _loss(fl, "value"), _nonfinite(fl, "nonfinite")
    if value is not None and nonfinite is not None:
        fl._bad("nonfinite", "given beside a finite value", optional=True)
        nonfinite = None
    if value is None and nonfinite is None:
        unavailable["loss"] = f.notes.get("loss.value", "the last loss logged was not one number")
    return {"loss": value, "loss_nonfinite": nonfinite, "losses_logged": fl.count("logged", optional=True),
            "loss_age_s": fl.num("age_s", optional=True)}


def _delta(f: _Fields, key: str) -> int | None:
    """A page-cache change over an epoch: may be negative, never beyond a PiB either way."""
    value = f.get(key, int, optional=True)
    if value is not None and not -MAX_BYTES <= value <= MAX_BYTES:
        f._bad(key, "an absurd number (over 1 PiB either way)", optional=True)
        return None
    return value  # type: ignore[no-any-return]


def _source(f: _Fields) -> str | None:
    """How the job's page cache was measured, or why not: text from the probe, bounded."""
    value = f.get("data_cached_source", str, optional=True)
    return None if value is None else value[:200]


def _str_map(f: _Fields, key: str) -> dict[str, str]:
    m = f.get(key, dict, optional=True) or {}
    return {str(k)[:MAX_TEXT]: str(v)[:MAX_TEXT] for k, v in m.items() if isinstance(v, str | int | float)}


def _count_map(f: _Fields, key: str) -> dict[str, int]:
    inner = f.sub(key)
    return {str(k): v for k in inner.doc if (v := inner.count(str(k), optional=True)) is not None}


_TOTALS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "kv_bytes")


def parse_probe(doc: Any, path: str, uid: int) -> ProcessProbe:
    """A ProcessProbe from a decoded format-1 file. A field that must be there and is not believable raises
    Malformed naming it; any other field that is not (NaN, negative, absurd, the wrong type) is left out, its
    reason in `unavailable` under the field's path."""
    if not isinstance(doc, dict):
        raise Malformed("expected a JSON object")
    notes: dict[str, str] = {}
    f = _Fields(doc, "", notes)
    devices_doc = f.get("devices", dict)
    devices = _believed(((f"devices.{k}", v) for k, v in sorted(devices_doc.items())), notes, _device)
    unavailable: dict[str, str] = {}
    totals = _totals(devices, notes, unavailable)
    data = f.get("data", dict, optional=True)
    fd = _Fields(data or {}, "data", notes)  # with no data, each optional field of it is None
    fraction, step_time, rates = _step_timing(fd, data is not None, unavailable)
    cudnn = f.sub("cudnn")
    exits = _exit_fields(f)
    return ProcessProbe(
        pid=f.count("pid", high=1 << 22) or 0, path=path, uid=uid,
        start_time_ticks=f.count("start_time_ticks") or 0,
        cmd=f.get("cmd", str), published_at=f.time("published_at") or 0.0,
        started_at=f.time("started_at", optional=True), rank=f.count("rank", optional=True, high=1 << 24),
        local_rank=f.count("local_rank", optional=True, high=1 << 24),
        world_size=f.count("world_size", optional=True, high=1 << 24),
        ppid=f.count("ppid", optional=True, high=1 << 22), job_id=f.get("job_id", str, optional=True),
        torch_version=f.get("torch", str, optional=True),
        weights_bytes=totals["weights_bytes"], gradients_bytes=totals["gradients_bytes"],
        optimizer_bytes=totals["optimizer_bytes"], kv_bytes=totals["kv_bytes"], devices=devices,
        watched=_count_map(f, "watched"),
        data_wait_fraction=fraction, step_time_s=step_time,
        last_step_s=fd.num("last_step_s", optional=True),
        last_step_age_s=fd.num("last_step_age_s", optional=True),
        window_s=fd.num("window_s", optional=True),
        in_epoch=fd.get("in_epoch", bool, optional=True),
        optimizer_steps=f.count("optimizer_steps", optional=True),
        steps=fd.count("steps", optional=True),
        input_shapes=fd.count("input_shapes", optional=True),
        loader_workers=fd.count("loader_workers", optional=True, high=1 << 16),
        pin_memory=fd.get("pin_memory", bool, optional=True),
        data_dir=fd.get("data_dir", str, optional=True),
        **rates, **_loss_doc(f, unavailable),
        cudnn_benchmark=cudnn.get("benchmark", bool, optional=True),
        cudnn_deterministic=cudnn.get("deterministic", bool, optional=True),
        compile=_count_map(f, "compile"),
        allocator_env=_str_map(f, "allocator_env"),
        epochs=_believed(((f"epochs[{i}]", e) for i, e in enumerate(f.array("epochs"))), notes, _epoch),
        loaders=_loaders(doc.get("loaders"), notes),
        gpu_util_source=f.get("gpu_util_source", str, optional=True),
        truncated=tuple(str(t)[:80] for t in f.array("truncated")[:32]), unavailable={**unavailable, **notes},
        **exits, folder_refused=f.get("folder_refused", str, optional=True),
    )


def _totals(devices: tuple[ProbeDevice, ...], notes: dict[str, str],
            unavailable: dict[str, str]) -> dict[str, int | None]:
    """The watched bytes summed over the devices; None, and why, where a device was left out or none is watched."""
    dropped = [k for k in notes if k.startswith("devices.")]
    why = f"not summed: {notes[dropped[0]]}" if dropped else None if devices else NOT_WATCHED
    if why is not None:
        unavailable.update(dict.fromkeys(_TOTALS, why))
        return dict.fromkeys(_TOTALS)
    return {key: sum(getattr(d, key) for d in devices) for key in _TOTALS}


def _step_timing(fd: _Fields, given: bool, unavailable: dict[str, str]) -> tuple[
        float | None, float | None, dict[str, Any]]:
    """The data wait fraction and the step time over the recent steps, and the samples' and tokens' rates and
    totals; why not in `unavailable`."""
    if not given:
        unavailable["data_wait_fraction"] = unavailable["step_time_s"] = NO_TRACK
        return None, None, {}
    recent_steps, wait_s, step_s = fd.count("recent_steps", optional=True), \
        fd.num("recent_wait_s", optional=True), fd.num("recent_step_s", optional=True)
    window_s = fd.num("window_s", optional=True)
    fraction, step_time = _timing(recent_steps, wait_s, step_s)
    if step_time is None:
        unavailable["data_wait_fraction"] = unavailable["step_time_s"] = _no_steps_reason(fd, window_s)
    idle = unavailable.get("step_time_s", "")
    rates: dict[str, Any] = {}
    for key, missing in (("samples", NO_SAMPLES), ("tokens", NO_TOKENS)):
        rate, total = _rate(fd, key, fd.count(key, optional=True), recent_steps, step_s if step_time else None,
                            unavailable, missing, idle)
        rates[f"{key}_per_s"], rates[key] = rate, total
    return fraction, step_time, rates


def _no_steps_reason(fd: _Fields, window_s: float | None) -> str:
    if any(k in fd.notes for k in ("data.recent_steps", "data.recent_wait_s", "data.recent_step_s")):
        return "the probe's recent steps are not believable"
    if fd.count("steps", optional=True) and window_s is not None:
        return f"no step ended in the last {window_s:g} s"
    return "no step finished yet"


def _exit_fields(f: _Fields) -> dict[str, Any]:
    """How the process ended, as its probe wrote it at exit (None for each where it has not)."""
    fe = f.sub("exit")
    how = fe.get("how", str, optional=True)
    if how is not None and how not in EXIT_HOWS:
        fe._bad("how", f"expected one of {', '.join(EXIT_HOWS)}", optional=True)
        how = None
    return {"exit_how": how, "exit_error": fe.get("error", str, optional=True),
            "exit_code": fe.count("exit_code", optional=True, high=255), "exited_at": fe.time("at", optional=True)}


class HostPids:
    """The pids this dltop sees (a DaemonSet's hostPID) of processes in other PID namespaces (pods): a probe
    in a pod names its pid in the pod. Worked out once per read, with one stat per process, only when asked."""

    def __init__(self, proc: str) -> None:
        self.proc = proc
        self._map: dict[tuple[int, int], int] | None = None

    def find(self, pidns: int, pid: int) -> int | None:
        """The pid here of the process that is `pid` in the namespace `pidns`, or None."""
        if self._map is None:
            self._map = {}
            try:
                pids = [n for n in os.listdir(self.proc) if n.isdigit()]
            except OSError:
                pids = []
            for p in pids:
                ns = pid_namespace(self.proc, p)
                if ns is None:
                    continue
                inner = _innermost_pid(self.proc, p)
                if inner is not None:
                    self._map[(ns, inner)] = int(p)
        return self._map.get((pidns, pid))

    def translate(self, probe: ProcessProbe, pidns: int) -> ProcessProbe | None:
        """The probe of a process in `pidns` with the pids NVML and /proc here give; None where it runs no more."""
        host = self.find(pidns, probe.pid)
        if host is None:
            return None
        return dataclasses.replace(probe, pid=host, ppid=self.find(pidns, probe.ppid) if probe.ppid else None)


def _innermost_pid(proc: str, pid: str) -> int | None:
    """The last pid of `NSpid:` in /proc/PID/status: the process's pid in its own namespace."""
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_file(dir_fd: int, name: str, path: str, me: int, proc: str, pidns: int | None, hosts: HostPids,
               memo: dict[ParseKey, ProcessProbe | str], seen: dict[ParseKey, ProcessProbe | str]) -> ProcessProbe | str:
    """The probe in `name`, or why it was ignored. `pidns`: the PID namespace the file's pids are in, when it
    is not this dltop's (a pod's), and `hosts` to find them here. `memo`: the parses of the files' bytes last
    read (a file that has not changed, an exited job's or one that publishes less often than every tick, is
    not decoded and checked again), this one's put in `seen`; what is read from /proc is checked every time."""
    read = _read_raw(dir_fd, name, me)
    if isinstance(read, str):
        return read
    st, raw = read
    key = (path, st.st_uid, raw)
    parsed = memo.get(key)
    if parsed is None:
        parsed = _parse_file(raw, path, st.st_uid)
    seen[key] = parsed
    if isinstance(parsed, str):
        return parsed
    if str(parsed.pid) != name.removesuffix(".json"):
        return f"malformed: names pid {parsed.pid}, not the file's"
    got = _running(parsed, st.st_uid, proc, pidns, hosts)
    if isinstance(got, ProcessProbe) and got.exited and got.exit_how is None:
        return _signalled(dir_fd, name.removesuffix(".json"), me, got)
    return got


MAX_SIGNAL_BYTES = 8192  # of the stack the probe's SIGTERM handler wrote: its first frame is what is shown
_FRAME = re.compile(r'\s*File "([^"\n]{1,4096})", line (\d{1,9}) in ([^\n]{1,256})')


def _signalled(dir_fd: int, pid: str, me: int, probe: ProcessProbe) -> ProcessProbe:
    """An exited process with no exit record whose probe's SIGTERM handler wrote the stack it hit into
    `<pid>.signal` (docs/probe.md): killed by SIGTERM, where its main thread was. The file is checked as a probe
    file is (a regular file of the folder's owner, not a link, bounded) and must be this process's (written after
    it started publishing); its text is the user's, shown printable and cut."""
    try:
        fd = os.open(signal_file(pid), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return probe
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != me or st.st_size == 0:
            return probe
        if probe.started_at is not None and st.st_mtime < probe.started_at - 1:
            return probe  # an older process's of the same pid
        raw = os.read(fd, MAX_SIGNAL_BYTES)
    except OSError:
        return probe
    finally:
        os.close(fd)
    frame = _FRAME.search(raw.decode("utf-8", "replace"))
    where = f"{os.path.basename(frame[1])}:{frame[2]} in {frame[3].strip()}"[:200] if frame else None
    if where is not None:  # the user's text (a file name may hold anything): nothing the terminal would act on
        where = "".join(c if c.isprintable() else "?" for c in where)
    return dataclasses.replace(probe, exit_signal="SIGTERM", exit_where=where)


def _read_raw(dir_fd: int, name: str, me: int) -> tuple[os.stat_result, bytes] | str:
    """A probe file's stat and bytes: a regular file of `me`'s (the folder's owner, the only one who can have
    written it, a hard link aside), within the size limit, opened without following a link; or why not."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink in place of the file: not followed"
        return f"cannot open: {e.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_uid != me:
            return f"owned by uid {st.st_uid}, not the folder's owner (uid {me})"
        if st.st_size > MAX_FILE_BYTES:
            return f"{st.st_size} bytes: over the {MAX_FILE_BYTES}-byte limit"
        raw = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as e:
        return f"cannot read: {e.strerror}"
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        return f"over the {MAX_FILE_BYTES}-byte limit"
    return st, raw


def _running(probe: ProcessProbe, uid: int, proc: str, pidns: int | None, hosts: HostPids) -> ProcessProbe | str:
    """The probe of a file owned by `uid` checked against /proc: its process's pids here, exited where the process
    is gone (or tearing down), refused where another user's process has its pid."""
    if pidns is not None:
        here = hosts.translate(probe, pidns)
        if here is None:  # not running: exited (its pid stays the pod's)
            return _exited(probe)
        probe = here
    got = proc_stat(probe.pid, proc)
    if got is None or got[0] != probe.start_time_ticks:  # gone, or its pid reused by another process
        return _exited(probe)
    try:
        owner = os.stat(f"{proc}/{probe.pid}").st_uid
    except OSError:
        return _exited(probe)
    if uid != 0 and owner != uid:
        return f"process {probe.pid} belongs to uid {owner}, not the file's owner (uid {uid})"
    probe = dataclasses.replace(probe, proc_state=got[1])
    if probe.exit_how is not None or got[1] == "Z":  # its exit record is written, or it is gone but not reaped
        return _exited(probe)
    return _aged(probe, max(0.0, time.time() - probe.published_at))


def _aged(probe: ProcessProbe, since_s: float) -> ProcessProbe:
    """The probe as it is `since_s` after its publication: the last step that much older, and its numbers over
    the recent window (step time, data wait, samples and tokens a second) gone once that step has left the window
    (a stopped process publishes no more: its last numbers would stay on screen as if they were current)."""
    if probe.last_step_age_s is None:
        return probe
    age = round(min(probe.last_step_age_s + since_s, MAX_SECONDS), 3)
    window = probe.window_s if probe.window_s is not None else 10.0
    probe = dataclasses.replace(probe, last_step_age_s=age, loaders=tuple(_aged_loader(q, since_s, window)
                                                                          for q in probe.loaders))
    current = (probe.step_time_s, probe.data_wait_fraction, probe.samples_per_s, probe.tokens_per_s)
    if age <= window or since_s <= 0 or all(v is None for v in current):  # none left, the probe's reason kept
        return probe
    why = f"no step ended in the last {window:g} s (its probe last published {since_s:.0f} s ago)"
    gone = ("step_time_s", "data_wait_fraction", "samples_per_s", "tokens_per_s")
    return dataclasses.replace(probe, step_time_s=None, data_wait_fraction=None, samples_per_s=None,
                               tokens_per_s=None, unavailable={**probe.unavailable, **dict.fromkeys(gone, why)})


def _aged_loader(q: ProbeLoader, since_s: float, window: float) -> ProbeLoader:
    if q.last_step_age_s is None:
        return q
    age = round(min(q.last_step_age_s + since_s, MAX_SECONDS), 3)
    if age <= window or since_s <= 0:
        return dataclasses.replace(q, last_step_age_s=age)
    return dataclasses.replace(q, last_step_age_s=age, step_time_s=None, data_wait_fraction=None)


def _parse_file(raw: bytes, path: str, uid: int) -> ProcessProbe | str:
    """The probe the bytes of a file hold, or why they hold none: a pure function of its arguments."""
    if nesting_depth(raw, MAX_DEPTH) > MAX_DEPTH:
        return f"malformed: nested deeper than {MAX_DEPTH} levels"
    try:
        doc = json.loads(raw.decode("utf-8"))  # NaN and Infinity parse; each field is checked
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return f"malformed: not JSON ({str(e).splitlines()[0][:80]})"
    version = doc.get("format") if isinstance(doc, dict) else None
    if type(version) is int and version > FORMAT:
        return f"format {version} is newer than this dltop reads ({FORMAT})"
    try:
        if type(version) is not int or version != FORMAT:
            raise Malformed(f"format: expected {FORMAT}")
        return parse_probe(doc, path, uid)
    except (Malformed, RecursionError) as e:
        return f"malformed: {e}"


def _exited(probe: ProcessProbe) -> ProcessProbe:
    """The probe of a process that is gone: kept for the post-mortem, with how it ended where its exit record
    says (no record: killed or crashed), at the record's time or else its last publication."""
    return dataclasses.replace(probe, exited=True, exited_at=probe.exited_at or probe.published_at)


ParseKey = tuple[str, int, bytes]  # a probe file's path, owner and bytes


def _candidates(dir_fd: int, path: str, owner: int, proc: str, pidns: int | None,
                ignored: list[IgnoredProbe]) -> list[str]:
    """The names in a user's folder worth reading, cheapest checks first: at most MAX_LIVE of live processes
    that user runs (the kernel's owner of /proc/PID; in a pod's folder, any), and the MAX_EXITED newest of the
    rest. A folder its user stuffed costs that user its own entries, each cut said."""
    names = sorted(n for n in os.listdir(dir_fd) if FILE_NAME.fullmatch(n))
    if len(names) > MAX_ENTRIES:
        ignored.append(IgnoredProbe(path, f"{len(names) - MAX_ENTRIES} probe files past the first {MAX_ENTRIES}: "
                                          "not looked at", cut=True))
        names = names[:MAX_ENTRIES]
    live, gone = [], []
    for name in names:
        if pidns is not None or _runs_for(proc, name.removesuffix(".json"), owner):  # a pod's: HostPids finds it
            live.append(name)
        else:
            gone.append(name)
    if len(live) > MAX_LIVE:
        ignored.append(IgnoredProbe(path, f"{len(live) - MAX_LIVE} files of live processes past {MAX_LIVE}: "
                                          "not read", cut=True))
        live = live[:MAX_LIVE]
    if len(gone) > MAX_EXITED:
        def mtime(name: str) -> float:
            try:
                return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
            except OSError:
                return 0.0
        gone.sort(key=mtime, reverse=True)
        ignored += [IgnoredProbe(os.path.join(path, n), f"an exited process's, older than its user's "
                                                        f"{MAX_EXITED} newest") for n in gone[MAX_EXITED:]]
        gone = gone[:MAX_EXITED]
    return live + gone


def _runs_for(proc: str, pid: str, owner: int) -> bool:
    """Whether `pid` runs as `owner` (as anyone, for root): another user's live pid is not the file's process."""
    try:
        uid = os.stat(f"{proc}/{pid}").st_uid
    except OSError:
        return False
    return owner == 0 or uid == owner


def read_probes(dirs: Sequence[ProbeDir], root: str = "/",
                memo: dict[ParseKey, ProcessProbe | str] | None = None) -> ProbesPart:
    """Every probe in `dirs` ((directory, its owner's uid[, the PID namespace of its pids])), each checked, within
    READ_BUDGET_S: the folders alone, with no memfd (ProbeReader reads both). `memo` (kept by the caller between
    reads) holds the parses of the files seen by the last read, and only those."""
    processes, ignored = _read_dirs(dirs, root, {} if memo is None else memo)
    return assemble(tuple(d[0] for d in dirs), processes, ignored, os.path.join(root, "proc"))


def _read_dirs(dirs: Sequence[ProbeDir], root: str, memo: dict[ParseKey, ProcessProbe | str],
               ) -> tuple[list[ProcessProbe], list[IgnoredProbe]]:
    seen: dict[ParseKey, ProcessProbe | str] = {}
    proc = os.path.join(root, "proc")
    here = pid_namespace(proc)
    hosts = HostPids(proc)
    processes: list[ProcessProbe] = []
    ignored: list[IgnoredProbe] = []
    deadline = time.monotonic() + READ_BUDGET_S
    for path, owner, *rest in dirs:
        pidns = rest[0] if rest and rest[0] != here else None
        try:
            dir_fd = os.open(path, DIR_FLAGS)
        except OSError as e:
            if e.errno != errno.ENOENT:
                ignored.append(IgnoredProbe(path, "a symlink in place of the directory: not followed"
                                            if e.errno in (errno.ELOOP, errno.ENOTDIR) else f"cannot open: {e.strerror}"))
            continue
        try:
            for got in _read_dir(dir_fd, path, owner, proc, pidns, hosts, memo, seen, deadline, ignored):
                processes.append(dataclasses.replace(got, pidns=pidns) if pidns is not None else got)
        except OSError as e:
            ignored.append(IgnoredProbe(path, f"cannot list: {e.strerror}"))
        finally:
            os.close(dir_fd)
    memo.clear()
    memo.update(seen)
    return processes, ignored


def _read_dir(dir_fd: int, path: str, owner: int, proc: str, pidns: int | None, hosts: HostPids,
              memo: dict[ParseKey, ProcessProbe | str], seen: dict[ParseKey, ProcessProbe | str],
              deadline: float, ignored: list[IgnoredProbe]) -> Iterator[ProcessProbe]:
    """The probes of one folder, once it is trusted (a private one of `owner`'s), read until the deadline; the
    folder or each file left out said in `ignored`."""
    untrusted = check_dir(dir_fd, owner)
    if untrusted is not None:
        ignored.append(IgnoredProbe(path, f"directory {untrusted}: not trusted"))
        return
    names = _candidates(dir_fd, path, owner, proc, pidns, ignored)
    for i, name in enumerate(names):
        if time.monotonic() > deadline:
            ignored.append(IgnoredProbe(path, f"{len(names) - i} files not read: the reading's "
                                              f"{READ_BUDGET_S:g} s ran out", cut=True))
            return
        got = _read_file(dir_fd, name, os.path.join(path, name), owner, proc, pidns, hosts, memo, seen)
        if isinstance(got, str):
            ignored.append(IgnoredProbe(os.path.join(path, name), got))
        else:
            yield got


def assemble(dirs: tuple[str, ...], processes: list[ProcessProbe], ignored: list[IgnoredProbe],
             proc: str = "/proc") -> ProbesPart:
    """The part: live processes with their command and user in the kernel's word, and each user's MAX_EXITED
    newest exited ones (a user's many exited files never push another user's out)."""
    live = sorted((_from_kernel(p, proc) for p in processes if not p.exited), key=lambda p: p.pid)
    exited = sorted((dataclasses.replace(p, user=user_name(p.uid)) for p in processes if p.exited),
                    key=lambda p: (-(p.exited_at or 0.0), p.pid))
    kept: list[ProcessProbe] = []
    per_user: dict[int, int] = {}
    for p in exited:
        per_user[p.uid] = per_user.get(p.uid, 0) + 1
        if per_user[p.uid] <= MAX_EXITED:
            kept.append(p)
        else:
            ignored.append(IgnoredProbe(p.path, f"process {p.pid} exited before uid {p.uid}'s {MAX_EXITED} "
                                                "newest exited ones"))
    return ProbesPart(dirs=dirs, processes=tuple(live), ignored=tuple(ignored), exited=tuple(kept))


_NAMES: dict[int, str | None] = {}


def user_name(uid: int) -> str | None:
    """The user's name (looked up once per uid), or None where the system has none."""
    if uid not in _NAMES:
        import pwd

        try:
            _NAMES[uid] = pwd.getpwuid(uid).pw_name
        except (KeyError, OverflowError):
            _NAMES[uid] = None
    return _NAMES[uid]


def proc_cmdline(proc: str, pid: int) -> str | None:
    """The process's command line as the kernel has it (/proc/PID/cmdline, arguments joined by spaces, cut to
    MAX_TEXT), or None when it cannot be read."""
    try:
        fd = os.open(f"{proc}/{pid}/cmdline", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_TEXT) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_cmdline(raw)[:MAX_TEXT] or None


def _from_kernel(p: ProcessProbe, proc: str) -> ProcessProbe:
    """A live probe with what the kernel says of its process in place of what its file says: the command
    (/proc/PID/cmdline) and the user's name."""
    cmd = proc_cmdline(proc, p.pid)
    return dataclasses.replace(p, cmd=cmd if cmd is not None else p.cmd, user=user_name(p.uid))


def _read_memfd(proc: str, pid: int, fd: int, seen: dict[tuple[int, int, int], ProcessProbe | str],
                last: dict[tuple[int, int, int], ProcessProbe | str]) -> ProcessProbe | str | None:
    """The probe in the memfd process `pid` holds at `fd` (its folder was refused); None when it holds it no more.
    The datum's owner is the kernel's: the uid of the process and of the memfd, never a field. Nothing is opened by
    the path the process controls: /proc/PID/fd/N is taken with O_PATH (no device opened, no FIFO waited on, even
    should the process swap the descriptor meanwhile), checked through that fd of dltop's own, and only then read.
    `last`: the probes read last time by (pid, device, inode): a sealed memfd cannot change, so the same one is not
    read again."""
    try:
        ref = os.open(f"{proc}/{pid}/fd/{fd}", os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.readlink(f"/proc/self/fd/{ref}") != MEMFD_LINK:
            return None
        st = os.fstat(ref)
        uid = os.stat(f"{proc}/{pid}").st_uid  # its owner now, in the kernel's word
        if not stat.S_ISREG(st.st_mode):
            return "memfd: not a regular file"
        if st.st_uid != uid:
            return f"memfd owned by uid {st.st_uid}, not its process's (uid {uid})"
        key = (pid, st.st_dev, st.st_ino)
        if key in last:
            seen[key] = last[key]
            return last[key]
        got = _check_memfd(proc, pid, uid, os.open(f"/proc/self/fd/{ref}", os.O_RDONLY | os.O_CLOEXEC))
    except OSError as e:
        return f"memfd: {e.strerror}"
    finally:
        os.close(ref)
    seen[key] = got
    return got


def _check_memfd(proc: str, pid: int, uid: int, f: int) -> ProcessProbe | str:
    """The probe in the open memfd `f` of process `pid` (closed here), or why it is not believed."""
    path = f"{proc}/{pid}/fd"
    try:
        if fcntl.fcntl(f, fcntl.F_GET_SEALS) & SEALS != SEALS:
            return "memfd not sealed: it could change while read"
        if os.fstat(f).st_size > MAX_FILE_BYTES:
            return f"memfd over the {MAX_FILE_BYTES}-byte limit"
        raw = os.pread(f, MAX_FILE_BYTES + 1, 0)
    finally:
        os.close(f)
    parsed = _parse_file(raw, path, uid)
    if isinstance(parsed, str):
        return parsed
    ns = pid_namespace(proc, pid)
    here = pid_namespace(proc)
    inner = _innermost_pid(proc, str(pid)) if ns != here else pid
    if parsed.pid != inner:  # a child that inherited its parent's memfd, or a false pid
        return f"malformed: names pid {parsed.pid}, not its process's"
    got = proc_stat(pid, proc)
    if got is None or got[0] != parsed.start_time_ticks:
        return f"malformed: names another start time than process {pid}'s"
    return dataclasses.replace(parsed, pid=pid, ppid=got[2], pidns=ns if ns != here else None)


def _memfd_now(proc: str, probe: ProcessProbe) -> ProcessProbe:
    """A memfd probe (read once while its memfd is the same) as its process is now: its state, and its numbers
    aged since it published (a stopped process publishes no new memfd)."""
    got = proc_stat(probe.pid, proc)
    state = got[1] if got is not None and got[0] == probe.start_time_ticks else None
    return _aged(dataclasses.replace(probe, proc_state=state), max(0.0, time.time() - probe.published_at))


def _round_robin(memfds: Iterable[tuple[int, int, int]], ignored: list[IgnoredProbe]) -> list[tuple[int, int]]:
    """(pid, fd) of the memfds to read, one user's after another's in turn, MAX_LIVE a user (the rest said)."""
    by_user: dict[int, list[tuple[int, int]]] = {}
    for pid, fd, uid in memfds:
        by_user.setdefault(uid, []).append((pid, fd))
    for uid, held in by_user.items():
        if len(held) > MAX_LIVE:
            ignored.append(IgnoredProbe(f"uid {uid}", f"{len(held) - MAX_LIVE} processes with a probe's memfd "
                                                      f"past {MAX_LIVE}: not read", cut=True))
    return [h for group in itertools.zip_longest(*(held[:MAX_LIVE] for held in by_user.values()))
            for h in group if h is not None]


class ProbeReader:
    """The probes source's state between readings: where the probes are (`Rendezvous`), the parses of unchanged
    files, the folders that held files, and the probes found through a memfd, kept once their process is gone
    (with its last numbers) for as long as an exited file would be."""

    def __init__(self, root: str = "/", user: int | None = None, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.proc = os.path.join(root, "proc")
        self.rendezvous = Rendezvous(self.proc, user=user, env=env)
        self.memo: dict[ParseKey, ProcessProbe | str] = {}
        self.known_dirs: dict[str, ProbeDir] = {}  # folders that held a file: read while they are there
        self.live: dict[tuple[int, int], ProcessProbe] = {}  # (uid, pid) -> the last probe read from a memfd
        self.gone: dict[tuple[int, int], ProcessProbe] = {}
        self.memfds: dict[tuple[int, int, int], ProcessProbe | str] = {}  # (pid, dev, inode) -> what it held
        self.last: ProbesPart | None = None  # the latest reading (LastRead hands it to discovery)

    def _memfd_probes(self, r: Rendezvous, found: set[tuple[int, int]],
                      ignored: list[IgnoredProbe]) -> dict[tuple[int, int], ProcessProbe]:
        """The probes of the processes that hold a memfd: MAX_LIVE a user, round robin over the users within
        MEMFD_BUDGET_S (one user's thousands of memfd processes hold up no other's); one not reached keeps its last
        reading, and every cut is said."""
        order = _round_robin(r.memfds(), ignored)
        seen: dict[tuple[int, int, int], ProcessProbe | str] = {}
        now_live: dict[tuple[int, int], ProcessProbe] = {}
        deadline = time.monotonic() + MEMFD_BUDGET_S
        for i, (pid, fd) in enumerate(order):
            if time.monotonic() > deadline:
                ignored.append(IgnoredProbe(self.proc, f"{len(order) - i} memfd probes not read again: the "
                                                       f"reading's {MEMFD_BUDGET_S:g} s ran out", cut=True))
                left = {q for q, _ in order[i:]}
                now_live.update({k: p for k, p in self.live.items() if k[1] in left})
                break
            got = _read_memfd(self.proc, pid, fd, seen, self.memfds)
            if got is None:
                r.forget_memfd(pid)
            elif isinstance(got, str):
                ignored.append(IgnoredProbe(f"{self.proc}/{pid}/fd/{fd}", got))
            elif (got.uid, pid) not in found and r.wanted(got.uid):  # a file of its own says the same
                r.set_owner(pid, got.uid)
                now_live[(got.uid, pid)] = _memfd_now(self.proc, got)
        self.memfds = seen
        return now_live

    def _dirs(self, r: Rendezvous) -> dict[str, ProbeDir]:
        """The folders to read: the rendezvous's, and those that held a file while they are there."""
        dirs = {d[0]: d for d in r.dirs()}
        for path, d in list(self.known_dirs.items()):
            if not os.path.lexists(path):
                del self.known_dirs[path]
            else:
                dirs.setdefault(path, d)
        return dirs

    def _keep_gone(self, now_live: dict[tuple[int, int], ProcessProbe], found: set[tuple[int, int]]) -> None:
        """The memfd probes whose process is gone, kept per user (the MAX_EXITED newest of KEEP_EXITED_S): many
        short jobs that publish through a memfd cost only their user."""
        for key, last in self.live.items():
            if key not in now_live and key not in found:
                self.gone[key] = _exited(last)
        old = time.time() - KEEP_EXITED_S
        newest = sorted(self.gone.items(), key=lambda kv: -(kv[1].exited_at or 0.0))
        per_user: dict[int, int] = {}
        self.gone = {}
        for (uid, pid), p in newest:
            per_user[uid] = per_user.get(uid, 0) + 1
            if (p.exited_at or 0.0) > old and (uid, pid) not in found and per_user[uid] <= MAX_EXITED:
                self.gone[(uid, pid)] = p

    def read(self) -> ProbesPart:
        r = self.rendezvous
        r.refresh()
        dirs = self._dirs(r)
        files, ignored = _read_dirs(list(dirs.values()), self.root, self.memo)
        for p in files:
            where = os.path.dirname(p.path)
            if where in dirs:
                self.known_dirs[where] = dirs[where]
        found = {(p.uid, p.pid) for p in files}
        ignored += [*(IgnoredProbe(where, why, cut=True) for where, why in r.notes),
                   *(IgnoredProbe(f"{self.proc}/{pid}/fd", f"over {MAX_FDS} descriptors: not all looked at for "
                                                          "a probe's memfd", cut=True) for pid, _ in r.cut())]
        now_live = self._memfd_probes(r, found, ignored)
        self._keep_gone(now_live, found)
        part = assemble(tuple(dirs), [*files, *now_live.values(), *self.gone.values()], ignored, self.proc)
        # kept as shown (the kernel's command, not the memfd's claim): what an exited job goes on showing
        self.live = {(p.uid, p.pid): p for p in part.processes if (p.uid, p.pid) in now_live}
        self.last = part
        return part


class LastRead:
    """The probes source's latest reading, for discovery on the datasets thread: the same list of probed jobs
    without a second pass over /proc (a second Rendezvous looked at every process's descriptors again)."""

    def __init__(self, reader: ProbeReader) -> None:
        self.reader = reader

    def read(self) -> ProbesPart | None:
        """The latest reading; None before the first."""
        return self.reader.last



def viewer_uid(user: int | None = None, env: dict[str, str] | None = None) -> int:
    """The user whose jobs come first: --user's; else this dltop's uid, or under sudo the uid that ran it
    (SUDO_UID: root's own environment, set by sudo)."""
    if user is not None:
        return user
    me = os.getuid()
    sudo = (os.environ if env is None else env).get("SUDO_UID", "")
    return int(sudo) if me == 0 and sudo.isdigit() and len(sudo) <= 10 else me


def source(settings: Settings, reader: ProbeReader | None = None) -> Source:
    """The probes source at the refresh interval (a listing of one or two small directories); `reader`: one whose
    readings another source also takes (`LastRead`)."""
    # with each job's own reads (/proc/PID/io of it and its workers) beside what it publishes
    reader = reader or ProbeReader(settings.root, settings.user)
    viewer = viewer_uid(settings.user)
    return Source(name="probes", interval_s=settings.refresh_s,
                  read=lambda: dataclasses.replace(with_job_reads(reader.read(), settings.root), viewer_uid=viewer,
                                                   focus_pid=settings.pid),
                  timeout_s=max(2.0, settings.refresh_s * 2), follows_refresh=True)
