"""dltop reading probe files (sources/probes.py): real files written by the probe, then hostile ones — a symlink in
place of the file or the directory, a huge file, a FIFO, another user's file, bad JSON, a newer format, a dead
process, a reused pid, a directory others can write — each ignored with its reason, never a crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dltop.probe as probe
from dltop.config import Settings
from dltop.model import ProbesPart, Snapshot
from dltop.model.probes import NO_EXIT_RECORD
from dltop.probe.files import open_private_dir, proc_start_ticks, write_atomic
from dltop.sources.probes import parse_probe, read_probes
from dltop.sources.probes import source as probes_source
from dltop.sources.procio import Unreadable, children, job_reads, parse_io, read_io
from dltop.sources.rendezvous import ProbeDir, Rendezvous
from tests.probe_helpers import REPO, probe_env

ME = os.getuid()
IS_ROOT = ME == 0
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    d = tmp_path / "dltop"
    os.close(open_private_dir(str(d)))
    return d


@pytest.fixture
def open_dir(reachable_dir: Path) -> Path:
    """A directory another user can reach (pytest's own are 0700 to root)."""
    return reachable_dir


def _doc(**changes) -> dict:
    """A real report of this process, as the probe writes it."""
    return {**probe.report(), **changes}


def _write(pdir: Path, doc, name: str | None = None) -> Path:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    name = name or f"{os.getpid()}.json"
    fd = os.open(pdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_atomic(fd, name, data)
    finally:
        os.close(fd)
    return pdir / name


def _read(pdir: Path) -> ProbesPart:
    return read_probes([(str(pdir), ME)])


def _probe_dirs(env: dict[str, str]) -> list[ProbeDir]:
    """The probe folders this user may read, as ProbeReader finds them."""
    r = Rendezvous("/proc", env=env)
    r.refresh()
    return r.dirs()


def _only_ignored(part: ProbesPart) -> str:
    assert part.processes == ()
    assert len(part.ignored) == 1, part.ignored
    return part.ignored[0].reason


def test_a_live_probe_is_read(pdir: Path) -> None:
    _write(pdir, _doc())
    part = _read(pdir)
    assert part.ignored == () and [p.pid for p in part.processes] == [os.getpid()]
    p = part.processes[0]
    assert p.weights_bytes is None and "watch_model" in p.unavailable["weights_bytes"]  # unknown, not 0
    assert p.data_wait_fraction is None
    assert Snapshot.from_json(Snapshot(ts=1.0, host="h", probes=part).to_json()).probes == part


def test_another_file_name_or_a_temp_file_is_skipped(pdir: Path) -> None:
    _write(pdir, _doc(), name=f".{os.getpid()}.json.abcd.tmp")
    _write(pdir, _doc(), name="notes.txt")
    assert _read(pdir) == ProbesPart(dirs=(str(pdir),))


def test_a_missing_directory_is_no_probes(tmp_path: Path) -> None:
    assert read_probes([(str(tmp_path / "none"), ME)]) == ProbesPart(dirs=(str(tmp_path / "none"),))


def test_a_symlink_in_place_of_the_file(pdir: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps(_doc()))
    (pdir / f"{os.getpid()}.json").symlink_to(real)
    assert "symlink in place of the file" in _only_ignored(_read(pdir))


def test_a_symlink_in_place_of_the_directory(pdir: Path, tmp_path: Path) -> None:
    _write(pdir, _doc())
    link = tmp_path / "link"
    link.symlink_to(pdir)
    assert "symlink in place of the directory" in _only_ignored(read_probes([(str(link), ME)]))


def test_a_directory_others_can_write(pdir: Path) -> None:
    _write(pdir, _doc())
    os.chmod(pdir, 0o777)
    assert "writable by others" in _only_ignored(_read(pdir))


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give the directory to another user")
def test_a_directory_owned_by_someone_else(pdir: Path) -> None:
    _write(pdir, _doc())
    os.chown(pdir, 65534, 65534)
    assert "owned by uid 65534" in _only_ignored(_read(pdir))


def test_a_huge_file_is_not_read(pdir: Path) -> None:
    with open(pdir / f"{os.getpid()}.json", "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB that reading would cost
    assert "over the 4096-byte limit" in _only_ignored(_read(pdir))


def test_a_fifo_does_not_hang_the_reader(pdir: Path) -> None:
    os.mkfifo(pdir / f"{os.getpid()}.json")
    assert _only_ignored(_read(pdir)) == "not a regular file"


@pytest.mark.parametrize(("content", "reason"), [
    (b"{not json", "malformed: not JSON"),
    (b"\xff\xfe", "malformed: not JSON"),
    (b"[1, 2]", "malformed: format"),
    (json.dumps({"format": 1}).encode(), "malformed: devices"),
    (None, "malformed: cmd"),  # a field of the wrong type
    (b'{"format": 2}', "format 2 is newer than this dltop reads (1)"),
    (b'{"format": true}', "malformed: format"),
])
def test_bad_contents(pdir: Path, content: bytes | None, reason: str) -> None:
    _write(pdir, content if content is not None else _doc(cmd=["python", "train.py"]))
    assert _only_ignored(_read(pdir)).startswith(reason)


def test_a_file_naming_another_pid(pdir: Path) -> None:
    _write(pdir, _doc(), name="1.json")
    assert "not the file's" in _only_ignored(_read(pdir))


def test_a_dead_process(pdir: Path) -> None:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(p.stdout)
    _write(pdir, _doc(pid=pid), name=f"{pid}.json")
    part = _read(pdir)
    assert part.processes == () and part.ignored == () and [p.pid for p in part.exited] == [pid]
    assert part.exited[0].exited and part.exited[0].ended == NO_EXIT_RECORD  # killed: no exit record


def test_a_reused_pid(pdir: Path) -> None:
    doc = _doc()
    _write(pdir, {**doc, "start_time_ticks": doc["start_time_ticks"] - 100})
    part = _read(pdir)
    assert part.processes == () and [p.pid for p in part.exited] == [os.getpid()]  # the process it names is gone


@pytest.mark.skipif(not IS_ROOT, reason="needs root (setpriv to run the reader as nobody)")
def test_a_file_not_of_the_folders_owner_is_ignored(open_dir: Path) -> None:
    d = open_dir / "dltop"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    f = _write(d, _doc())  # owned by root, in nobody's directory
    f.chmod(0o644)
    code = (f"from dltop.sources.probes import read_probes; part = read_probes([({str(d)!r}, 65534)]); "
            "print(len(part.processes)); print(part.ignored[0].reason)")
    r = subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["0", "owned by uid 0, not the folder's owner (uid 65534)"]
    # nor does root: a file in a user's folder is that user's to write (a root-owned one there is a hard link or
    # a copy, never the user's probe)
    part = read_probes([(str(d), 65534)])
    assert part.processes == () and "not the folder's owner" in part.ignored[0].reason


@pytest.mark.skipif(not IS_ROOT, reason="needs root (setpriv to run a probe as nobody)")
def test_root_sees_a_probe_of_another_user(open_dir: Path) -> None:
    runtime = open_dir / "nobody"
    runtime.mkdir()
    os.chown(runtime, 65534, 65534)
    code = "import time, dltop.probe as p; p.start(); print(flush=True); time.sleep(30)"
    proc = subprocess.Popen([*NOBODY, sys.executable, "-c", code], env=probe_env(runtime), cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        part = read_probes([(str(runtime / "dltop"), 65534)])
        assert [(p.pid, p.uid) for p in part.processes] == [(proc.pid, 65534)] and part.ignored == ()
        # the same file in a directory said to be root's is not trusted
        assert "owned by uid 65534" in read_probes([(str(runtime / "dltop"), 0)]).ignored[0].reason
    finally:
        proc.kill()
        proc.wait()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=5000))
def test_arbitrary_bytes_never_crash_the_reader(pdir: Path, content: bytes) -> None:
    _write(pdir, content)
    part = _read(pdir)
    assert len(part.processes) + len(part.ignored) == 1


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(sorted(probe.report())), JSON, max_size=4),
       data=st.dictionaries(st.sampled_from(["steps", "recent_steps", "recent_wait_s", "recent_step_s",
                                             "input_shapes", "loader_workers", "pin_memory"]), JSON, max_size=4))
