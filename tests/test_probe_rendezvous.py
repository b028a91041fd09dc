"""The probes' rendezvous as a second, unprivileged user would attack it (setpriv), while root's dltop reads.

Each test is one finding of the trust issue, and fails on the code before it: another user squats a victim's
folder, stuffs a shared DLTOP_PROBE_DIR, joins a victim's job under its job id, or blinds dltop with thousands of
files and folders. dltop must still see the victim's job, name each job's user, take commands from /proc, and say
whatever it leaves out. Each test reads only the uids it made (`user=`), so other users' jobs on a shared node do
not change what it sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dltop.model.probes import ProbesPart, group_jobs
from dltop.sources import probes, rendezvous
from dltop.sources.probes import ProbeReader
from tests.probe_helpers import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv (a second user attacks, root's dltop reads)")

ATTACKER, VICTIM = 65531, 65532  # uids no other test uses

# A probe that publishes every 0.2 s and steps every `step` seconds under the job id it is given.
JOB = r"""
import os, sys, time, dltop.probe as probe
step = float(sys.argv[1])
def loader():
    while True:
        time.sleep(step)
        yield 1
print(probe.start(interval_s=0.2), flush=True)
for _ in probe.track(loader()):
    pass
"""


def as_user(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def bare_env(**extra: str) -> dict[str, str]:
    """A job's environment with no $XDG_RUNTIME_DIR (Slurm, a container, `env -i`): it publishes in /dev/shm."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), **extra}


