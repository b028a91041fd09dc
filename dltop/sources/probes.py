"""Probe files: what training and serving processes with `dltop.probe` publish about themselves (docs/probe.md).

A cheap directory listing every refresh. Each file is checked before it is believed — the directory private,
the file a regular one of the right owner, at most 4 KiB, format 1, its process alive with the start time the
file names — and whatever fails is an `IgnoredProbe` with the reason, never an exception. No symlink is
followed: the directory is opened with O_DIRECTORY|O_NOFOLLOW and each file through its descriptor.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import stat
from collections.abc import Sequence
from typing import Any

from dltop.config import Settings
from dltop.model.probes import IgnoredProbe, ProbeDevice, ProbeEpoch, ProbesPart, ProcessProbe
from dltop.probe.files import DIR_FLAGS, FORMAT, MAX_FILE_BYTES, check_dir, probe_dir, proc_start_ticks
from dltop.sources.base import Source

FILE_NAME = re.compile(r"[0-9]{1,10}\.json")
MAX_ENTRIES = 4096  # names looked at per directory: a directory stuffed with files costs a bounded listing
NOT_WATCHED = "the process watched no model, optimizer or cache (probe.watch_model / watch_optimizer / watch_kv)"
NO_TRACK = "the process iterates no loader through probe.track()"


class Malformed(ValueError):
    """A probe file that is JSON but not of format 1's shape."""


def default_dirs(uid: int | None = None, env: dict[str, str] | None = None) -> list[tuple[str, int]]:
    """(directory, the uid that must own it) for every probe directory this user may read: its own
    ($XDG_RUNTIME_DIR/dltop, /run/user/UID/dltop, /dev/shm/dltop-UID), and as root every user's."""
    uid = os.getuid() if uid is None else uid
    found = {probe_dir(uid, env): uid, f"/run/user/{uid}/dltop": uid, f"/dev/shm/dltop-{uid}": uid}
    if uid == 0:
        for pattern, rx in (("/run/user/*/dltop", r"/run/user/([0-9]+)/dltop"), ("/dev/shm/dltop-*", r"/dev/shm/dltop-([0-9]+)")):
            for path in glob.glob(pattern):
                m = re.fullmatch(rx, path)
                if m:
                    found[path] = int(m.group(1))
    return [(p, u) for p, u in found.items() if os.path.lexists(p)]


