"""Sending a signal to a GPU process from the GPU tab: to the process the row showed, or to nothing.

The process is held by a pidfd (pidfd_open) before its start time is checked against the row's, and the signal
goes through that pidfd (pidfd_send_signal), so a pid reused between the check and the send cannot be hit. Only
SIGTERM, SIGKILL and SIGINT; another user's process only as root (the kernel says so too: EPERM). The outcome is
said: whether the process exited within a short wait, or still runs. A tagged set (`send_all`) is each process
checked and sent to in turn, the same way, then one wait for all; a process refused (reused pid, exited, another
user's) is spared and named, the others are sent to.
"""

from __future__ import annotations

import errno
import os
import select
import signal as signals
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dltop.errors import DltopError
from dltop.fmt import printable, shorten_end
from dltop.model.actions import SIGNALS, SignalTarget
from dltop.procfs import read_bytes
from dltop.sources.gpu_procs import Malformed, parse_stat

WAIT_S = 1.0  # how long the outcome waits for the process to exit (a SIGTERM'd trainer may take longer: said)


@dataclass
class SignalResult:
    """What a signal did; the byte and file counts are the runner's common fields (0: a signal moves none)."""

    action: str
    paths: list[str]
    signal: str
    pid: int
    exited: bool
    elapsed_s: float = 0.0
    cancelled: bool = False
    done_bytes: int = 0
    total_bytes: int = 0
    files_done: int = 0
    command: str = ""
    problems: list[str] = field(default_factory=list)  # the processes of a set spared, and why
    sent: list[int] = field(default_factory=list)  # the pids sent to (a set; one pid: [pid])
    exited_pids: list[int] = field(default_factory=list)


def _owner(pid: int, proc: str) -> int:
    try:
        return os.stat(f"{proc}/{pid}").st_uid
    except OSError:
        raise DltopError(f"pid {pid} has exited: nothing sent") from None


def _start_ticks(pid: int, proc: str) -> int:
    try:
        return parse_stat(read_bytes(f"{proc}/{pid}/stat", 4096)).start_time_ticks
    except OSError:
        raise DltopError(f"pid {pid} has exited: nothing sent") from None
    except Malformed as e:
        raise DltopError(f"pid {pid}: {proc}/{pid}/stat cannot be read ({e}): nothing sent") from None


def _hold_and_send(target: SignalTarget, proc: str) -> int:
    """Hold the process by a pidfd, check it is still the row's (start time) and this user's to signal, send
    `target.signal` through the pidfd; the pidfd, open (to wait on), or DltopError saying why nothing was sent."""
    if target.signal not in SIGNALS:
        raise DltopError(f"{printable(target.signal)}: only {', '.join(SIGNALS)} are sent from dltop")
    pid = target.pid
    uid = os.geteuid()
    if uid != 0 and _owner(pid, proc) != uid:
        raise DltopError(f"pid {pid} is another user's process: only root may signal it (dltop runs as uid {uid})")
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise DltopError(f"pid {pid} has exited: nothing sent") from None
    except OSError as e:
        raise DltopError(f"pid {pid}: pidfd_open failed ({e.strerror or e}): nothing sent") from None
    try:
        # Checked after the pidfd holds the process: a start time that matches now is the process the pidfd holds.
        now = _start_ticks(pid, proc)
        if now != target.start_time_ticks:
            raise DltopError(f"pid {pid} is another process now (started at tick {now}, the row's at tick "
                             f"{target.start_time_ticks}): the one shown has exited; nothing sent")
        _send(fd, target)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _send(fd: int, target: SignalTarget) -> None:
    """`target.signal` sent through the pidfd that holds its process; DltopError saying why the kernel refused."""
    try:
        signals.pidfd_send_signal(fd, getattr(signals, target.signal))
    except ProcessLookupError:
        raise DltopError(f"pid {target.pid} has exited: nothing sent") from None
    except PermissionError:
        raise DltopError(f"pid {target.pid}: permission denied by the kernel (EPERM): nothing sent") from None
    except OSError as e:
        if e.errno == errno.ESRCH:
            raise DltopError(f"pid {target.pid} has exited: nothing sent") from None
        raise


def send(target: SignalTarget, proc: str = "/proc", wait_s: float = WAIT_S) -> SignalResult:
    """Send `target.signal` to the process `target` names, if it is still that process and this user may; raises
    DltopError saying why not."""
    return send_all([target], proc, wait_s)


def send_all(targets: Sequence[SignalTarget], proc: str = "/proc", wait_s: float = WAIT_S) -> SignalResult:
    """Send each target its signal (each process held by its own pidfd and checked by its start time), then wait
    once, up to `wait_s`, for them to exit. A process refused is spared and named in `problems`; raises
    DltopError only where none was sent."""
    t0 = time.monotonic()
    held: dict[int, int] = {}  # fd -> pid
    problems: list[str] = []
    try:
        for t in targets:
            try:
                held[_hold_and_send(t, proc)] = t.pid
            except DltopError as e:
                problems.append(str(e))
        if not held:
            raise DltopError("; ".join(problems) or "no process to signal")
        exited = _exited_all(list(held), t0 + wait_s)
    finally:
        for fd in held:
            os.close(fd)
    sent = list(held.values())
    gone = [held[fd] for fd in held if fd in exited]
    return SignalResult(action="signal", paths=[f"pid {t.pid}" for t in targets], signal=targets[0].signal,
                        pid=sent[0], exited=len(gone) == len(sent), elapsed_s=time.monotonic() - t0,
                        command=targets[0].command if len(targets) == 1 else "", problems=problems, sent=sent,
                        exited_pids=gone)


def _exited_all(fds: list[int], deadline: float) -> set[int]:
    """The pidfds among `fds` readable before `deadline`: their process exited (a zombie too: it no longer runs)."""
    exited: set[int] = set()
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    while len(exited) < len(fds) and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(int(left * 1000) + 1):
            exited.add(fd)
            poller.unregister(fd)
    return exited


def summary(r: SignalResult) -> str:
    """'SIGTERM sent to pid 4242 (python train.py): it exited' / '...: still running after 1.0 s'; for a set,
    'SIGTERM sent to 3 processes (pids 1, 2, 3): 2 exited, pid 3 still running after 1.0 s; spared: ...'."""
    if len(r.sent) > 1 or r.problems:
        return _set_summary(r)
    what = f" ({shorten_end(r.command, 60)})" if r.command else ""
    outcome = "it exited" if r.exited else f"still running after {r.elapsed_s:.1f} s"
    return f"{r.signal} sent to pid {r.pid}{what}: {outcome}"


def _set_summary(r: SignalResult) -> str:
    """`summary` of a tagged set, or of one process with others spared."""
    running = [p for p in r.sent if p not in r.exited_pids]
    text = (f"{r.signal} sent to {len(r.sent)} process{'es' if len(r.sent) > 1 else ''} "
            f"(pid{'s' if len(r.sent) > 1 else ''} {', '.join(map(str, r.sent))}): {len(r.exited_pids)} exited")
    if running:
        text += f", pid{'s' if len(running) > 1 else ''} {', '.join(map(str, running))} still running after " \
                f"{r.elapsed_s:.1f} s"
    return text + (f"; spared: {'; '.join(r.problems)}" if r.problems else "")
