"""Locks that touch data only and keep the dialog's promise: a sparse file's holes are never locked (fincore and the
process's VmLck say so), a kept lock lives on in a detached holder (`dltop lock --detach`, a hangup, q's Keep),
`dltop lock --list` and `dltop unlock` reach it, and a second user can neither see, spoof nor unlock it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dltop.actions import holder
from dltop.actions import pagecache as pc
from dltop.actions.runner import ActionRunner
from dltop.errors import DltopError

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
OTHER = (65530, 65530)
CAN_DEMOTE = os.geteuid() == 0 and shutil.which("setpriv") is not None and os.path.exists("/usr/bin/python3")


def _sparse(path: Path, size: int = 64 * MIB, data_at: int = 32 * MIB, data: int = MIB) -> Path:
    """A sparse file: `data` bytes of random data at `data_at`, holes around them (nothing of it read yet)."""
    with open(path, "wb") as f:
        f.truncate(size)
        f.seek(data_at)
        f.write(os.urandom(data))
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # a dirty page is not dropped
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    return path


def _fincore(path: Path) -> int:
    """Resident bytes of a file, as fincore counts them (holes included)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def _vmlck(pid: int | str = "self") -> int:
    """Bytes a process holds mlocked (/proc/PID/status VmLck): the kernel's count, this process only."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmLck:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmLck")


@pytest.fixture
def kept() -> Iterator[list[int]]:
    """Pids of the holders a test started: ended at its end whatever happens (never another test's)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _mine(pids: list[int]) -> list[holder.Holder]:
    return [h for h in holder.holders()[0] if h.pid in pids]


def _wait_gone(pid: int) -> bool:
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_lock_of_a_sparse_file_locks_its_data_and_never_its_holes(tmp_path: Path) -> None:
    # `l` on a 2 GiB sparse file with 10 MiB of data locked 2 GiB of zero pages (fincore 2 GiB, Mlocked +2 GiB).
    # The data is cold: mlock's faults read around what they miss, zero pages of the holes beside it included.
    f = _sparse(tmp_path / "sparse.bin")
    assert _fincore(f) == 0
    before = _vmlck()
    r, locks = pc.lock([str(f)])
    try:
        assert r.total_bytes == r.done_bytes == locks.bytes == MIB  # the data, not the 64 MiB apparent size
        assert r.size_bytes == 64 * MIB
        assert _vmlck() - before == MIB
        assert _fincore(f) == MIB  # no zero page of a hole was faulted in
    finally:
        locks.release()
    assert _vmlck() == before
    plan = ActionRunner(journal=False).plan("lock", [str(f)], wait=True).result
    assert plan.bytes == MIB and plan.apparent_bytes == 64 * MIB
    assert any("holes" in n and "63.0 MiB" in n for n in plan.notes)


def test_an_evict_plan_says_which_of_what_it_drops_is_holes(tmp_path: Path) -> None:
    # A read of the holes caches zero pages: the evict drops them too, and its dialog says so beside the data.
    f = _sparse(tmp_path / "sparse.bin", size=8 * MIB, data_at=0, data=MIB)
    f.read_bytes()
    assert _fincore(f) == 8 * MIB
    plan = ActionRunner(journal=False).plan("evict", [str(f)], wait=True).result
    assert plan.bytes == 8 * MIB
    assert any("7.0 MiB is zero pages of holes" in n and "1.0 MiB is data" in n for n in plan.notes), plan.notes


def test_a_long_lock_says_its_progress_step_by_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holder, "LOCK_STEP_BYTES", MIB)
    monkeypatch.setattr(pc, "PROGRESS_EVERY_S", 0.0)
    f = tmp_path / "dense.bin"
    f.write_bytes(os.urandom(4 * MIB + 100))
    seen: list[int] = []
    r, locks = pc.lock([str(f)], progress=lambda p: seen.append(p.done_bytes))
    locks.release()
    assert r.done_bytes == 4 * MIB + 4096
    assert seen[:5] == [MIB, 2 * MIB, 3 * MIB, 4 * MIB, 4 * MIB + 4096]


