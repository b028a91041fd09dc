"""Training hints on Snapshots whose probes part is real probe output (the probe run in this process over real
loaders and real torch, read back through sources/probes.py), and whose memory part is a real reading (the
recorded train_tiny session), edited only where a disk must be busy."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dltop.probe as probe
from dltop.hints import RULES, hints
from dltop.hints.training import (
    DISK_BUSY_PCT,
    SHAPES_MANY,
    cudnn_benchmark_shapes,
    data_wait_high,
    oom_retries_rising,
    page_cache_warming,
    recompiling,
    stalled,
)
from dltop.model import MemoryPart, Snapshot
from dltop.model import probes as probes_model
from dltop.model.probes import ProbesPart
from dltop.sources.datasets import scan_paths
from dltop.sources.probes import parse_probe
from tests.conftest import load_session

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, the test extra)")


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(probe, "_state", probe._State())


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
    probe._state = probe._State()
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


def test_data_wait_high_with_a_busy_disk_is_io_bound_and_with_idle_disks_decode_bound() -> None:
    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int):
            time.sleep(0.008)
            return torch.zeros(3)

    for _ in probe.track(torch.utils.data.DataLoader(Slow(), batch_size=4, num_workers=0)):
        pass
    first, last = _memory_window(DISK_BUSY_PCT + 20)
    h = data_wait_high([snap(0.0, memory=first), snap(10.0, memory=last)])
    assert h is not None and h.id == "training-io-bound" and h.numbers["disk_util_pct"] == pytest.approx(80, abs=0.01)
    assert "more workers only queue more reads" in h.fix
    first, last = _memory_window(5)
    h = data_wait_high([snap(0.0, memory=first), snap(10.0, memory=last)])
    assert h is not None and h.id == "training-decode-bound" and "more DataLoader workers than 0" in h.fix
    assert h.numbers["data_wait_fraction"] == probes_now().processes[0].data_wait_fraction
    # without the disks' load the two cannot be told apart: no hint
    assert data_wait_high([snap(0.0), snap(10.0)]) is None


def test_the_recorded_run_is_decode_bound() -> None:
    """train_tiny with an 8 ms decode in 2 workers waited ~95% of each step while its disk idled."""
    session = load_session("training-session.jsonl")
    h = data_wait_high(session)
    assert h is not None and h.id == "training-decode-bound" and h.numbers["loader_workers"] == 2
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
    probe._state = probe._State()
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
    assert h.numbers["last_step_age_s"] >= 0.6 and "stalled" in h.text and "py-spy dump" in h.fix