def _get(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
    value = doc.get(key)
    if value is None and optional:
        return None
    # bool is an int in Python; a count that is true or false is not a count
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
        raise Malformed(f"{key}: expected {getattr(kind, '__name__', 'a number')}, got {type(value).__name__}")
    return value


def _num(doc: dict[str, Any], key: str, optional: bool = False) -> float | None:
    value = _get(doc, key, (int, float), optional)
    return None if value is None else float(value)


def _count(doc: dict[str, Any], key: str, optional: bool = False) -> int | None:
    value = _get(doc, key, int, optional)
    if value is not None and value < 0:
        raise Malformed(f"{key}: negative")
    return value  # type: ignore[no-any-return]


def _device(name: str, d: Any) -> ProbeDevice:
    if not isinstance(d, dict):
        raise Malformed(f"devices.{name}: expected an object")
    stats = d.get("memory_stats") or {}
    if not isinstance(stats, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in stats.values()):
        raise Malformed(f"devices.{name}.memory_stats: expected counts")
    return ProbeDevice(device=name, weights_bytes=_count(d, "weights_bytes") or 0,
                       gradients_bytes=_count(d, "gradients_bytes") or 0,
                       optimizer_bytes=_count(d, "optimizer_bytes") or 0, kv_bytes=_count(d, "kv_bytes") or 0,
                       memory_stats={str(k): v for k, v in stats.items()},
                       uuid=_get(d, "uuid", str, optional=True))


def _epoch(e: Any) -> ProbeEpoch:
    if not isinstance(e, dict):
        raise Malformed("epochs: expected objects")
    delta = _get(e, "page_cache_delta_bytes", int, optional=True)
    return ProbeEpoch(index=_count(e, "index") or 0, started_at=_num(e, "started_at") or 0.0,
                      ended_at=_num(e, "ended_at") or 0.0, duration_s=_num(e, "duration_s") or 0.0,
                      data_wait_s=_num(e, "data_wait_s") or 0.0, steps=_count(e, "steps") or 0,
                      page_cache_delta_bytes=delta, gpu_util=_num(e, "gpu_util", optional=True))


def parse_probe(doc: Any, path: str, uid: int) -> ProcessProbe:
    """A ProcessProbe from a decoded format-1 file; raises Malformed naming the first field of the wrong shape."""
    if not isinstance(doc, dict):
        raise Malformed("expected a JSON object")
    devices_doc = _get(doc, "devices", dict)
    devices = tuple(_device(str(k), v) for k, v in sorted(devices_doc.items()))
    unavailable: dict[str, str] = {}
    totals: dict[str, int | None] = {}
    for key in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "kv_bytes"):
        totals[key] = sum(getattr(d, key) for d in devices) if devices else None
        if not devices:
            unavailable[key] = NOT_WATCHED
    data = _get(doc, "data", dict, optional=True)
    fraction = step_time = None
    if data is None:
        unavailable["data_wait_fraction"] = unavailable["step_time_s"] = NO_TRACK
    else:
        recent_steps, wait_s, step_s = _count(data, "recent_steps"), _num(data, "recent_wait_s"), _num(data, "recent_step_s")
        if recent_steps and step_s and wait_s is not None:
            fraction = min(max(wait_s / step_s, 0.0), 1.0)
            step_time = step_s / recent_steps
        else:
            unavailable["data_wait_fraction"] = unavailable["step_time_s"] = "no step finished yet"
    cudnn = _get(doc, "cudnn", dict, optional=True) or {}
    compile_doc = _get(doc, "compile", dict, optional=True) or {}
    env = _get(doc, "allocator_env", dict, optional=True) or {}
    epochs = _get(doc, "epochs", list, optional=True) or []
    watched = _get(doc, "watched", dict, optional=True) or {}
    truncated = _get(doc, "truncated", list, optional=True) or []
    return ProcessProbe(
        pid=_count(doc, "pid") or 0, path=path, uid=uid, start_time_ticks=_count(doc, "start_time_ticks") or 0,
        cmd=_get(doc, "cmd", str), published_at=_num(doc, "published_at") or 0.0,
        started_at=_num(doc, "started_at", optional=True), rank=_count(doc, "rank", optional=True),
        local_rank=_count(doc, "local_rank", optional=True), world_size=_count(doc, "world_size", optional=True),
        ppid=_count(doc, "ppid", optional=True), job_id=_get(doc, "job_id", str, optional=True),
        torch_version=_get(doc, "torch", str, optional=True),
        weights_bytes=totals["weights_bytes"], gradients_bytes=totals["gradients_bytes"],
        optimizer_bytes=totals["optimizer_bytes"], kv_bytes=totals["kv_bytes"], devices=devices,
        watched={str(k): _count(watched, k) or 0 for k in watched},
        data_wait_fraction=fraction, step_time_s=step_time,
        steps=None if data is None else _count(data, "steps"),
        input_shapes=None if data is None else _count(data, "input_shapes", optional=True),
        loader_workers=None if data is None else _count(data, "loader_workers", optional=True),
        pin_memory=None if data is None else _get(data, "pin_memory", bool, optional=True),
        data_dir=None if data is None else _get(data, "data_dir", str, optional=True),
        cudnn_benchmark=_get(cudnn, "benchmark", bool, optional=True),
        cudnn_deterministic=_get(cudnn, "deterministic", bool, optional=True),
        compile={str(k): _count(compile_doc, k) or 0 for k in compile_doc},
        allocator_env={str(k): str(v) for k, v in env.items()},
        epochs=tuple(_epoch(e) for e in epochs),
        gpu_util_source=_get(doc, "gpu_util_source", str, optional=True),
        truncated=tuple(str(t) for t in truncated), unavailable=unavailable,
    )