def test_a_kept_lock_lives_in_a_holder_until_unlocked(tmp_path: Path, kept: list[int]) -> None:
    f = _sparse(tmp_path / "sparse.bin")
    runner = ActionRunner()
    before = _vmlck()
    run = runner.start("lock", [str(f)], wait=True)
    assert run.error is None and runner.held() == {str(f): MIB}
    line = runner.keep(str(f))
    assert runner.held() == {}
    [h] = [h for h in holder.holders()[0] if h.target == str(f)]
    kept.append(h.pid)
    assert f"lock holder pid {h.pid}" in line and f"dltop unlock {h.pid}" in line
    assert h.uid == os.geteuid() and h.locked_bytes == _vmlck(h.pid) == MIB  # the kernel's count, not a file's
    assert _vmlck() == before  # this process let go once the holder held every page
    assert _fincore(f) == MIB
    assert "unlocked" in holder.unlock(h)
    assert _wait_gone(h.pid)
    assert not _mine([h.pid])
    journal = Path(os.environ["DLTOP_ROOT_JOURNAL_DIR"], "actions.jsonl").read_text().splitlines()
    events = [json.loads(x)["event"] for x in journal]
    assert any(e["step"] == "release" and f"lock holder pid {h.pid}" in e["message"] for e in events)
    assert any(e["step"] == "release" and e["done_bytes"] == MIB and f"pid {h.pid}" in e["message"] for e in events)
    with pytest.raises(DltopError, match="has exited"):
        holder.unlock(h)


def test_a_holder_never_locks_a_file_replaced_since(tmp_path: Path, kept: list[int]) -> None:
    f = tmp_path / "a.bin"
    f.write_bytes(os.urandom(MIB))
    r, locks = pc.lock([str(f)])
    os.rename(f, tmp_path / "old.bin")
    f.write_bytes(os.urandom(2 * MIB))  # another file in its name
    try:
        k = holder.keep(locks, str(f))
        kept.append(k.pid)
    finally:
        locks.release()
    assert (k.bytes, k.files, k.missed) == (0, 0, 1)


def _as_other(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "DLTOP_NATIVE": "0"}
    return subprocess.run(["setpriv", f"--reuid={OTHER[0]}", f"--regid={OTHER[1]}", "--clear-groups",
                           "/usr/bin/python3", "-m", "dltop", *args], capture_output=True, text=True, env=env,
                          cwd="/", timeout=60)


@pytest.mark.skipif(not CAN_DEMOTE, reason="needs root, setpriv and /usr/bin/python3 (a second user)")
def test_the_cli_detaches_lists_and_unlocks_and_another_user_cannot(reachable_dir: Path, kept: list[int]) -> None:
    f = _sparse(reachable_dir / "sparse.bin")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "dltop", "lock", "--detach", str(f)], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "locked 1.0 MiB in 1 of 1 file" in out.stdout, out.stdout
    assert "data only: 1.0 MiB of 64.0 MiB apparent size" in out.stdout
    [h] = [h for h in holder.holders()[0] if h.target == str(f)]
    kept.append(h.pid)
    assert f"lock holder pid {h.pid}" in out.stderr
    listed = json.loads(subprocess.run([sys.executable, "-m", "dltop", "lock", "--list", "--json"],
                                       capture_output=True, text=True, env=env, check=True).stdout)
    assert {"pid": h.pid, "uid": 0, "user": "root", "target": str(f), "locked_bytes": MIB} in listed["holders"]
    # A second user sees none of root's holders (only a count), cannot unlock one by pid or path, and the kernel
    # would refuse it anyway.
    theirs = _as_other("lock", "--list", "--json")
    assert theirs.returncode == 0, theirs.stderr
    seen = json.loads(theirs.stdout)
    assert all(x["uid"] == OTHER[0] for x in seen["holders"]) and seen["other_users_holders"] >= 1
    for which in (str(h.pid), str(f)):
        refused = _as_other("unlock", which)
        assert refused.returncode == 1 and "no lock of yours" in refused.stderr
    assert _as_other("unlock", "--all").returncode == 0
    assert _vmlck(h.pid) == MIB  # still held
    # A holder the second user starts, naming root's file, is listed as theirs: a name in a command line never
    # makes it root's.
    fake = subprocess.Popen(["setpriv", f"--reuid={OTHER[0]}", f"--regid={OTHER[1]}", "--clear-groups",
                             "/usr/bin/python3", "-m", holder.MODULE, "--target", str(f)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"PYTHONPATH": str(REPO)}, cwd="/")
    try:
        assert fake.stdin is not None and fake.stdout is not None
        fake.stdin.close()
        ready = fake.stdout.readline().split()
        assert ready[0] == b"ready" and ready[2] == b"0"
        fake_pid = int(ready[1])
        spoof = [x for x in holder.holders()[0] if x.pid == fake_pid]
        assert [(x.uid, x.target) for x in spoof] == [(OTHER[0], str(f))]
        assert fake_pid not in [x.pid for x in holder.holders(uid=os.geteuid() + 1)[0]]
    finally:
        fake.wait()
        os.kill(fake_pid, signal.SIGKILL)
    done = subprocess.run([sys.executable, "-m", "dltop", "unlock", str(f)], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and f"pid {h.pid}" in done.stdout
    assert _wait_gone(h.pid)


def test_a_hangup_of_dltop_lock_keeps_the_lock_in_a_holder(tmp_path: Path, kept: list[int]) -> None:
    # A dropped SSH session: nobody is left to ask, so the lock goes to a holder, said and journalled.
    f = _sparse(tmp_path / "sparse.bin")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "dltop", "lock", str(f)], stderr=subprocess.PIPE, text=True,
                            env=env)
    assert proc.stderr is not None
    while "Ctrl-C to unlock" not in (line := proc.stderr.readline()):
        assert line, "dltop lock ended before it held the lock"
    proc.send_signal(signal.SIGHUP)
    rest = proc.stderr.read()
    assert proc.wait(30) == 129
    [h] = [h for h in holder.holders()[0] if h.target == str(f)]
    kept.append(h.pid)
    assert f"locked on hangup in lock holder pid {h.pid}" in rest
    assert h.locked_bytes == MIB
    holder.unlock(h)
    assert _wait_gone(h.pid)


