"""Training hints on Snapshots whose probes part is real probe output (the probe run in this process over real
loaders and real torch, or in a real training job beside this one, read back through sources/probes.py and
the job's own reads through sources/procio.py), and whose memory part is a real reading (the recorded
train_tiny session, or this machine's now)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dltop.probe as probe
from dltop.hints import RULES, hints
from dltop.hints.training import (
    IO_MIN_BYTES,
    IO_SHARE,
    SHAPES_MANY,
    compile_fell_back_to_eager,
    cudnn_benchmark_shapes,
    data_wait_high,
    oom_retries_rising,
    page_cache_warming,
    recompiling,
    stalled,
)
from dltop.model import MemoryPart, Snapshot
from dltop.model import probes as probes_model
from dltop.model.probes import ProbeEpoch, ProbesPart
from dltop.residency.scan import scan_paths
from dltop.sources.memory import read_memory
from dltop.sources.probes import parse_probe, read_probes
from dltop.sources.procio import children, read_io, with_job_reads
from tests.conftest import load_session
from tests.probe_helpers import REPO, probe_env

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, the test extra)")


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(probe, "state", probe._State())


def probes_now() -> ProbesPart:
    """This process's probe as dltop reads it."""
    return ProbesPart(processes=(parse_probe(probe.report(), "/dev/shm/dltop-0/x.json", os.getuid()),))


def snap(ts: float, **parts: object) -> Snapshot:
    return Snapshot(ts=ts, host="t", probes=probes_now(), **parts)  # type: ignore[arg-type]


def loader(n: int, wait_s: float, shape: tuple[int, ...] = (2, 3)) -> Iterator[object]:
    for _ in range(n):
        time.sleep(wait_s)
        yield torch.zeros(shape)


def run_epoch(n: int, wait_s: float, work_s: float = 0.0, data_dir: str | None = None) -> None:
    for _ in probe.track(loader(n, wait_s), data_dir=data_dir):
        time.sleep(work_s)
    probe.mark_epoch()


def test_epoch_1_much_faster_for_want_of_data_waits_is_the_page_cache_warming(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "shard-0.bin").write_bytes(os.urandom(1 << 16))
    run_epoch(6, 0.05, data_dir=str(ds))  # cold: every read waits
    run_epoch(6, 0.002, data_dir=str(ds))  # warm
    h = page_cache_warming([snap(1.0)])
    assert h is not None and h.id == "training-page-cache-warming"
    p = probes_now().processes[0]
    assert h.numbers["epoch0_s"] == p.epochs[0].duration_s and h.numbers["epoch1_s"] == p.epochs[1].duration_s
    assert h.numbers["epoch0_wait_s"] == p.epochs[0].data_wait_s
    assert f"dltop warm {ds}" in h.fix  # not watched by dltop: how to warm it, and how to watch it
    # watched: the hint names the dataset row the Datasets tab's warm key acts on
    watched = page_cache_warming([snap(1.0, datasets=scan_paths((str(ds),)))])
    assert watched is not None and f"warm {ds} before training: w on its row in the Datasets tab" in watched.fix
    assert page_cache_warming in RULES


def test_no_warming_hint_when_the_epochs_match_or_the_time_went_elsewhere() -> None:
    run_epoch(5, 0.01)
    run_epoch(5, 0.01)
    assert page_cache_warming([snap(1.0)]) is None
    probe.state = probe._State()
    run_epoch(5, 0.002, work_s=0.05)  # epoch 0 slow in the step itself (compile, autotune): not the data
    run_epoch(5, 0.002)
    assert page_cache_warming([snap(1.0)]) is None