def _read_file(dir_fd: int, name: str, path: str, me: int, proc: str) -> ProcessProbe | str:
    """The probe in `name`, or why it was ignored."""
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
        if me != 0 and st.st_uid != me:
            return f"owned by uid {st.st_uid}, not you (uid {me})"
        if st.st_size > MAX_FILE_BYTES:
            return f"{st.st_size} bytes: over the {MAX_FILE_BYTES}-byte limit"
        raw = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as e:
        return f"cannot read: {e.strerror}"
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        return f"over the {MAX_FILE_BYTES}-byte limit"
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return f"malformed: not JSON ({str(e).splitlines()[0][:80]})"
    version = doc.get("format") if isinstance(doc, dict) else None
    if type(version) is int and version > FORMAT:
        return f"format {version} is newer than this dltop reads ({FORMAT})"
    try:
        if type(version) is not int or version != FORMAT:
            raise Malformed(f"format: expected {FORMAT}")
        probe = parse_probe(doc, path, st.st_uid)
    except (Malformed, RecursionError) as e:
        return f"malformed: {e}"
    if str(probe.pid) != name.removesuffix(".json"):
        return f"malformed: names pid {probe.pid}, not the file's"
    ticks = proc_start_ticks(probe.pid, proc)
    if ticks is None:
        return f"process {probe.pid} has exited (stale file)"
    if ticks != probe.start_time_ticks:
        return f"pid {probe.pid} was reused (started at tick {ticks}, the file says {probe.start_time_ticks})"
    try:
        owner = os.stat(f"{proc}/{probe.pid}").st_uid
    except OSError:
        return f"process {probe.pid} has exited (stale file)"
    if st.st_uid != 0 and owner != st.st_uid:
        return f"process {probe.pid} belongs to uid {owner}, not the file's owner (uid {st.st_uid})"
    return probe


def read_probes(dirs: Sequence[tuple[str, int]] | None = None, root: str = "/") -> ProbesPart:
    """Every probe in `dirs` ((directory, its owner's uid); default: `default_dirs()`), each checked."""
    dirs = default_dirs() if dirs is None else dirs
    me = os.getuid()
    proc = os.path.join(root, "proc")
    processes: list[ProcessProbe] = []
    ignored: list[IgnoredProbe] = []
    for path, owner in dirs:
        try:
            dir_fd = os.open(path, DIR_FLAGS)
        except OSError as e:
            if e.errno == errno.ENOENT:
                continue
            ignored.append(IgnoredProbe(path, "a symlink in place of the directory: not followed"
                                        if e.errno in (errno.ELOOP, errno.ENOTDIR) else f"cannot open: {e.strerror}"))
            continue
        try:
            untrusted = check_dir(dir_fd, owner)
            if untrusted is not None:
                ignored.append(IgnoredProbe(path, f"directory {untrusted}: not trusted"))
                continue
            names = sorted(os.listdir(dir_fd))[:MAX_ENTRIES]
            for name in names:
                if not FILE_NAME.fullmatch(name):
                    continue  # the probe's temp files (.PID.json.XXXX.tmp) and anything else
                got = _read_file(dir_fd, name, os.path.join(path, name), me, proc)
                if isinstance(got, str):
                    ignored.append(IgnoredProbe(os.path.join(path, name), got))
                else:
                    processes.append(got)
        except OSError as e:
            ignored.append(IgnoredProbe(path, f"cannot list: {e.strerror}"))
        finally:
            os.close(dir_fd)
    processes.sort(key=lambda p: p.pid)
    return ProbesPart(dirs=tuple(p for p, _ in dirs), processes=tuple(processes), ignored=tuple(ignored))


def source(settings: Settings) -> Source:
    """The probes source at the refresh interval (a listing of one or two small directories)."""
    return Source(name="probes", interval_s=settings.refresh_s, read=lambda: read_probes(root=settings.root),
                  timeout_s=max(2.0, settings.refresh_s * 2), follows_refresh=True)