def test_arbitrary_values_in_a_real_report_never_crash_the_reader(pdir: Path, changes: dict, data: dict) -> None:
    doc = _doc(**changes)
    if data and "data" not in changes:
        doc["data"] = data
    _write(pdir, doc)
    part = _read(pdir)
    # a start time that is not this process's says the pid was reused: the job exited (kept for the post-mortem)
    assert len(part.processes) + len(part.ignored) + len(part.exited) == 1
    for p in (*part.processes, *part.exited):
        assert p.data_wait_fraction is None or 0.0 <= p.data_wait_fraction <= 1.0
        Snapshot.from_json(Snapshot(ts=1.0, host="h", probes=part).to_json())


# A parent that forks two children (a DataLoader's workers, in effect), one after the other; each reads argv[1]
# whole after evicting it from the page cache, so the read comes from storage, then waits for a line on stdin to exit. The parent
# says "read" once both have, and "reaped" once it has waited for them after stdin closes.
FORKER = r"""
import os, sys
path = sys.argv[1]
r, w = os.pipe()
go_r, go_w = os.pipe()  # closed by the parent: the children's cue to exit
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(go_w)
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 1 << 20):
            pass
        os.write(w, b"x")
        os.read(go_r, 1)
        os._exit(0)
    kids.append(pid)
    os.read(r, 1)  # one after the other: the second evicts and fetches it again, not from the first's cache
print("read", *kids, flush=True)
sys.stdin.readline()
os.close(go_w)
for k in kids:
    os.waitpid(k, 0)
print("reaped", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def disk_file() -> Iterator[Path]:
    """8 MiB on a disk filesystem (read_bytes counts what storage serves: a tmpfs read adds 0)."""
    fd, name = tempfile.mkstemp(prefix="dltop-procio-", dir="/var/tmp")
    path = Path(name)
    try:
        fs = subprocess.run(["stat", "-f", "-c", "%T", name], capture_output=True, text=True).stdout.strip()
        if fs in ("tmpfs", "ramfs"):
            pytest.skip(f"/var/tmp is {fs} here: no storage reads to count")
        os.write(fd, os.urandom(8 << 20))
        os.fsync(fd)
        yield path
    finally:
        os.close(fd)
        path.unlink()


def test_a_jobs_reads_are_its_own_and_its_childrens(disk_file: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", FORKER, str(disk_file)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        said = proc.stdout.readline().split()
        assert said[0] == "read"
        ticks = proc_start_ticks(proc.pid)
        assert ticks is not None and sorted(children(proc.pid) or []) == sorted(map(int, said[1:]))
        own = read_io(proc.pid)
        got = job_reads(proc.pid, ticks)
        assert got.unavailable is None and got.processes == 3
        assert got.read_bytes is not None and got.rchar_bytes is not None
        # the children fetched the file from storage twice over; the parent itself read next to nothing
        assert got.read_bytes - own[0] >= 2 * (8 << 20) and got.rchar_bytes - own[1] >= 2 * (8 << 20)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "reaped\n"
        # reaped, the children's counts are in the parent's own: the job's sum does not drop
        after = job_reads(proc.pid, ticks)
        assert after.processes == 1 and after.read_bytes is not None and after.read_bytes >= got.read_bytes
        # the same pid with another start time is another process: no numbers
        assert job_reads(proc.pid, ticks + 1).unavailable == f"process {proc.pid} has exited"
    finally:
        proc.kill()
        proc.wait()
    assert job_reads(proc.pid, ticks).unavailable == f"process {proc.pid} has exited"


@pytest.mark.skipif(not IS_ROOT or shutil.which("setpriv") is None, reason="needs root and setpriv (another user)")
def test_another_users_process_gives_a_reason_not_a_number() -> None:
    """dltop as an ordinary user: another user's job's /proc/PID/io is refused; the probe still shows, its reads
    unknown with the reason."""
    code = ("import sys; from dltop.sources.procio import job_reads; from dltop.probe.files import proc_start_ticks;"
            f" g = job_reads({os.getpid()}, proc_start_ticks({os.getpid()})); print(g.read_bytes, g.unavailable)")
    r = subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"None /proc/{os.getpid()}/io: permission denied (another user's process: run dltop as "
                        "root)\n")


def test_the_probes_source_adds_each_jobs_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("DLTOP_PROBE_DIR", raising=False)
    pdir = tmp_path / "dltop"
    os.close(open_private_dir(str(pdir)))
    _write(pdir, _doc())
    part = probes_source(Settings()).read()
    assert isinstance(part, ProbesPart)
    (mine,) = [p for p in part.processes if p.pid == os.getpid()]
    assert mine.io_unavailable is None and mine.io_processes is not None and mine.io_processes >= 1
    assert mine.io_read_bytes is not None and mine.io_rchar_bytes is not None and mine.io_rchar_bytes > 0
    again = Snapshot.from_json(Snapshot(ts=1.0, host="h", probes=part).to_json()).probes
    assert isinstance(again, ProbesPart) and mine in again.processes  # recorded and replayed as read


@pytest.mark.parametrize(("raw", "reason"), [
    (b"", "no rchar or read_bytes"),
    (b"rchar: 12\nwchar: 3\n", "no read_bytes"),
    (b"rchar: 12\nread_bytes: -4\n", "read_bytes: not a counter"),
    (b"rchar: 1e9\nread_bytes: 0\n", "rchar: not a counter"),
    (b"rchar: \xd9\xa3\nread_bytes: 0\n", "rchar: not a counter"),  # Arabic-Indic digits are digits to str
    (b"rchar: 18446744073709551616\nread_bytes: 0\n", "rchar: not a counter"),  # 2**64
    (b"rchar: 5\nrchar: 6\nread_bytes: 0\n", "rchar given twice"),
])
def test_a_bad_proc_io_is_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(Unreadable, match=f"^{reason}$"):
        parse_io(raw)


def test_the_real_proc_io_parses() -> None:
    with open("/proc/self/io", "rb") as f:
        raw = f.read()
    fields = dict(line.split(b": ") for line in raw.splitlines())
    assert parse_io(raw) == (int(fields[b"read_bytes"]), int(fields[b"rchar"]))


IO_TRIED: list[bytes] = []
IO_LINE = st.tuples(st.sampled_from([b"rchar", b"read_bytes", b"wchar", b"syscr", b"", b"read_bytes "]),
                    st.sampled_from([b":", b": ", b"=", b""]),
                    st.binary(max_size=24) | st.integers(-5, 1 << 70).map(lambda n: str(n).encode()))


@settings(max_examples=300, derandomize=True, deadline=None)
@given(lines=st.lists(IO_LINE.map(b"".join), max_size=9) | st.binary(max_size=300).map(lambda b: [b]))
def test_any_proc_io_text_gives_counters_or_a_reason(lines: list[bytes]) -> None:
    raw = b"\n".join(lines)
    IO_TRIED.append(raw)
    try:
        read_bytes, rchar = parse_io(raw)
    except Unreadable as e:
        assert str(e) and "\n" not in str(e)
    else:
        assert 0 <= read_bytes < 1 << 64 and 0 <= rchar < 1 << 64


def test_the_proc_io_fuzz_ran() -> None:
    if not IO_TRIED:
        pytest.skip("the fuzz above did not run in this session")
    print(f"parse_io: {len(IO_TRIED)} inputs tried")
    assert len(IO_TRIED) >= 300


torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, the test extra)")

TRAIN = """
import sys, time, torch, dltop.probe as probe
width = int(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.LayerNorm(width))
probe.watch_model(model)
def loader():
    for _ in range(10):
        time.sleep(0.02)
        yield torch.zeros(4, width)