def start_job(uid: int, step: float = 0.05, **env: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([*as_user(uid), sys.executable, "-c", JOB, str(step)], env=bare_env(**env), cwd="/",
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, p.stdout.readline().strip()


def until(read: Callable[[], ProbesPart], ok: Callable[[ProbesPart], bool], what: str, timeout: float = 20) -> ProbesPart:
    deadline = time.monotonic() + timeout
    while True:
        part = read()
        if ok(part):
            return part
        assert time.monotonic() < deadline, f"{what}: {part}"
        time.sleep(0.2)


def pids(part: ProbesPart) -> set[int]:
    return {p.pid for p in part.processes}


@pytest.fixture
def procs(shm: list[Path]) -> Iterator[list[subprocess.Popen]]:
    """Processes the test starts, killed after it (before its folders are removed)."""
    out: list[subprocess.Popen] = []
    yield out
    for p in out:
        p.kill()
        p.wait()


@pytest.fixture
def shm() -> Iterator[list[Path]]:
    """Folders the test makes in /dev/shm, removed after it (and the two users' probe folders before it)."""
    made: list[Path] = [Path(f"/dev/shm/dltop-{ATTACKER}"), Path(f"/dev/shm/dltop-{VICTIM}")]
    _remove(made)
    yield made
    _remove(made)


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_symlink() or path.is_file():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)


def test_a_squatted_folder_does_not_hide_a_job(procs: list[subprocess.Popen], shm: list[Path]) -> None:
    """Finding 1: another user makes /dev/shm/dltop-VICTIM (0700, or a symlink) before the victim starts."""
    for squat in ("dir", "symlink"):
        target = Path(f"/dev/shm/dltop-{VICTIM}")
        shm.append(target)
        script = (f"import os; os.mkdir({str(target)!r}, 0o700)" if squat == "dir"
                  else f"import os; os.symlink('/dev/shm', {str(target)!r})")
        subprocess.run([*as_user(ATTACKER), sys.executable, "-c", script], check=True)
        job, path = start_job(VICTIM)
        procs.append(job)
        assert path == f"/proc/{job.pid}/fd/" + path.rsplit("/", 1)[1], path  # it publishes through its memfd
        reader = ProbeReader(user=VICTIM)
        part = until(reader.read, lambda part, pid=job.pid: any(p.pid == pid and p.step_time_s for p in part.processes),
                     f"the victim's job stepping ({squat} squatted)")
        [p] = [p for p in part.processes if p.pid == job.pid]
        assert p.uid == VICTIM
        assert f"dltop-{VICTIM}" in (p.folder_refused or "")
        assert p.step_time_s is not None
        # the squatted folder itself is refused, and said so
        assert any(str(target) in i.path for i in part.ignored), part.ignored
        job.kill()
        job.wait()
        # gone: kept as an exited job with its last numbers, and no claim of how it ended
        part = until(reader.read, lambda part, pid=job.pid: pid in {p.pid for p in part.exited}, "the exited victim")
        [gone] = [p for p in part.exited if p.pid == job.pid]
        assert gone.step_time_s is not None and "how it ended is not known" in gone.ended
        target.unlink() if target.is_symlink() else target.rmdir()


def test_stuffing_a_shared_probe_dir_hides_no_job(procs: list[subprocess.Popen], shm: list[Path]) -> None:
    """Finding 2: 4,097 folders `ATTACKER.N` in a shared DLTOP_PROBE_DIR sort before the victim's and used to push
    it past the 4,096-name cut with no note at all."""
    shared = Path(tempfile.mkdtemp(prefix="dltop-shared-", dir="/dev/shm"))
    shm.append(shared)
    os.chmod(shared, 0o1777)  # sticky and writable by all, as the DaemonSet's init container makes it
    subprocess.run([*as_user(ATTACKER), sys.executable, "-c",
                    f"import os\nfor n in range(4097): os.mkdir('{shared}/{ATTACKER}.' + str(n), 0o700)"], check=True)
    job, path = start_job(VICTIM, DLTOP_PROBE_DIR=str(shared))
    procs.append(job)
    assert path.startswith(f"{shared}/{VICTIM}."), path
    reader = ProbeReader(env={"DLTOP_PROBE_DIR": str(shared)})
    part = until(reader.read, lambda part: job.pid in pids(part), "the victim's job in the stuffed shared dir")
    # the stuffing costs its owner: the slow sweep keeps 16 of the attacker's folders, and says so
    part = until(reader.read, lambda part: any(i.cut and f"uid {ATTACKER}: 40" in i.reason and "more folders past 16" in i.reason
                                               for i in part.ignored), "the sweep's note on the stuffing")
    assert job.pid in pids(part)
    assert len([d for d in part.dirs if f"/{ATTACKER}." in d]) == rendezvous.SWEEP_PER_USER


def test_a_user_that_runs_nothing_here_keeps_the_post_mortem(procs: list[subprocess.Popen],
                                                             shm: list[Path]) -> None:
    """Exited jobs are shown as long as their files are there, even once their user runs nothing here: a slow,
    owner-checked sweep of /dev/shm finds the folder (no name is believed: 50,000 other folders are passed over)."""
    job, _ = start_job(VICTIM)
    deadline = time.monotonic() + 20
    while not Path(f"/dev/shm/dltop-{VICTIM}/{job.pid}.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    job.kill()
    job.wait()
    assert VICTIM not in _owners()
    part = until(ProbeReader().read, lambda part: job.pid in {p.pid for p in part.exited}, "the post-mortem")
    [p] = [p for p in part.exited if p.pid == job.pid]
    assert p.uid == VICTIM and p.ended  # killed: no exit record, and it says so


def test_another_user_cannot_join_a_job(procs: list[subprocess.Popen], shm: list[Path]) -> None:
    """Finding 3: a process of another user with the victim's TORCHELASTIC_RUN_ID and a 4 s step became a rank of
    the victim's job (its step the job's), the row named no user, and its command came from its file."""
    run_id = f"victim-job-{os.getpid()}"
    victim, _ = start_job(VICTIM, step=0.05, TORCHELASTIC_RUN_ID=run_id)
    attacker, _ = start_job(ATTACKER, step=4.0, TORCHELASTIC_RUN_ID=run_id)
    procs += [victim, attacker]
    reader = ProbeReader()
    part = until(reader.read, lambda part: {victim.pid, attacker.pid} <= pids(part), "both jobs")
    mine = [p for p in part.processes if p.pid in (victim.pid, attacker.pid)]
    grouped = group_jobs(mine)
    assert len(grouped) == 2, grouped.keys()  # two users: two jobs, whatever job id they claim
    [v] = [p for p in mine if p.pid == victim.pid]
    [a] = [p for p in mine if p.pid == attacker.pid]
    assert (v.uid, a.uid) == (VICTIM, ATTACKER) and v.job_key != a.job_key
    assert grouped[v.job_key] == [v]
    # the command shown is the kernel's (/proc/PID/cmdline), not what the file says
    doc = json.loads(Path(f"/dev/shm/dltop-{ATTACKER}/{attacker.pid}.json").read_text())
    assert doc["cmd"] in a.cmd or a.cmd.startswith(sys.executable)
    forged = {**doc, "cmd": "python /home/victim/train.py --lr 3e-4"}
    subprocess.run([*as_user(ATTACKER), sys.executable, "-c",
                    f"import os, sys; open('/dev/shm/dltop-{ATTACKER}/x.tmp', 'w').write(sys.argv[1]); "
                    f"os.rename('/dev/shm/dltop-{ATTACKER}/x.tmp', '/dev/shm/dltop-{ATTACKER}/{attacker.pid}.json')",
                    json.dumps(forged)], check=True)
    attacker.send_signal(19)  # SIGSTOP: its probe does not write over the forged file while it is read
    try:
        [a] = [p for p in reader.read().processes if p.pid == attacker.pid]
        assert "victim" not in a.cmd and a.cmd.startswith(sys.executable)
    finally:
        attacker.send_signal(18)


def test_thousands_of_files_and_folders_blind_nothing(procs: list[subprocess.Popen], shm: list[Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 5: 4,096 valid probe files that another user keeps rewriting, and 50,000 squatted `dltop-N`
    folders. Reading stays bounded (files parsed, folders opened) and the victim's job is there."""
    victim, _ = start_job(VICTIM)
    procs.append(victim)
    own = Path(f"/dev/shm/dltop-{ATTACKER}")
    # a real probe file of the attacker's as the model for 4,096 forged ones, rewritten in a loop
    spammer = subprocess.Popen([*as_user(ATTACKER), sys.executable, "-c", f"""
import json, os, sys, time
sys.path.insert(0, {str(REPO)!r})
import dltop.probe as probe
probe.start(interval_s=60)
d = {str(own)!r}
doc = json.load(open(f"{{d}}/{{os.getpid()}}.json"))
print("ready", flush=True)
while True:
    for n in range(100000, 104096):
        doc["pid"] = n
        doc["published_at"] = time.time()
        open(f"{{d}}/.t", "w").write(json.dumps(doc))
        os.rename(f"{{d}}/.t", f"{{d}}/{{n}}.json")
"""], env=bare_env(), cwd="/", stdout=subprocess.PIPE, text=True)
    procs.append(spammer)
    assert spammer.stdout is not None and spammer.stdout.readline().strip() == "ready"
    # 50,000 folders named like other users' (the attacker owns them all), for uids that run nothing here
    subprocess.run([*as_user(ATTACKER), sys.executable, "-c",
                    "import os\nfor n in range(300000, 350000): os.mkdir('/dev/shm/dltop-' + str(n), 0o700)"],
                   check=True)
    shm += [Path(f"/dev/shm/dltop-{n}") for n in range(300000, 350000)]
    parsed: list[str] = []
    real = probes._parse_file

    def counting(raw: bytes, path: str, uid: int):  # type: ignore[no-untyped-def]
        parsed.append(path)
        return real(raw, path, uid)

    monkeypatch.setattr(probes, "_parse_file", counting)
    reader = ProbeReader()
    part = until(reader.read, lambda part: victim.pid in pids(part), "the victim's job beside the spam")
    assert not any("/dltop-3" in d for d in part.dirs)  # the squatted folders are not opened
    parsed.clear()
    part = reader.read()
    assert victim.pid in pids(part)
    spam = [p for p in parsed if p.startswith(str(own))]
    assert len(spam) <= probes.MAX_LIVE + probes.MAX_EXITED, len(spam)  # bounded per user, whatever is there
    # what the attacker's folder cost the attacker is said, per file or per folder
    assert [i for i in part.ignored if i.path.startswith(str(own))]
    assert all(p.uid != ATTACKER or p.pid == spammer.pid for p in part.processes)  # no forged pid is a live job


def test_a_user_sees_only_their_own_jobs(procs: list[subprocess.Popen], shm: list[Path]) -> None:
    """A non-root dltop (here the victim's) reads its own user's probes and no one else's."""
    victim, _ = start_job(VICTIM)
    attacker, _ = start_job(ATTACKER)
    procs += [victim, attacker]
    code = ("import time; from dltop.sources.probes import ProbeReader; r = ProbeReader(); t = time.time() + 15\n"
            "while time.time() < t:\n"
            "    part = r.read()\n"
            f"    if {victim.pid} in [p.pid for p in part.processes]: break\n"
            "    time.sleep(0.2)\n"
            "print(sorted({p.uid for p in part.processes}), [p.pid for p in part.processes])")
    out = subprocess.run([*as_user(VICTIM), sys.executable, "-c", code], env=bare_env(), cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    uids, seen = out.stdout.split("] ", 1)
    assert uids == f"[{VICTIM}" and str(victim.pid) in seen and str(attacker.pid) not in seen


def test_a_cut_is_said_on_the_hint_line(procs: list[subprocess.Popen], shm: list[Path]) -> None:
    """No silent cuts: a user's folder holding more files of live processes than it is read for is a hint."""
    from dltop.hints.training import probes_left_out
    from dltop.model import Snapshot

    own = Path(f"/dev/shm/dltop-{ATTACKER}")
    # the attacker's real processes, each with a file named for its pid (a forged copy of a real report)
    job, _ = start_job(ATTACKER)
    procs.append(job)
    doc = json.loads((own / f"{job.pid}.json").read_text())
    many = [subprocess.Popen([*as_user(ATTACKER), "sleep", "60"]) for _ in range(probes.MAX_LIVE + 4)]
    procs += many
    files = {str(p.pid): json.dumps({**doc, "pid": p.pid}) for p in many}
    subprocess.run([*as_user(ATTACKER), sys.executable, "-c",
                    f"import json, sys\nfor pid, text in json.load(sys.stdin).items(): "
                    f"open('{own}/' + pid + '.json', 'w').write(text)"], input=json.dumps(files), text=True,
                   check=True)
    part = ProbeReader(user=ATTACKER).read()
    [cut] = [i for i in part.ignored if i.cut and i.path == str(own)]
    assert "past 256: not read" in cut.reason
    snap = Snapshot(ts=time.time(), host="t", probes=part)
    hint = probes_left_out([snap])
    assert hint is not None and hint.id == "training-probes-left-out" and str(own) in hint.text
    assert probes_left_out([Snapshot(ts=time.time(), host="t", probes=ProbesPart())]) is None


def _owners() -> set[int]:
    out = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                out.add(os.stat(f"/proc/{p}").st_uid)
    return out


def test_exited_memfd_jobs_are_kept_per_user_within_a_bound(procs: list[subprocess.Popen], shm: list[Path]) -> None:
    """A user whose folder is refused (here its own symlink) and who runs many short jobs costs only itself: a
    reader keeps at most MAX_EXITED of its exited memfd jobs, the newest."""
    subprocess.run([*as_user(ATTACKER), sys.executable, "-c",
                    f"import os; os.symlink('/dev/shm', '/dev/shm/dltop-{ATTACKER}')"], check=True)
    jobs_ = [start_job(ATTACKER)[0] for _ in range(probes.MAX_EXITED + 2)]
    procs += jobs_
    reader = ProbeReader(user=ATTACKER)
    until(reader.read, lambda part: {j.pid for j in jobs_} <= pids(part), "every memfd job live")
    for j in jobs_:
        j.kill()
        j.wait()
    part = until(reader.read, lambda part: not pids(part) & {j.pid for j in jobs_}, "every job gone")
    assert len(reader.gone) == probes.MAX_EXITED and len(part.exited) == probes.MAX_EXITED
    assert all("how it ended is not known" in p.ended for p in part.exited)


SWAPPER = r"""
import fcntl, os, sys
from dltop.probe.files import MEMFD_NAME, SEALS
fd = os.memfd_create(MEMFD_NAME, os.MFD_ALLOW_SEALING)
os.write(fd, b"{}")
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
ref = os.open(sys.argv[1], os.O_PATH)  # no read permission needed: a root-only file of a folder it can search
print(fd, flush=True)
sys.stdin.readline()
os.dup2(ref, fd)  # the descriptor dltop checked now names the root-only file
print("swapped", flush=True)
sys.stdin.readline()
"""


def test_a_descriptor_swapped_after_its_check_is_never_opened(monkeypatch: pytest.MonkeyPatch, reachable_dir: Path,
                                                              procs: list[subprocess.Popen]) -> None:
    """The process swaps the descriptor dltop is about to read for a root-only file (a device would do worse) right
    after dltop looked at its name: root's reader must not open it (it reads through an O_PATH fd of its own)."""
    from dltop import kernel

    secret = reachable_dir / "secret"
    secret.write_text("root only")
    os.chmod(secret, 0o600)
    swapper = subprocess.Popen([*as_user(ATTACKER), sys.executable, "-c", SWAPPER, str(secret)], env=bare_env(),
                               cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    procs.append(swapper)
    assert swapper.stdin is not None and swapper.stdout is not None
    fd = int(swapper.stdout.readline())
    watch = kernel.inotify_init()
    kernel.inotify_add_watch(watch, str(secret), 0x20)  # IN_OPEN
    real = os.readlink
    swapped: list[bool] = []

    def readlink_then_swap(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        got = real(path, *args, **kwargs)
        if not swapped:  # the swap lands right after dltop's look at the name
            swapped.append(True)
            swapper.stdin.write("go\n")
            swapper.stdin.flush()
            assert swapper.stdout.readline().strip() == "swapped"
        return got

    monkeypatch.setattr(os, "readlink", readlink_then_swap)
    got = probes._read_memfd("/proc", swapper.pid, fd, {}, {})
    monkeypatch.undo()
    assert swapped and isinstance(got, str)  # what it held when checked: a memfd whose "{}" is no probe
    try:
        os.read(watch, 4096)
        opened = True
    except BlockingIOError:
        opened = False
    os.close(watch)
    assert not opened, "root opened the file the process swapped in"


FORKER = r"""
import fcntl, os, sys, time
from dltop.probe.files import MEMFD_NAME, SEALS
n = int(sys.argv[1])
done_r, done_w = os.pipe()  # each child says when its memfd is there: "ready" means all of them hold one
for _ in range(n):
    if os.fork() == 0:
        fd = os.memfd_create(MEMFD_NAME, os.MFD_ALLOW_SEALING)
        os.write(fd, b"{}")
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        os.write(done_w, b"x")
        time.sleep(60)
        os._exit(0)
got = 0
while got < n:
    got += len(os.read(done_r, n - got))
print("ready", flush=True)
time.sleep(60)
"""


def test_one_users_many_memfds_are_read_within_a_bound(procs: list[subprocess.Popen],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's thousands of processes that hold a memfd cost only that user: at most MAX_LIVE of them are
    read a reading, and the rest is said (a reading had no bound on them)."""
    n = probes.MAX_LIVE + 8
    forker = subprocess.Popen([*as_user(ATTACKER), sys.executable, "-c", FORKER, str(n)], env=bare_env(), cwd="/",
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    procs.append(forker)
    try:
        assert forker.stdout is not None and forker.stdout.readline().strip() == "ready"
        read: list[int] = []
        real = probes._read_memfd

        def counting(proc, pid, *args):  # type: ignore[no-untyped-def]
            read.append(pid)
            return real(proc, pid, *args)

        monkeypatch.setattr(probes, "_read_memfd", counting)
        reader = ProbeReader(user=ATTACKER)
        part = until(reader.read, lambda part: any(i.cut and i.path == f"uid {ATTACKER}" for i in part.ignored),
                     "the cut of the user's memfds")
        [cut] = [i for i in part.ignored if i.cut and i.path == f"uid {ATTACKER}"]
        assert cut.reason.startswith(f"{n - probes.MAX_LIVE} processes with a probe's memfd past {probes.MAX_LIVE}")
        read.clear()
        reader.read()
        assert len(read) == probes.MAX_LIVE
    finally:
        os.killpg(forker.pid, 9)