def _memory_window(busy_pct: float | None) -> list[MemoryPart]:
    """Two real memory readings 10 s apart (the recorded run's), the busiest disk's io_time set to `busy_pct`."""
    mems = [s.memory for s in load_session("training-session.jsonl") if isinstance(s.memory, MemoryPart)]
    first, last = mems[0], mems[-1]
    if busy_pct is None:
        return [first, last]
    assert isinstance(first.disks, tuple) and isinstance(last.disks, tuple)
    d0 = first.disks[0]
    busy = dataclasses.replace(last.disks[0], io_time_ms=d0.io_time_ms + int(busy_pct / 100 * 10_000))
    return [first, dataclasses.replace(last, disks=(busy, *last.disks[1:]))]


# A training job in its own process: a DataLoader with 2 workers over the shards in argv[1], each item read whole
# then "decoded" (a sleep of argv[3] s); argv[2] "cold" evicts the shards before every epoch (posix_fadvise
# DONTNEED), so each epoch reads them from storage. It says "ready" before the first epoch and "done" after.
JOB = r"""
import os, sys, time, torch
from dltop import probe
data_dir, cold, decode_s, epochs = sys.argv[1], sys.argv[2] == "cold", float(sys.argv[3]), int(sys.argv[4])
files = sorted(os.path.join(data_dir, n) for n in os.listdir(data_dir))

class Shards(torch.utils.data.Dataset):
    def __len__(self):
        return len(files)

    def __getitem__(self, i):
        with open(files[i], "rb") as f:
            n = len(f.read())
        time.sleep(decode_s)
        return torch.tensor(n)

loader = torch.utils.data.DataLoader(Shards(), batch_size=1, num_workers=2)
probe.start(interval_s=0.1)
print("ready", flush=True)
for _ in range(epochs):
    if cold:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    for _batch in probe.track(loader, data_dir=data_dir):
        pass
    probe.mark_epoch()
print("done", flush=True)
time.sleep(60)
"""
SHARDS, SHARD_BYTES = 16, 2 << 20


@pytest.fixture
def shards() -> Iterator[Path]:
    """16 shards of 2 MiB on a disk filesystem (read_bytes counts only what storage serves: tmpfs is always 0)."""
    d = Path(tempfile.mkdtemp(prefix="dltop-job-io-", dir="/var/tmp"))
    try:
        fs = subprocess.run(["stat", "-f", "-c", "%T", str(d)], capture_output=True, text=True).stdout.strip()
        if fs in ("tmpfs", "ramfs", "overlayfs"):
            pytest.skip(f"/var/tmp is {fs} here: no storage reads to count")
        for i in range(SHARDS):
            (d / f"shard-{i:02}.bin").write_bytes(os.urandom(SHARD_BYTES))
        os.sync()
        yield d
    finally:
        shutil.rmtree(d)


def _job_window(tmp_path: Path, data_dir: Path, temperature: str, decode_s: float, epochs: int) -> list[Snapshot]:
    """Snapshots every 0.25 s while a real JOB runs, each with its probe and its own reads read as the probes
    source reads them, and the machine's disks."""
    proc = subprocess.Popen([sys.executable, "-c", JOB, str(data_dir), temperature, str(decode_s), str(epochs)],
                            env=probe_env(tmp_path), cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.append(proc.stdout.readline()) if proc.stdout else None)
        reader.start()
        history: list[Snapshot] = []
        while reader.is_alive():
            part = with_job_reads(read_probes([(str(tmp_path / "dltop"), os.getuid())]))
            history.append(Snapshot(ts=time.time(), host="t", probes=part, memory=read_memory()))
            reader.join(0.25)
        assert said == ["done\n"]
        return [s for s in history if isinstance(s.probes, ProbesPart) and s.probes.processes]
    finally:
        proc.kill()
        proc.wait()


def _disk_loader(path: Path) -> subprocess.Popen[bytes]:
    """Another process loading the disk: `path` read again and again with O_DIRECT (never from the cache)."""
    return subprocess.Popen(["sh", "-c", f"while :; do dd if={path} of=/dev/null iflag=direct bs=1M status=none; done"])


def _read_bytes(pid: int) -> int:
    return read_io(pid)[0]