probe.start(interval_s=0.1)
for epoch in range(2):
    for x in probe.track(loader()):
        model(x)
        time.sleep(0.02)
    probe.mark_epoch()
probe.publish()
data = probe.report()["data"]
print(sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]),
      data["recent_wait_s"] / data["recent_step_s"], flush=True)
time.sleep(60)
"""


def test_two_processes_with_the_probe_and_snapshot_json(tmp_path: Path) -> None:
    procs = {w: subprocess.Popen([sys.executable, "-c", TRAIN, str(w)], env=probe_env(tmp_path), cwd=REPO,
                                 stdout=subprocess.PIPE, text=True) for w in (8, 64)}
    try:
        said = {w: p.stdout.readline().split() for w, p in procs.items()}
        weights = {w: int(s[0]) for w, s in said.items()}
        r = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json"], env=probe_env(tmp_path),
                           capture_output=True, text=True, cwd=REPO, timeout=60)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)["probes"]
        # As root, dltop also reads every other user's probe directory: on a shared node their jobs are there
        # too, so only the files in ours count here.
        got = {p["pid"]: p for p in out["processes"] if p["path"].startswith(str(tmp_path))}
        assert set(got) == {p.pid for p in procs.values()}
        assert [i for i in out["ignored"] if i["path"].startswith(str(tmp_path))] == []
        for w, p in procs.items():
            mine = got[p.pid]
            assert mine["weights_bytes"] == weights[w] and mine["kv_bytes"] == 0
            # the fraction the process itself saw (tests/test_probe.py bounds it against the loop's own clock)
            assert mine["data_wait_fraction"] == pytest.approx(float(said[w][1]), rel=1e-9)
            assert 0 < mine["data_wait_fraction"] < 1
            assert [e["steps"] for e in mine["epochs"]] == [10, 10]
            for e in mine["epochs"]:
                assert 0.2 <= e["data_wait_s"] < e["duration_s"] and isinstance(e["machine_cached_delta_bytes"], int)
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    # both gone (SIGKILL: no exit handler ran): their files stay, each read as an exited process with its last
    # epochs, killed without an exit record (issue 18, item 9)
    part = read_probes([(str(tmp_path / "dltop"), ME)])
    assert part.processes == () and part.ignored == ()
    assert sorted(p.pid for p in part.exited) == sorted(p.pid for p in procs.values())
    for p in part.exited:
        assert p.exited and p.ended == NO_EXIT_RECORD and [e.steps for e in p.epochs] == [10, 10]
        assert p.exited_at == p.published_at


@pytest.fixture
def shared_dir():
    """A $DLTOP_PROBE_DIR as the DaemonSet's init container makes it: sticky and writable by all, as /tmp."""
    d = Path(tempfile.mkdtemp(prefix="dltop-probe-shared-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d)


@pytest.mark.skipif(not IS_ROOT or shutil.which("unshare") is None,
                    reason="needs root and unshare (a probe in its own PID namespace, as a pod's is)")
def test_a_probe_in_another_pid_namespace_is_read_from_the_shared_dir(shared_dir: Path) -> None:
    # A training pod: its own PID namespace (the probe is pid 1 there), another uid, DLTOP_PROBE_DIR on a
    # hostPath that dltop, with the host's pids, reads too.
    code = "import os, time, dltop.probe as p; print(os.getpid(), p.start(0.2), flush=True); time.sleep(60)"
    env = probe_env(shared_dir / "unused", DLTOP_PROBE_DIR=str(shared_dir), PYTHONPATH=str(REPO))
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *NOBODY, sys.executable, "-c", code],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    host = 0
    try:
        assert proc.stdout is not None
        inner, path = proc.stdout.readline().split()
        [sub] = shared_dir.iterdir()
        uid, pidns = sub.name.split(".")
        assert inner == "1" and path == str(sub / "1.json") and uid == "65534"
        st_ = sub.stat()
        assert st_.st_uid == 65534 and st_.st_mode & 0o777 == 0o700
        assert int(pidns) != os.stat("/proc/self/ns/pid").st_ino
        # the python under unshare's fork: the one process of that namespace that is its pid 1
        from dltop.probe.files import pid_namespace
        host = next(int(p) for p in os.listdir("/proc") if p.isdigit() and pid_namespace("/proc", p) == int(pidns)
                    and f"NSpid:\t{p}\t1\n" in Path(f"/proc/{p}/status").read_text())
        dirs = _probe_dirs(env={"DLTOP_PROBE_DIR": str(shared_dir)})
        assert (str(sub), 65534, int(pidns)) in dirs
        part = read_probes(dirs)
        [found] = [p for p in part.processes if p.path == str(sub / "1.json")]
        assert (found.pid, found.uid) == (host, 65534)  # the pid NVML and /proc give on the node
        assert not [i for i in part.ignored if str(shared_dir) in i.path], part.ignored
        # A directory named after nobody's uid and a namespace no process of nobody's runs in is not even looked
        # at: the folders read come from the processes (the kernel's uid and namespace), not from names.
        fake = shared_dir / f"65534.{int(pidns) + 1}"
        fake.mkdir(mode=0o700)  # made by root here, standing in for any other uid
        assert str(fake) not in [d[0] for d in _probe_dirs(env={"DLTOP_PROBE_DIR": str(shared_dir)})]
        # dltop as nobody sees only nobody's directories under the shared one
        r = subprocess.run([*NOBODY, sys.executable, "-c",
                            "from dltop.sources.rendezvous import Rendezvous; r = Rendezvous(); r.refresh(); "
                            "print(r.dirs())"],
                           env={**env, "DLTOP_PROBE_DIR": str(shared_dir)}, cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert str(sub) in r.stdout
    finally:
        if host:
            os.kill(host, signal.SIGKILL)  # a pod killed: its file stays (setpriv's setuid drops --kill-child)
        proc.kill()
        proc.wait()
    # the pod is gone: its file is not a live process but an exited one, under the pod's pid
    while os.path.exists(f"/proc/{host}"):
        time.sleep(0.05)  # the kernel reaps the namespace's pid 1 after unshare's end
    part = read_probes([(str(sub), 65534, int(pidns))])
    assert part.processes == () and [(p.pid, p.ended) for p in part.exited] == [(1, NO_EXIT_RECORD)]


TORCHRUN_WORKER = """
import os, sys, time, torch.distributed as dist, dltop.probe as probe
dist.init_process_group("gloo")
probe.start(0.2)
dist.barrier()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_plain_torchrun_jobs_are_two_jobs(tmp_path: Path) -> None:
    """Two unrelated torchrun jobs without --rdzv-id (both have TORCHELASTIC_RUN_ID=none): two jobs of 2 ranks,
    not one of "4 ranks 0,0,1,1" (issue 18, item 8)."""
    worker, release = tmp_path / "worker.py", tmp_path / "release"
    worker.write_text(TORCHRUN_WORKER)
    env = probe_env(tmp_path, PYTHONPATH=str(REPO))
    jobs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                              "--master-port", str(_free_port()), str(worker), str(release)], env=env, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while True:
            part = read_probes([(str(tmp_path / "dltop"), ME)])
            if len(part.processes) == 4 or time.monotonic() > deadline or any(j.poll() is not None for j in jobs):
                break
            time.sleep(0.2)
        assert len(part.processes) == 4, [j.stderr.read() if j.stderr and j.poll() is not None else "" for j in jobs]
        grouped: dict[str, list[int]] = {}
        for p in part.processes:
            assert p.world_size == 2 and p.rank is not None
            grouped.setdefault(p.job_key, []).append(p.rank)
        assert sorted(sorted(r) for r in grouped.values()) == [[0, 1], [0, 1]], grouped
        # each job's key names its own agent (the ranks' parent)
        agents = {j.pid for j in jobs}
        assert {p.ppid for p in part.processes} == agents
    finally:
        release.touch()
        for j in jobs:
            try:
                j.wait(timeout=60)
            except subprocess.TimeoutExpired:
                j.kill()
                j.wait()


@pytest.mark.parametrize("changes, field, kept", [
    ({"optimizer_steps": -1}, "optimizer_steps", None),
    ({"optimizer_steps": 7}, "optimizer_steps", 7),
    ({"exit": {"how": "rm -rf", "error": "x"}}, "exit_how", None),
    ({"exit": {"how": "exception", "error": 5}}, "exit_error", None),
    ({"exit": {"how": "exit", "exit_code": 1e400}}, "exit_code", None),
])
def test_the_new_fields_are_validated(pdir: Path, changes: dict, field: str, kept: object) -> None:
    """optimizer_steps and the exit record are checked as every other field: a bad one costs only itself."""
    doc = _doc(**changes)
    doc["data"] = {"steps": 3, "recent_steps": 2, "recent_wait_s": 0.1, "recent_step_s": 1.0,
                   "last_step_age_s": float("nan"), "window_s": 10.0, "in_epoch": "yes"}
    p = parse_probe(json.loads(json.dumps(doc)), "x", ME)
    assert getattr(p, field) == kept and p.last_step_age_s is None and p.in_epoch is None
    assert p.step_time_s == 0.5  # the rest of the file is read
    if kept is None:
        assert any(k.startswith(("optimizer_steps", "exit.")) for k in p.unavailable)


def test_loaders_apart_are_validated_each(pdir: Path) -> None:
    good = {"steps": 6, "recent_steps": 4, "recent_wait_s": 0.1, "recent_step_s": 0.4, "last_step_age_s": 1.0}
    loaders = {"val": good, "test": {**good, "recent_wait_s": float("nan")}, "x\x1b[2J": good,
               "hold": {**good, "recent_wait_s": 2.0}, "neg": {**good, "steps": -1}, "more": good}
    _write(pdir, _doc(loaders=loaders))
    p = _read(pdir).processes[0]
    assert [(v.name, v.steps, v.step_time_s, v.data_wait_fraction) for v in p.loaders] == [("val", 6, 0.1, 0.25)]
    assert p.unavailable["loaders.test"] == "loaders.test left out: recent_wait_s: nan is not a finite number"
    assert "a name of letters" in p.unavailable["loaders[2]"]
    assert p.unavailable["loaders.hold"] == "loaders.hold left out: recent_wait_s: 2 is longer than its steps"
    assert p.unavailable["loaders"] == "loaders: over 4, the rest left out"
    _write(pdir, _doc(loaders=[1, 2]))
    p = _read(pdir).processes[0]
    assert p.loaders == () and p.unavailable["loaders"] == "loaders ignored: expected an object"


@pytest.mark.parametrize("data, loss, epoch, field, why", [
    ({"samples": 40, "recent_samples": 80}, None, {}, "samples_per_s", "80 is more than the 40 in all"),
    ({"samples": 40, "recent_samples": 40, "recent_step_s": 1e-30}, None, {}, "samples_per_s", "an absurd rate"),
    ({"tokens": -5, "recent_tokens": 1}, None, {}, "tokens_per_s", "negative"),
    ({}, {"value": "2.3", "logged": 1}, {}, "loss", "expected a number, got str"),
    ({}, {"value": 1e300, "logged": 1}, {}, "loss", "an absurd number"),
    ({}, {"value": None, "nonfinite": "rm -rf", "logged": 1}, {}, "loss", "expected one of nan, inf, -inf"),
    ({}, None, {"loss": float("nan")}, "epochs", "nan is not a finite number"),
    ({}, None, {"samples": 1.5}, "epochs", "expected int, got float"),
])
def test_throughput_and_loss_fields_are_validated(data: dict, loss: dict | None, epoch: dict, field: str,
                                                  why: str) -> None:
    """Each new number is checked as the others are: a bad one is left out with its reason, the rest is read."""
    now = time.time()
    doc = _doc(epochs=[{"index": 0, "started_at": now - 2, "ended_at": now - 1, "duration_s": 1.0,
                        "data_wait_s": 0.1, "steps": 4, **epoch}])
    doc["data"] = {"steps": 8, "recent_steps": 4, "recent_wait_s": 0.1, "recent_step_s": 1.0, "window_s": 10.0,
                   **data}
    if loss is not None:
        doc["loss"] = loss
    p = parse_probe(json.loads(json.dumps(doc)), "x", ME)
    assert p.step_time_s == doc["data"]["recent_step_s"] / 4  # the rest of the file is read
    if field == "epochs":
        assert p.epochs == () and why in p.unavailable["epochs[0]"]
    else:
        assert getattr(p, field) is None and any(why in v for v in p.unavailable.values()), p.unavailable
    good = parse_probe(json.loads(json.dumps({**doc, "data": {**doc["data"], "samples": 80, "recent_samples": 32,
                                                              "recent_step_s": 1.0},
                                              "loss": {"value": -0.5, "logged": 3, "age_s": 0.2},
                                              "epochs": [{**doc["epochs"][0], "samples": 32, "loss": 2.0}]})),
                       "x", ME)
    assert good.samples_per_s == 32.0 and good.loss == -0.5 and good.losses_logged == 3  # a loss may be negative
    assert good.epochs[0].samples_per_s == 32.0 and good.epochs[0].loss == 2.0
