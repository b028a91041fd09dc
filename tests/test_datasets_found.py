"""Datasets found without a flag (dltop/sources/found.py): real processes holding real files open, read through
the real /proc; hostile ones (many descriptors, FIFOs, devices, deleted files, non-UTF-8 and deep names, claims
of system folders) run as a second user with setpriv."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dltop.exporter.collector import SnapshotCollector
from dltop.model import ProbesPart, Snapshot
from dltop.model.datasets import DatasetResidency, DatasetsPart, FoundDataset, FoundReader
from dltop.model.probes import ProcessProbe
from dltop.probe.files import proc_start_ticks
from dltop.residency.walk import WalkOptions
from dltop.sources import found as found_mod
from dltop.sources.found import Discovery, Rules, group_folders, merge_roots

REPO = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0
OTHER = (65530, 65530)
CAN_SETPRIV = IS_ROOT and shutil.which("setpriv") is not None
OPTIONS = WalkOptions(max_depth=6, top_files=5)

HOLD = textwrap.dedent("""
    import os, sys, time
    spec = sys.argv[1]
    kept = []
    for kind, path in (line.split(" ", 1) for line in open(spec).read().splitlines() if line):
        if kind == "r":
            kept.append(os.open(path, os.O_RDONLY))
        elif kind == "w":
            kept.append(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        elif kind == "rb":
            kept.append(os.open(bytes.fromhex(path), os.O_RDONLY))
        elif kind == "fifo":
            kept.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        elif kind == "deleted":
            kept.append(os.open(path, os.O_RDONLY)); os.unlink(path)
        elif kind == "many":
            n, target = path.split(" ", 1)
            first = os.open(target, os.O_RDONLY)
            kept += [first] + [os.dup(first) for _ in range(int(n))]
        elif kind == "deep":
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            for i in range(300):
                name = "d" * 200
                os.mkdir(name, dir_fd=fd)
                nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = nfd
            f = os.open("deep.bin", os.O_RDWR | os.O_CREAT, 0o644, dir_fd=fd)
            os.write(f, b"x" * 8192); os.close(f)
            kept.append(os.open("deep.bin", os.O_RDONLY, dir_fd=fd))
    print("ready", flush=True)
    time.sleep(600)
""")


def hold(spec: list[tuple[str, str]], where: Path, as_other: bool = False) -> subprocess.Popen[str]:
    """A process holding the files of `spec` open, as this user or as a second one."""
    (where / "spec.txt").write_text("".join(f"{k} {p}\n" for k, p in spec))
    (where / "spec.txt").chmod(0o644)
    pre = ["setpriv", f"--reuid={OTHER[0]}", f"--regid={OTHER[1]}", "--clear-groups"] if as_other else []
    p = subprocess.Popen([*pre, sys.executable, "-c", HOLD, str(where / "spec.txt")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd="/")
    assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr and p.stderr.read()
    return p


@pytest.fixture
def held() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def shards(root: Path, *names: str, size: int = 64 << 10) -> list[Path]:
    out = []
    for n in names:
        f = root / n
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"\1" * size)
        out.append(f)
    for d in [root, *root.rglob("*")]:
        d.chmod(0o755 if d.is_dir() else 0o644)
    return out


class Probes:
    """Stands in for the probe files: what the probes source would list (pid, uid, start time, data_dir)."""

    def __init__(self, *procs: tuple[int, int, str | None]) -> None:
        self.procs = procs

    def read(self) -> ProbesPart:
        return ProbesPart(processes=tuple(
            ProcessProbe(pid=pid, path=f"/x/{pid}.json", uid=uid, start_time_ticks=proc_start_ticks(pid) or 0,
                         cmd="python train.py", published_at=time.time(), data_dir=data_dir, job_id="j1")
            for pid, uid, data_dir in self.procs))


def discovery(*procs: tuple[int, int, str | None], pid: int | None = None) -> Discovery:
    d = Discovery(OPTIONS, None, pid=pid)
    d.probes = Probes(*procs)  # type: ignore[assignment]
    return d


# -- choosing a root -------------------------------------------------------------------------------------------


def test_system_folders_homes_and_prefixes_are_never_a_dataset(tmp_path: Path) -> None:
    rules = Rules(extra_homes=[str(tmp_path / "home" / "alice")])
    never = ["/", "/usr", "/usr/share/x", "/etc", "/etc/ssl", "/proc/1", "/sys/kernel", "/dev", "/dev/shm", "/run",
             "/run/user/1000/dltop", "/var/log/x", "/tmp", "/opt", "/boot/grub", "/home", str(tmp_path / "home"),
             str(tmp_path / "home" / "alice"), sys.prefix, os.path.join(sys.prefix, "lib"), "relative/path",
             "/data/\0x"]
    assert [p for p in never if rules.allowed(p)] == []
    assert [p for p in ("/tmp/ds", "/dev/shm/ds", "/data/imagenet", str(tmp_path / "home" / "alice" / "data"))
            if not rules.allowed(p)] == []


def test_folders_group_to_their_dataset_root() -> None:
    def dev(_p: str) -> int:
        return 1

    allowed = Rules().allowed
    # ImageFolder: class folders under train/ and val/ group to the dataset's root, two levels up at most
    folders = {"/data/imagenet/train/n01": 1, "/data/imagenet/train/n02": 1, "/data/imagenet/val/n03": 1}
    assert group_folders(folders, None, allowed, dev) == {"/data/imagenet": set(folders)}
    # a folder further away than CLIMB levels is its own root
    got = group_folders({"/data/a/b/c/d": 1, "/data/a/x": 1}, None, allowed, dev)
    assert sorted(got) == ["/data/a", "/data/a/b/c/d"] or sorted(got) == ["/data/a/b/c/d", "/data/a/x"]
    # never above a filesystem's top, never to a refused folder (/data/a and /tmp/b share only /)
    assert sorted(group_folders({"/data/a": 1, "/tmp/b": 1}, None, allowed, dev)) == ["/data/a", "/tmp/b"]
    assert sorted(group_folders({"/data/a": 1, "/data/b": 2}, None, allowed, dev)) == ["/data/a", "/data/b"]
    # a file directly in /tmp or in a system folder is no dataset
    assert group_folders({"/tmp": 1, "/usr/lib": 1, "/etc": 1}, None, allowed, dev) == {}
    # the folder the job names wins for what is below it
    got = group_folders({"/data/c4/en/part1": 1, "/scratch/x": 1}, "/data/c4", allowed, dev)
    assert got == {"/data/c4": {"/data/c4/en/part1"}, "/scratch/x": {"/scratch/x"}}
    assert merge_roots(["/data/c4", "/data/c4/en", "/data/c5"]) == {
        "/data/c4": "/data/c4", "/data/c4/en": "/data/c4", "/data/c5": "/data/c5"}


# -- real processes --------------------------------------------------------------------------------------------


def test_a_jobs_open_shards_are_found_grouped_and_scanned(reachable_dir: Path, held: list) -> None:
    files = shards(reachable_dir / "ds", "train/a/s0.bin", "train/a/s1.bin", "train/b/s2.bin", "val/s3.bin")
    log = reachable_dir / "out" / "train.log"
    log.parent.mkdir()
    held.append(p := hold([("r", str(files[0])), ("r", str(files[3])), ("w", str(log))], reachable_dir))
    d = discovery((p.pid, os.geteuid(), None))
    found = d.read()
    assert [f.path for f in found] == [str(reachable_dir / "ds")]  # the log written is no dataset
    f = found[0]
    assert [(r.pid, r.uid, r.files_open, r.named) for r in f.readers] == [(p.pid, os.geteuid(), 2, False)]
    assert isinstance(f.scan, DatasetResidency) and f.scan.files == 4 and f.scan.complete
    # a watched dataset is not found again
    assert d.read(watched=[str(reachable_dir / "ds")]) == ()


def test_a_found_dataset_mostly_cold_while_its_job_reads_it_names_the_job(reachable_dir: Path, held: list,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A job reads shards nobody watches, one in eight in the page cache: the cold-dataset hint
    # speaks of it, with the job as its subject (m in ? mutes it for that job alone) and in its text.
    from dltop.hints import datasets as hints_datasets
    from dltop.hints.base import passing_over

    files = shards(reachable_dir / "ds", *(f"train/s{i}.bin" for i in range(8)), size=256 << 10)
    for i, f in enumerate(files):
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if i == 0:
            os.read(fd, 256 << 10)
        os.close(fd)
    held.append(p := hold([("r", str(files[0])), ("r", str(files[1]))], reachable_dir))
    found = discovery((p.pid, os.geteuid(), None)).read()
    part = DatasetsPart(found=found)
    assert hints_datasets.cold_dataset(part, None) is None  # 1.75 MiB to read: under the threshold
    monkeypatch.setattr(hints_datasets, "COLD_MIN_BYTES", 0)
    h = hints_datasets.cold_dataset(part, None)
    user = pwd.getpwuid(os.geteuid()).pw_name
    assert h is not None and h.subject == f"job uid {os.geteuid()} job j1" and h.numbers["pid"] == p.pid
    assert [f.path for f in found] == [str(reachable_dir / "ds" / "train")]
    assert h.text == (f"dataset {found[0].path}, read by job j1 (pid {p.pid}) of {user}, is 12% resident "
                      "(256 KiB of 2.0 MiB): it reads the rest from disk and runs slow")
    assert h.numbers["to_read_bytes"] == 7 * (256 << 10)
    from dltop.hints import hints

    assert [x.subject for x in hints([Snapshot(ts=1.0, host="h", datasets=part)]) if x.id == "dataset-cold"] == [h.subject]
    token = passing_over.set(frozenset({("dataset-cold", h.subject)}))  # muted for this job: nothing else is cold
    try:
        assert hints_datasets.cold_dataset(part, None) is None
    finally:
        passing_over.reset(token)
    # warm: no hint
    for f in files:
        f.read_bytes()
    assert hints_datasets.cold_dataset(DatasetsPart(found=discovery((p.pid, os.geteuid(), None)).read()), None) is None


def test_the_folder_a_probe_names_is_found_before_any_file_is_open(reachable_dir: Path, held: list) -> None:
    shards(reachable_dir / "c4" / "en", "p0.bin", "p1.bin")
    held.append(p := hold([], reachable_dir))
    # a claim of a system folder, a home or /tmp itself is not taken
    for claim in ("/", "/etc", "/tmp", os.path.expanduser("~"), "/proc/self", str(reachable_dir / "missing")):
        assert discovery((p.pid, os.geteuid(), claim)).read() == ()
    found = discovery((p.pid, os.geteuid(), str(reachable_dir / "c4"))).read()
    assert [(f.path, f.readers[0].named) for f in found] == [(str(reachable_dir / "c4"), True)]


@pytest.mark.skipif(not CAN_SETPRIV, reason="needs root and setpriv (a second user's process)")
def test_a_hostile_process_never_crashes_or_blinds_discovery(reachable_dir: Path, held: list) -> None:
    ds = reachable_dir / "ds"
    files = shards(ds, "a.bin", "b.bin", "gone.bin")
    os.mkfifo(reachable_dir / "fifo")
    (reachable_dir / "fifo").chmod(0o666)
    odd = ds / "sub"
    odd.mkdir()
    (odd / os.fsdecode(b"\xff\x1b[31mred\xe2\x80\xae.bin")).write_bytes(b"x" * 100)
    os.chmod(odd, 0o755)
    deep = reachable_dir / "deep"
    deep.mkdir()
    os.chown(deep, *OTHER)
    spec = [("many", f"5000 {files[0]}"), ("fifo", str(reachable_dir / "fifo")), ("r", "/dev/null"),
            ("r", "/etc/hostname" if os.path.exists("/etc/hostname") else "/etc/passwd"),
            ("deleted", str(files[2])), ("rb", (os.fsencode(odd) + b"/\xff\x1b[31mred\xe2\x80\xae.bin").hex()),
            ("deep", str(deep)), ("r", str(files[1]))]
    files[2].chmod(0o666)
    ds.chmod(0o777)
    held.append(p := hold(spec, reachable_dir, as_other=True))
    d = discovery((p.pid, OTHER[0], "/etc"))
    t0 = time.monotonic()
    found = d.read()
    assert time.monotonic() - t0 < 30
    paths = {f.path for f in found}
    # the FIFO, /dev/null, /etc, the deleted file and the claimed /etc are no dataset; ds is found through the
    # descriptors the budget reached, its odd name kept exact; the deep folder is a dataset of its own
    assert str(ds) in paths
    assert not any(p_.startswith(("/etc", "/dev", "/proc")) or p_ == str(reachable_dir) for p_ in paths)
    f = next(f for f in found if f.path == str(ds))
    assert f.readers[0].uid == OTHER[0]
    # scanned whole: a.bin, b.bin and the odd name (the deleted file is gone), the odd name's bytes exact
    assert isinstance(f.scan, DatasetResidency) and f.scan.files == 3
    sub = next(c for c in f.scan.children if c.path == str(odd))
    assert [os.fsencode(t.path) for t in sub.top_files] == [os.fsencode(odd) + b"/\xff\x1b[31mred\xe2\x80\xae.bin"]
    # the descriptors looked at per process are bounded (5,000 dups of one file count once per look)
    assert d.looks >= 1
    snap = Snapshot(ts=1.0, host="h", datasets=DatasetsPart(found=found))
    assert Snapshot.from_json(snap.to_json()) == snap  # the odd name survives the JSON, exactly
    # the process goes away: its datasets go too, and a vanished pid crashes nothing
    p.kill()
    p.wait()
    assert d.read() == ()


@pytest.mark.skipif(not CAN_SETPRIV, reason="needs root and setpriv (a second user's process and dltop)")
def test_a_non_root_dltop_finds_its_own_users_jobs_only(reachable_dir: Path, held: list) -> None:
    files = shards(reachable_dir / "ds", "a.bin")
    held.append(mine := hold([("r", str(files[0]))], reachable_dir, as_other=True))
    held.append(root_job := hold([("r", str(files[0]))], reachable_dir))

    def snapshot_as_other(pid: int) -> dict:
        r = subprocess.run(["setpriv", f"--reuid={OTHER[0]}", f"--regid={OTHER[1]}", "--clear-groups",
                            sys.executable, "-m", "dltop", "snapshot", "--json", "--pid", str(pid)],
                           capture_output=True, text=True, cwd="/", timeout=60,
                           env={**os.environ, "PYTHONPATH": str(REPO), "HOME": "/"})
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["datasets"]

    own = snapshot_as_other(mine.pid)
    assert {r["uid"] for f in own["found"] for r in f["readers"]} == {OTHER[0]}  # this user's jobs alone
    assert [f["path"] for f in own["found"] if f["readers"][0]["pid"] == mine.pid] == [str(reachable_dir / "ds")]
    assert "own jobs only" in own["discovery"]
    theirs = snapshot_as_other(root_job.pid)["found"]  # root's job: not this user's to see
    assert not any(r["pid"] == root_job.pid for f in theirs for r in f["readers"])


def test_no_discover_turns_it_off(reachable_dir: Path, held: list) -> None:
    files = shards(reachable_dir / "ds", "a.bin")
    held.append(p := hold([("r", str(files[0]))], reachable_dir))
    base = [sys.executable, "-m", "dltop", "snapshot", "--json", "--pid", str(p.pid)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    on = json.loads(subprocess.run(base, capture_output=True, text=True, env=env, check=True).stdout)
    assert [f["path"] for f in on["datasets"]["found"] if f["readers"][0]["pid"] == p.pid] == [
        str(reachable_dir / "ds")]
    off = json.loads(subprocess.run([*base, "--no-discover"], capture_output=True, text=True, env=env,
                                    check=True).stdout)
    assert off["datasets"] is None


def test_a_job_is_looked_at_again_on_its_cadence_not_every_read(reachable_dir: Path, held: list,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    files = shards(reachable_dir / "ds", "a/s0.bin", "b/s1.bin")
    held.append(p := hold([("r", str(files[0]))], reachable_dir))
    now = [1000.0]
    d = discovery((p.pid, os.geteuid(), None))
    d.clock = lambda: now[0]
    d.read()
    looks = d.looks
    d.read()
    assert d.looks == looks  # not due: nothing looked at
    now[0] += found_mod.REVISIT_S
    d.read()
    assert d.looks > looks


def test_a_found_dataset_is_scanned_on_its_cadence_and_at_once_after_an_action(reachable_dir: Path,
                                                                               held: list) -> None:
    files = shards(reachable_dir / "ds", "a.bin")
    held.append(p := hold([("r", str(files[0]))], reachable_dir))
    now = [1000.0]
    d = discovery((p.pid, os.geteuid(), None))
    d.clock = lambda: now[0]
    first = d.read()[0].scan
    assert d.scans == 1 and isinstance(first, DatasetResidency)
    fd = os.open(files[0], os.O_RDONLY)  # an evict from elsewhere
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert d.read()[0].scan == first and d.scans == 1  # not due
    again = d.read(rescan=[str(reachable_dir / "ds")])[0].scan  # asked for: measured now
    assert d.scans == 2 and isinstance(again, DatasetResidency) and again.data_resident_pages == 0
    now[0] += found_mod.RESCAN_S + 1
    d.scans_free_at = 0.0
    d.read()
    assert d.scans == 3


# -- where found datasets go -----------------------------------------------------------------------------------


def _found_part(tmp_path: Path) -> DatasetsPart:
    from dltop.residency.scan import scan_one

    shards(tmp_path / "ds", "a.bin")
    scan = scan_one(str(tmp_path / "ds"), OPTIONS).result
    reader = FoundReader(42, 1001, "alice", "", "python train.py --lr 1", 3, False)
    return DatasetsPart(found=(FoundDataset(str(tmp_path / "ds"), (reader,), 1.0, scan),))


def test_the_exporter_serves_found_datasets_only_when_asked(tmp_path: Path) -> None:
    snap = Snapshot(ts=time.time(), host="h", datasets=_found_part(tmp_path))
    for asked in (False, True):
        c = SnapshotCollector(export_found=asked)
        c.update(snap)
        body = c.render("text/plain")[0].decode()
        assert (str(tmp_path / "ds") in body) is asked
        assert ('dltop_dataset_found_info{dataset="' in body) is asked
        if asked:
            assert 'users="alice"' in body


def test_the_text_says_who_reads_a_found_dataset(tmp_path: Path) -> None:
    from dltop.text.datasets import found_line

    f = _found_part(tmp_path).found[0]
    assert found_line(f) == "found: read by train.py (pid 42) of alice, 3 files open · a watches it"
    odd = dataclasses.replace(f, readers=(dataclasses.replace(f.readers[0], user=None, job="\x1b]52;x\x07"),))
    assert "\x1b" not in found_line(odd) and "uid 1001" in found_line(odd)
    assert _found_part(tmp_path).holder(str(tmp_path / "ds" / "a.bin")) == str(tmp_path / "ds")


def test_an_action_on_a_found_dataset_measures_it_again_at_once(tmp_path: Path) -> None:
    from dltop.config import Settings
    from dltop.model.actions import ActionEvent
    from dltop.sampler import ListFeed
    from dltop.session import Session
    from dltop.timeline import LiveEvent
    from tests.test_session import FakeRunner

    class Feed(ListFeed):
        asked: list[tuple[str, str | None]] = []

        def read_now(self, name: str, key: str | None = None) -> None:
            self.asked.append((name, key))

    part = _found_part(tmp_path)
    feed = Feed([Snapshot(ts=time.time(), host="h", datasets=part)])
    session = Session(feed, Settings(), runner=FakeRunner())
    session.open()
    root = str(tmp_path / "ds")
    # one run here, on a file of it: that dataset only, at once (an unlock too)
    for step in ("run", "release"):
        session.on_action(ActionEvent(action="evict", target=f"{root}/a.bin", phase="finished", step=step,
                                      run_id=1, paths=(f"{root}/a.bin",), outcome="ok", ts=time.time()))
        assert feed.asked.pop() == ("datasets", root)
    # one another process ran (a `dltop evict` from a shell, read from the journal): the same
    session.add_events([LiveEvent(time.time(), "action", {"action": "evict", "phase": "finished", "step": "run",
                                                          "paths": [root], "pid": os.getpid() + 1})])
    assert feed.asked == [("datasets", root)]


def test_the_recorder_measures_a_dataset_again_after_an_action_on_it(tmp_path: Path) -> None:
    from dltop.commands.record import _measure_after_actions

    class Sampler:
        asked: list[tuple[str, str | None]] = []

        def read_now(self, name: str, key: str | None = None) -> None:
            self.asked.append((name, key))

    class Tail:
        def __init__(self, lines: list[dict]) -> None:
            self.lines = lines

        def poll(self) -> list[dict]:
            out, self.lines = self.lines, []
            return out

    root = str(tmp_path / "ds")
    snap = Snapshot(ts=1.0, host="h", datasets=_found_part(tmp_path))
    s = Sampler()
    _measure_after_actions(s, snap, Tail([
        {"action": "evict", "phase": "started", "step": "run", "paths": [root]},
        {"action": "evict", "phase": "finished", "step": "run", "paths": [f"{root}/a.bin"]},
        {"action": "warm", "phase": "finished", "step": "run", "paths": ["/elsewhere"]}]))
    assert s.asked == [("datasets", root)]


def test_one_users_many_jobs_do_not_hold_up_anothers(monkeypatch: pytest.MonkeyPatch) -> None:
    d = Discovery(OPTIONS, None)
    d.jobs = {(pid, 1): found_mod.Job(pid, 1, 1001, "mallory", "", "x") for pid in range(100, 300)}
    d.jobs[(5, 1)] = found_mod.Job(5, 1, 1002, "alice", "", "train.py", next_look=0.5)  # due last of all
    looked: list[int] = []

    def slow_look(j: found_mod.Job, deadline: float) -> None:
        looked.append(j.uid)
        time.sleep(found_mod.LOOK_BUDGET_S / 4)  # each look takes a quarter of the read's budget

    monkeypatch.setattr(d, "_refresh_jobs", lambda: None)
    monkeypatch.setattr(d, "_look", slow_look)
    d.look()
    assert 1002 in looked and len(looked) <= 5  # alice's job in the first turn, within the budget


def test_a_probed_jobs_data_dir_is_found_through_its_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           held: list) -> None:
    # the real path: the job publishes with dltop.probe (track(loader, data_dir=...)), discovery reads its file
    data = tmp_path / "data" / "shards"
    shards(data, "s0.bin", "s1.bin")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    job = textwrap.dedent(f"""
        import time
        from dltop import probe
        probe.start(interval_s=0.2)
        for i, _ in enumerate(probe.track(range(10**9), data_dir={str(data)!r})):
            if i == 0:
                print("ready", flush=True)
            time.sleep(0.05)
    """)
    p = subprocess.Popen([sys.executable, "-c", job], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    held.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    d = Discovery(OPTIONS, None)
    for _ in range(50):  # the probe publishes its file within a second or so
        found = d.read()
        if found:
            break
        time.sleep(0.2)
    # (other users' probed jobs on a shared node may be found too: only this one's are looked at)
    found = tuple(f for f in found if any(r.pid == p.pid for r in f.readers))
    assert [(f.path, [(r.pid, r.named) for r in f.readers]) for f in found] == [(str(data), [(p.pid, True)])]
    # As the TUI wires it, discovery takes the probed jobs from the probes source's latest reading (one pass over
    # /proc, not a second one of its own): nothing before that source has read, the job's folder after.
    from dltop.config import Settings
    from dltop.sources.registry import build_sources

    by_name = {s.name: s for s in build_sources(Settings())}

    def found_now() -> list[str]:
        part = by_name["datasets"].read()
        return [f.path for f in part.found if any(r.pid == p.pid for r in f.readers)]

    assert found_now() == []
    by_name["probes"].read()
    assert found_now() == [str(data)]