def test_a_decode_bound_job_on_warm_data_beside_a_job_loading_the_disk_is_decode_bound(
        tmp_path: Path, shards: Path) -> None:
    for f in shards.iterdir():
        f.read_bytes()  # warm: read once before
    big = shards.parent / f"{shards.name}-other.bin"
    big.write_bytes(os.urandom(64 << 20))
    os.sync()
    other = _disk_loader(big)
    try:
        before = _read_bytes(other.pid) + sum(_read_bytes(c) for c in children(other.pid) or [])
        history = _job_window(tmp_path, shards, "warm", 0.04, 6)
        # the other process fetched from storage all along (a dd each loop; its reaped children fold into it)
        assert _read_bytes(other.pid) - before >= 64 << 20
    finally:
        other.kill()
        other.wait()
        big.unlink()
    h = data_wait_high(history)
    p = history[-1].probes.processes[0]  # type: ignore[union-attr]
    assert p.io_processes is not None and p.io_processes >= 1
    assert h is not None and h.id == "training-decode-bound", h
    # Some bytes may come from storage all the same (on a loaded node, the workers' start pages torch's
    # libraries back in: 4 MiB of ~200 read in one CI run); the verdict is the share, and it is small.
    assert h.numbers["io_storage_share"] < IO_SHARE
    assert h.numbers["io_rchar_bytes"] > 0 and "more DataLoader workers than 2" in h.fix


def test_an_io_bound_job_on_cold_data_is_io_bound(tmp_path: Path, shards: Path) -> None:
    history = _job_window(tmp_path, shards, "cold", 0.0, 40)
    h = data_wait_high(history)
    assert h is not None and h.id == "training-io-bound", h
    assert h.numbers["io_storage_share"] >= IO_SHARE and h.numbers["io_read_bytes"] >= IO_MIN_BYTES
    assert "faster storage" in h.fix
    # the workers read the shards: the job's reads are theirs too (the main process only unpickles batches)
    p = history[-1].probes.processes[0]  # type: ignore[union-attr]
    assert p.io_read_bytes is not None and p.io_read_bytes >= SHARDS * SHARD_BYTES


def _with_reads(ts: float, read_bytes: int | None, rchar: int | None, why: str | None = None) -> Snapshot:
    """A Snapshot of this process's real probe, its reads counters set."""
    p = dataclasses.replace(probes_now().processes[0], io_read_bytes=read_bytes, io_rchar_bytes=rchar,
                            io_processes=None if read_bytes is None else 3, io_unavailable=why)
    return Snapshot(ts=ts, host="t", probes=ProbesPart(processes=(p,)))


def _wait_for_data() -> None:
    for _ in probe.track(loader(20, 0.01)):
        pass


def test_the_window_skips_a_pair_whose_counters_dropped() -> None:
    _wait_for_data()
    mib = 1 << 20
    # 0-10 s: 40 MiB from storage of 50 read; 10-20 s a worker gone before it was reaped (a drop): skipped;
    # 20-30 s: 10 MiB of 10 more
    history = [_with_reads(0.0, 0, 0), _with_reads(10.0, 40 * mib, 50 * mib), _with_reads(20.0, 10 * mib, 20 * mib),
               _with_reads(30.0, 20 * mib, 30 * mib)]
    h = data_wait_high(history)
    assert h is not None and h.id == "training-io-bound"
    assert h.numbers["io_read_bytes"] == 50 * mib and h.numbers["io_rchar_bytes"] == 60 * mib
    assert h.numbers["io_window_s"] == 20.0
    h = data_wait_high([_with_reads(0.0, 0, 0), _with_reads(10.0, 0, 500 * mib)])  # all from the page cache
    assert h is not None and h.id == "training-decode-bound" and h.numbers["io_storage_share"] == 0.0