async def test_q_with_a_lock_held_asks_to_keep_it_or_release_it(tmp_path: Path, kept: list[int]) -> None:
    # The lock dialog promised "until you press l again": q quit at once and dropped it. Now q asks; Esc stays.
    from dltop.sampler import ListFeed
    from dltop.tui.app import DltopApp
    from dltop.tui.screens.confirm import ConfirmScreen, KeepLocksScreen
    from tests.test_datasets_pane import _open_tab, _wait_idle, snap_of
    from tests.waiting import screen_of

    d = tmp_path / "ds"
    d.mkdir()
    _sparse(d / "sparse.bin")
    app = DltopApp(ListFeed([snap_of(d)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("l")
        dialog = await screen_of(pilot, ConfirmScreen)
        body = str(dialog.query_one("#confirm-body").render())
        assert "mlock 1.0 MiB of data" in body and "apparent size 64.0 MiB" in body, body
        await pilot.press("y")
        await _wait_idle(app, pilot, lambda: bool(app.session.runner.held()))
        await pilot.press("q")
        asked = await screen_of(pilot, KeepLocksScreen)
        assert "Quit with 1.0 MiB locked?" in str(asked.query_one("#confirm-title").render())
        await pilot.press("escape")
        await pilot.pause()
        assert app.is_running and app.session.runner.held() == {str(d): MIB}  # stayed, still locked
        await pilot.press("q")
        await screen_of(pilot, KeepLocksScreen)
        await pilot.press("k")  # r releases: Session.release_locks, the runner's release
        await pilot.pause()
    assert not app.is_running and app.session.runner.held() == {}
    ours = [h for h in holder.holders()[0] if h.target == str(d)]
    kept.extend(h.pid for h in ours)
    assert [h.locked_bytes for h in ours] == [MIB]
    assert app.session.farewell and f"lock holder pid {ours[0].pid}" in app.session.farewell[0]
    holder.unlock(ours[0])


def _fake_holder_as_other(target: str) -> int:
    """A holder process of the second user naming `target` (it holds nothing): its pid, once it is ready."""
    fake = subprocess.Popen(["setpriv", f"--reuid={OTHER[0]}", f"--regid={OTHER[1]}", "--clear-groups",
                             "/usr/bin/python3", "-m", holder.MODULE, "--target", target],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"PYTHONPATH": str(REPO)}, cwd="/")
    assert fake.stdin is not None and fake.stdout is not None
    fake.stdin.close()
    ready = fake.stdout.readline().split()
    fake.wait()
    assert ready[0] == b"ready"
    return int(ready[1])


def test_a_tui_started_after_a_detached_lock_shows_it_locked_and_l_releases_it(tmp_path: Path,
                                                                              kept: list[int]) -> None:
    # `dltop lock --detach`, then a TUI: its row is locked (🔒, the Unlock label: the pane reads View.held) and
    # `l` (Session.request on a locked target) releases it through the holder, as `dltop unlock` does.
    from dltop.config import Settings
    from dltop.sampler import ListFeed
    from dltop.session import Session
    from tests.test_datasets_pane import snap_of

    d = tmp_path / "ds"
    d.mkdir()
    _sparse(d / "sparse.bin")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "dltop", "lock", "--detach", str(d)], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    [h] = [h for h in holder.holders()[0] if h.target == str(d)]
    kept.append(h.pid)
    other = tmp_path / "theirs"
    if CAN_DEMOTE:  # a second user's holder naming a folder: never shown as this user's, root's included
        kept.append(_fake_holder_as_other(str(other)))
    runner = ActionRunner()
    events: list[Any] = []
    session = Session(ListFeed([snap_of(d)]), Settings(datasets=(str(d),)), runner=runner)
    runner.subscribe(events.append)
    runner.subscribe(session.on_action)  # as the App routes them
    session.open()
    view = session.view()
    assert view is not None and view.held == {str(d): MIB} and runner.held() == {}  # the holder's, not this one's
    assert str(other) not in view.held
    session.request("lock", str(d))  # l on the locked row
    assert _wait_gone(h.pid) and not _mine([h.pid])
    assert [(e.step, e.phase, e.outcome) for e in events] == [("release", "started", None),
                                                              ("release", "finished", "ok")]
    assert events[-1].message == f"unlocked {d} (the lock holder, pid {h.pid})" and events[-1].done_bytes == MIB
    assert session.said[-1].text == events[-1].message
    view = session.view()
    assert view is not None and str(d) not in view.held
    session.request("lock", str(d))  # not locked now: l plans a lock again
    assert session.plans
    journal = Path(os.environ["DLTOP_ROOT_JOURNAL_DIR"], "actions.jsonl").read_text().splitlines()
    released = [json.loads(x)["event"] for x in journal]
    unlocked = [e["message"] for e in released if e["step"] == "release" and "unlocked" in e["message"]]
    assert unlocked == [f"the lock holder (pid {h.pid}) unlocked 1.0 MiB of {d}"]  # the holder's own line, once


def test_the_exporter_says_the_data_and_the_page_cache_apart(tmp_path: Path) -> None:
    # One meaning of residency: resident_bytes and resident_ratio are the data's (holes left out); the page cache
    # the files hold, zero pages of holes a read cached included, is cached_bytes and equals fincore.
    from dltop import fields
    from dltop.model import Snapshot
    from dltop.residency.scan import scan_paths

    f = _sparse(tmp_path / "sparse.bin", size=8 * MIB, data_at=0, data=MIB)
    f.read_bytes()
    snap = Snapshot(ts=1.0, host="t", datasets=scan_paths((str(tmp_path),)))
    got = {"dltop_" + s[0].name: s[2] for s in fields.samples(snap) if s[0].name.startswith("dataset_")}
    assert got["dltop_dataset_cached_bytes"] == _fincore(f) == 8 * MIB
    assert got["dltop_dataset_resident_bytes"] == MIB and got["dltop_dataset_resident_ratio"] == 1.0
    assert got["dltop_dataset_size_bytes"] == 8 * MIB


def test_data_bytes_is_what_resident_ratio_divides_by_as_vmtouch_counts(tmp_path: Path) -> None:
    # 1,000 files of 500 bytes and one of 3 pages and a byte (each a whole page or four to the kernel), about two
    # in five read: data_bytes is vmtouch's pages in bytes, so data_bytes * (1 - resident_ratio) is exactly the
    # pages a reader still fetches (size_bytes times it, apparent bytes, said 8 times too little).
    from dltop import fields
    from dltop.model import Snapshot
    from dltop.residency.scan import scan_paths
    from tests.test_cluster import _vmtouch

    ps = os.sysconf("SC_PAGE_SIZE")
    for i in range(1000):
        (tmp_path / f"{i:04d}.bin").write_bytes(os.urandom(500))
    (tmp_path / "big.bin").write_bytes(os.urandom(3 * ps + 1))
    for p in tmp_path.iterdir():
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if p.name < "0394" or p.name == "big.bin":
            os.read(fd, 1 << 20)
        os.close(fd)
    resident, pages = _vmtouch(tmp_path)
    snap = Snapshot(ts=1.0, host="t", datasets=scan_paths((str(tmp_path),)))
    got = {"dltop_" + s[0].name: s[2] for s in fields.samples(snap) if s[0].name.startswith("dataset_")}
    assert resident == 394 + 4 and pages == 1004
    assert got["dltop_dataset_data_bytes"] == pages * ps
    assert got["dltop_dataset_data_bytes"] * (1 - got["dltop_dataset_resident_ratio"]) == pytest.approx(
        (pages - resident) * ps, rel=1e-12)
    assert got["dltop_dataset_size_bytes"] == 1000 * 500 + 3 * ps + 1


def test_release_on_quit_unlocks_and_says_so(tmp_path: Path) -> None:
    # q, then Release: the Session unlocks (announced, journalled) and says it on the terminal after the TUI.
    from dltop.session import Session

    f = _sparse(tmp_path / "sparse.bin")
    runner = ActionRunner()
    session = Session(None, runner=runner)
    before = _vmlck()
    assert runner.start("lock", [str(f)], wait=True).error is None
    assert session.held_locks() == {str(f): MIB} and _vmlck() - before == MIB
    session.release_locks()
    assert session.held_locks() == {} and _vmlck() == before
    assert session.farewell == [f"unlocked {f}"]
    assert not [h for h in holder.holders()[0] if h.target == str(f)]  # nothing kept behind the user's back
