"""Rates and hints from pairs of real readings."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from dltop.derive import disk_rates, memory_rates, vm_rates
from dltop.hints import hints
from dltop.hints.memory import page_cache_squeeze
from dltop.model import MemoryPart, Pressure, Snapshot, Unavailable, VmStat
from dltop.model.memory import CgroupMemory
from dltop.sources.memory import read_disks, read_memory, read_vmstat


def test_real_direct_write_shows_in_disk_rates(tmp_path: Path) -> None:
    before = read_disks("/")
    t0 = time.monotonic()
    path = tmp_path / "direct.bin"
    # O_DIRECT bypasses the page cache, so the bytes reach the disk now, not at writeback time.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    import mmap

    buf = mmap.mmap(-1, 1 << 20)
    buf.write(b"x" * (1 << 20))
    try:
        for _ in range(32):
            os.write(fd, buf)
    finally:
        os.close(fd)
    after = read_disks("/")
    dt = time.monotonic() - t0
    assert not isinstance(before, Unavailable) and not isinstance(after, Unavailable)
    rates = disk_rates(before, after, dt)
    written = max(round(r.write_bytes_per_s * dt) for r in rates)  # rate × dt: float rounding
    assert written >= 32 << 20
    busiest = max(rates, key=lambda r: r.write_bytes_per_s)
    assert busiest.writes_per_s > 0 and busiest.await_ms is not None and 0 <= busiest.util_pct <= 100


def test_disk_rates_follow_iostat_formulas() -> None:
    disks = read_disks("/")
    assert not isinstance(disks, Unavailable) and disks
    a = disks[0]
    b = replace(a, reads=a.reads + 100, writes=a.writes + 50, sectors_read=a.sectors_read + 2048 * 10,
                read_time_ms=a.read_time_ms + 300, write_time_ms=a.write_time_ms + 150, io_time_ms=a.io_time_ms + 500)
    (r,) = disk_rates([a], [b], 2.0)
    assert r.reads_per_s == 50 and r.writes_per_s == 25
    assert r.read_bytes_per_s == 10 * 2**20 / 2  # 2048 sectors = 1 MiB
    assert r.await_ms == 450 / 150
    assert r.util_pct == 25.0


def test_counter_reset_gives_no_rate() -> None:
    vm = read_vmstat("/")
    assert isinstance(vm, VmStat) and vm.pgmajfault is not None
    later = replace(vm, pgmajfault=0)
    assert vm_rates(vm, later, 1.0).major_faults_per_s is None
    assert vm_rates(vm, vm, 0.0).refaults_per_s is None


def test_memory_rates_between_recorded_snapshots(session: list[Snapshot]) -> None:
    vm, disks = memory_rates(session[0], session[-1])
    assert vm is not None and vm.page_out_bytes_per_s is not None
    m0, m1 = session[0].memory, session[-1].memory
    assert isinstance(m0, MemoryPart) and isinstance(m1, MemoryPart)
    assert isinstance(m0.vmstat, VmStat) and isinstance(m1.vmstat, VmStat)
    dt = session[-1].ts - session[0].ts
    assert vm.page_out_bytes_per_s == (m1.vmstat.pgpgout - m0.vmstat.pgpgout) * 1024 / dt  # type: ignore[operator]
    assert disks and memory_rates(None, session[0]) == (None, [])


def _squeezed(base: MemoryPart, avg10: float, avg60: float) -> MemoryPart:
    assert base.total_bytes
    total = base.total_bytes
    return replace(base, available_bytes=total // 25, cached_bytes=total // 2, shmem_bytes=total // 3,
                   pressure_memory=Pressure(avg10, avg60, 0.5, 123456))


def _snap(ts: float, m: MemoryPart) -> Snapshot:
    return Snapshot(ts=ts, host="h", memory=m)


def test_page_cache_squeeze_hint_fires_on_rising_pressure() -> None:
    base = read_memory("/")
    history = [_snap(0, _squeezed(base, 2.0, 1.0)), _snap(1, _squeezed(base, 8.0, 2.0))]
    h = page_cache_squeeze(history)
    assert h is not None and h.severity == "critical"
    assert "OOM-killed" in h.text and "Shmem" in h.fix
    assert hints(history)[0].id == "page-cache-squeeze"


def test_page_cache_squeeze_quiet_when_memory_is_fine_or_calm() -> None:
    base = read_memory("/")
    calm = [_snap(0, _squeezed(base, 0.0, 0.0))]
    assert page_cache_squeeze(calm) is None
    falling = [_snap(0, _squeezed(base, 9.0, 9.5)), _snap(1, _squeezed(base, 3.0, 9.0))]
    assert page_cache_squeeze(falling) is None
    plenty = [_snap(0, replace(_squeezed(base, 8.0, 1.0), available_bytes=base.total_bytes))]
    assert page_cache_squeeze(plenty) is None
    no_psi = [_snap(0, replace(_squeezed(base, 8.0, 1.0), pressure_memory=Unavailable("no PSI")))]
    assert page_cache_squeeze(no_psi) is None


def test_cgroup_near_limit_hint() -> None:
    base = read_memory("/")
    cg = CgroupMemory(path="/job", current_bytes=95, max_bytes=100, file_bytes=40)
    found = hints([_snap(0, replace(base, cgroup=cg))])
    assert any(h.id == "cgroup-near-limit" and "95%" in h.text for h in found)
    assert not any(h.id == "cgroup-near-limit" for h in hints([_snap(0, replace(base, cgroup=replace(cg, current_bytes=50)))]))