def test_no_verdict_where_the_jobs_reads_are_unknown_unless_its_epoch_filled_the_cache() -> None:
    _wait_for_data()
    why = "/proc/4242/io: permission denied (another user's process: run dltop as root)"
    h = data_wait_high([_with_reads(0.0, None, None, why), _with_reads(10.0, None, None, why)])
    assert h is not None and h.id == "training-data-wait" and why in h.text and h.severity == "info"
    h = data_wait_high([_with_reads(0.0, 5, 5), _with_reads(10.0, None, None, why)])  # one reading: no delta
    assert h is not None and h.id == "training-data-wait"
    # unknown reads, but the job's last epoch brought 64 MiB of its own data into the page cache: from storage
    p = probes_now().processes[0]
    epoch = ProbeEpoch(index=0, started_at=1e9, ended_at=1e9 + 5, duration_s=5.0, data_wait_s=4.0, steps=20,
                       data_cached_delta_bytes=64 << 20, data_cached_source="cachestat: 16 files under data_dir")
    p = dataclasses.replace(p, epochs=(epoch,), io_unavailable=why)
    h = data_wait_high([Snapshot(ts=0.0, host="t", probes=ProbesPart(processes=(p,)))])
    assert h is not None and h.id == "training-io-bound" and h.numbers["data_cached_delta_bytes"] == 64 << 20


def test_the_recorded_run_has_no_verdict_without_the_jobs_reads() -> None:
    """train_tiny (an 8 ms decode in 2 workers) was recorded before dltop read /proc/PID/io: it waited ~95% of
    each step, and which way cannot be told now; the busiest disk is no longer the judge."""
    session = load_session("training-session.jsonl")
    h = data_wait_high(session)
    assert h is not None and h.id == "training-data-wait" and "older dltop" in h.text
    assert h in hints(session)


def test_no_data_wait_hint_for_a_loop_that_does_not_wait() -> None:
    for _ in probe.track(loader(20, 0.0)):
        time.sleep(0.005)
    first, last = _memory_window(90)
    assert data_wait_high([snap(0.0, memory=first), snap(10.0, memory=last)]) is None


def test_cudnn_benchmark_with_changing_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    for _ in probe.track(torch.zeros(2, n) for n in range(1, SHAPES_MANY + 2)):
        pass
    if not torch.backends.cudnn.is_available():  # CPU-only torch: benchmark does nothing, no hint (issue 18, 11)
        assert probe.report()["cudnn"] is None and cudnn_benchmark_shapes([snap(1.0)]) is None
        monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)  # as a CUDA build says
    h = cudnn_benchmark_shapes([snap(1.0)])
    assert h is not None and h.numbers["input_shapes"] == SHAPES_MANY + 1
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    assert cudnn_benchmark_shapes([snap(1.0)]) is None
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    probe.state = probe._State()
    for _ in probe.track(torch.zeros(4, 4) for _i in range(20)):
        pass
    assert cudnn_benchmark_shapes([snap(1.0)]) is None  # one shape: autotuned once


def test_torch_compile_recompiling_again_and_again() -> None:
    @torch.compile(backend="eager", dynamic=False)
    def double(x):
        return x * 2

    double(torch.zeros(1))
    before = snap(0.0)
    for n in range(2, 7):  # a new static shape each call: a recompile each
        double(torch.zeros(n))
    after = snap(30.0)
    h = recompiling([before, after])
    assert h is not None and h.numbers["recompiles_new"] == 5
    assert h.numbers["recompiles"] == after.probes.processes[0].compile["recompiles"]  # type: ignore[union-attr]
    assert recompiling([after, snap(40.0)]) is None  # none since: quiet


def test_torch_compile_at_its_recompile_limit_falls_back_to_eager_and_says_which(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    # dynamo's counters are the process's: this test counts only its own graph breaks
    monkeypatch.setitem(counters, "unimplemented", type(counters["unimplemented"])())
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)

    @torch.compile(backend="eager", dynamic=False)
    def triple(x):
        return x * 3

    triple(torch.zeros(1))
    before = snap(0.0)
    assert compile_fell_back_to_eager([before]) is None  # compiled once: within the limit
    for n in (2, 3):  # a new static shape: over the limit of 1, dynamo runs the frame eager from now on
        assert torch.equal(triple(torch.ones(n)), torch.full((n,), 3.0))
    after = snap(30.0)
    compiled = after.probes.processes[0].compile  # type: ignore[union-attr]
    assert compiled["eager_fallbacks"] == 1 and compiled["recompile_limit"] == 1
    h = compile_fell_back_to_eager([before, after])
    assert h is not None and h.numbers == {"pid": os.getpid(), "eager_fallbacks": 1, "recompile_limit": 1}
    assert "torch._dynamo.config.recompile_limit (1)" in h.text and "a frame run eager" in h.text
    assert "torch._dynamo.config.recompile_limit" in h.fix and "mark_dynamic" in h.fix
    assert any(r.__name__ == "compile_fell_back_to_eager" for r in RULES)


class Obj:
    def __init__(self, **attrs) -> None:
        self.__dict__.update(attrs)


class Cuda:
    """torch.cuda of a process whose allocator retries (this machine has no GPU)."""

    def __init__(self) -> None:
        self.stats = {"allocated_bytes.all.current": 1 << 30, "num_alloc_retries": 0, "num_ooms": 0}

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def memory_stats(self, index: int) -> dict[str, int]:
        return dict(self.stats)

    def get_device_properties(self, index: int):
        return Obj(uuid="5e3c1a7e-0000-0000-0000-000000000000")


def test_allocator_retries_and_ooms_rising(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = Cuda()
    monkeypatch.setitem(sys.modules, "torch", Obj(cuda=cuda, __version__="2.13.0+cu130"))
    first = snap(0.0)
    assert oom_retries_rising([first, snap(5.0)]) is None
    cuda.stats["num_alloc_retries"] = 7
    h = oom_retries_rising([first, snap(10.0)])
    assert h is not None and h.id == "training-num-alloc-retries" and h.numbers["num_alloc_retries_new"] == 7
    cuda.stats["num_ooms"] = 1
    h = oom_retries_rising([first, snap(20.0)])
    assert h is not None and h.id == "training-num-ooms" and h.severity == "critical"


def test_a_loop_that_stopped_stepping_is_stalled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop that made steps and then none for longer than the stall time: a hint names it (issue 18, item 7);
    while it steps, none."""
    monkeypatch.setattr(probes_model, "STALL_MIN_S", 0.5)
    it = probe.track(loader(4, 0.0))
    for _ in range(3):
        next(it)  # the loop is inside its epoch, at step 3
    assert stalled([snap(1.0)]) is None
    time.sleep(0.6)  # at least the stall time without a step (each took far less: 20 of them are not longer)
    h = stalled([snap(2.0)])
    assert h is not None and h.id == "training-stalled" and h.numbers["pid"] == os.getpid()
    assert h.subject == f"job pid {os.getpid()}"  # what m in ? mutes it for: this job
    assert h.numbers["last_step_age_s"] >= 0.6 and "stalled" in h.text and "py-spy dump" in h.fix


def test_the_rules_see_the_last_minute_of_a_long_history() -> None:
    from dltop.hints import WINDOW_S, window

    # the TUI keeps 600 Snapshots; at a 1 s refresh the rules see the 61 of the last 60 s, and in the
    # first minute all of them; at a refresh of 7 s the ones at or after the newest's time less 60 s
    for step, kept in ((1.0, 600), (1.0, 30), (7.0, 600), (0.25, 600)):
        history = [Snapshot(ts=1000.0 + i * step, host="h") for i in range(kept)]
        got = window(history)
        since = history[-1].ts - WINDOW_S
        assert list(got) == [s for s in history if s.ts >= since], (step, kept)
        assert got[-1] is history[-1]
    one = [Snapshot(ts=5.0, host="h")]
    assert window(one) == one and window([]) == []
