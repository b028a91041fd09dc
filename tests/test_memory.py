"""The memory source against this machine's real /proc text, captured trees with parts missing, and generated text."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from dltop.model import MemoryPart, Pressure, Unavailable, VmStat
from dltop.sources.memory import (
    MEMINFO_FIELDS,
    parse_diskstats,
    parse_meminfo,
    parse_pressure,
    parse_proc_cgroup,
    parse_vmstat,
    read_cgroup_memory,
    read_disks,
    read_memory,
    read_pressure,
)


def test_meminfo_agrees_with_free(proc_root: Path) -> None:
    m = read_memory(str(proc_root))
    assert m.unavailable == {}
    # `free -b` reads the same file: its total must be ours to the byte.
    out = subprocess.run(["free", "-b"], capture_output=True, text=True, check=True).stdout
    total = int(out.splitlines()[1].split()[1])
    assert m.total_bytes == total
    text = (proc_root / "proc/meminfo").read_text()
    for field, key in MEMINFO_FIELDS.items():
        kb = int(re.search(rf"^{re.escape(key)}:\s+(\d+) kB$", text, re.M).group(1))  # type: ignore[union-attr]
        assert getattr(m, field) == kb * 1024


def test_vmstat_pressure_and_disks_from_real_files(proc_root: Path) -> None:
    m = read_memory(str(proc_root))
    assert isinstance(m.vmstat, VmStat)
    raw = parse_vmstat((proc_root / "proc/vmstat").read_text())
    assert m.vmstat.pgmajfault == raw["pgmajfault"]
    assert m.vmstat.pgscan == sum(raw.get(k, 0) for k in ("pgscan_kswapd", "pgscan_direct", "pgscan_khugepaged"))
    assert isinstance(m.pressure_io, Pressure)
    assert m.pressure_io.full_total_us is not None
    assert not isinstance(m.disks, Unavailable)
    names = {d.name for d in m.disks}
    # Only whole disks with I/O: every name is in /sys/block, no partition like vda1 appears.
    assert names and names <= set(os.listdir("/sys/block"))


def test_missing_fields_have_reasons(proc_root: Path) -> None:
    meminfo = proc_root / "proc/meminfo"
    lines = [ln for ln in meminfo.read_text().splitlines() if not ln.startswith(("MemAvailable", "Mlocked"))]
    meminfo.write_text("\n".join(lines) + "\n")
    m = read_memory(str(proc_root))
    assert m.available_bytes is None and m.mlocked_bytes is None
    assert "MemAvailable" in m.unavailable["available_bytes"]
    assert m.total_bytes is not None


def test_truncated_meminfo_keeps_what_it_has(proc_root: Path) -> None:
    meminfo = proc_root / "proc/meminfo"
    text = meminfo.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("Cached:"))
    # Cut inside the number, before " kB": the digits that are left must not be read as bytes.
    meminfo.write_text(text[: text.index(line) + len(line) - 5])
    m = read_memory(str(proc_root))
    assert m.total_bytes is not None
    assert m.cached_bytes is None and "Cached" in m.unavailable["cached_bytes"]


def test_missing_proc_files(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    m = read_memory(str(tmp_path))
    assert m.total_bytes is None
    assert "not found" in m.unavailable["total_bytes"]
    assert isinstance(m.vmstat, Unavailable) and isinstance(m.disks, Unavailable)
    assert isinstance(m.pressure_memory, Unavailable)
    assert "PSI" in m.pressure_memory.reason


def test_unreadable_file_is_a_reason_not_a_crash(proc_root: Path) -> None:
    # A directory where a file should be gives EISDIR even to root.
    (proc_root / "proc/vmstat").unlink()
    (proc_root / "proc/vmstat").mkdir()
    m = read_memory(str(proc_root))
    assert isinstance(m.vmstat, Unavailable)
    assert "cannot read" in m.vmstat.reason


def test_kernel_without_psi(proc_root: Path) -> None:
    for f in (proc_root / "proc/pressure").iterdir():
        f.unlink()
    (proc_root / "proc/pressure").rmdir()
    p = read_pressure(str(proc_root), "memory")
    assert isinstance(p, Unavailable) and "no PSI" in p.reason


def test_malformed_pressure(proc_root: Path) -> None:
    (proc_root / "proc/pressure/io").write_text("some avg10=x avg60=0.00 avg300=0.00 total=1\n")
    assert isinstance(read_pressure(str(proc_root), "io"), Unavailable)


def test_pressure_without_full_line_as_on_old_kernels() -> None:
    text = Path("/proc/pressure/memory").read_text().splitlines()[0] + "\n"
    p = parse_pressure(text)
    assert p.full_avg10 is None and p.some_total_us >= 0


def test_real_cgroup_of_this_process() -> None:
    cg = read_cgroup_memory("/", os.getpid())
    rel = parse_proc_cgroup(Path(f"/proc/{os.getpid()}/cgroup").read_text())
    if rel in (None, "/"):
        assert isinstance(cg, Unavailable)
        return
    assert not isinstance(cg, Unavailable)
    assert cg.current_bytes == int(Path("/sys/fs/cgroup", rel.lstrip("/"), "memory.current").read_text())


def _fake_cgroup_root(tmp_path: Path, cgroup_line: str, files: dict[str, str]) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup_line)
    base = tmp_path / "sys/fs/cgroup/job.slice/job_42"
    base.mkdir(parents=True)
    for name, text in files.items():
        (base / name).write_text(text)
    return tmp_path


def test_cgroup_v2_job(tmp_path: Path) -> None:
    # memory.stat and memory.events from this machine's root-level files where present, with a limit set.
    stat = "anon 1000\nfile 4096000\nfile_dirty 8192\n"
    root = _fake_cgroup_root(tmp_path, "0::/job.slice/job_42\n", {
        "memory.current": "5000000\n", "memory.max": "8000000\n", "memory.stat": stat,
        "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
    })
    cg = read_cgroup_memory(str(root))
    assert not isinstance(cg, Unavailable)
    assert (cg.current_bytes, cg.max_bytes, cg.file_bytes, cg.file_dirty_bytes, cg.oom_kill) == (
        5000000, 8000000, 4096000, 8192, 1)


def test_cgroup_without_limit_says_so(tmp_path: Path) -> None:
    root = _fake_cgroup_root(tmp_path, "0::/job.slice/job_42\n", {"memory.current": "5\n", "memory.max": "max\n"})
    cg = read_cgroup_memory(str(root))
    assert not isinstance(cg, Unavailable)
    assert cg.max_bytes is None and cg.unavailable["max_bytes"] == "max"
    assert "memory.stat" in cg.unavailable["file_bytes"]


def test_cgroup_v1_only(tmp_path: Path) -> None:
    root = _fake_cgroup_root(tmp_path, "12:memory:/job.slice\n11:cpu,cpuacct:/job.slice\n", {})
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, Unavailable) and "cgroup v1" in cg.reason


def test_cgroup_of_vanished_process() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    cg = read_cgroup_memory("/", proc.pid)
    assert isinstance(cg, Unavailable) and str(proc.pid) in cg.reason


def test_disk_partitions_and_idle_loops_left_out(proc_root: Path) -> None:
    rows = parse_diskstats(Path("/proc/diskstats").read_text())
    disks = read_disks(str(proc_root))
    assert not isinstance(disks, Unavailable)
    kept = {d.name for d in disks}
    for r in rows:
        if r.name in kept:
            assert (r.reads or r.writes) and os.path.isdir(f"/sys/block/{r.name}")


# ---- properties: parsers take any text someone else wrote --------------------------------------------------

keys = st.from_regex(r"[A-Za-z][A-Za-z_()]{0,20}", fullmatch=True)


@given(st.dictionaries(keys, st.integers(0, 2**50)))
def test_meminfo_roundtrip(values: dict[str, int]) -> None:
    text = "".join(f"{k}:{' ' * 8}{v} kB\n" for k, v in values.items())
    assert parse_meminfo(text) == {k: v * 1024 for k, v in values.items()}


@given(st.text())
@example("pgpgin ¹\nMemTotal: ² kB\n")  # digits that str.isdigit() accepts and int() refuses
def test_parsers_never_raise_on_garbage(text: str) -> None:
    assert isinstance(parse_meminfo(text), dict)
    assert isinstance(parse_vmstat(text), dict)
    assert isinstance(parse_diskstats(text), list)
    parse_proc_cgroup(text)
    with contextlib.suppress(ValueError):
        parse_pressure(text)


avg = st.floats(0, 100, allow_nan=False).map(lambda x: round(x, 2))


@given(avg, avg, avg, st.integers(0, 2**62), st.one_of(st.none(), st.tuples(avg, avg, avg, st.integers(0, 2**62))))
def test_pressure_roundtrip(a10: float, a60: float, a300: float, total: int, full: tuple | None) -> None:
    text = f"some avg10={a10:.2f} avg60={a60:.2f} avg300={a300:.2f} total={total}\n"
    if full:
        text += f"full avg10={full[0]:.2f} avg60={full[1]:.2f} avg300={full[2]:.2f} total={full[3]}\n"
    p = parse_pressure(text)
    assert (p.some_avg10, p.some_avg60, p.some_avg300, p.some_total_us) == (a10, a60, a300, total)
    assert (p.full_total_us is None) == (full is None)


@given(st.lists(st.tuples(st.from_regex(r"[a-z]{2,6}[0-9]{0,2}", fullmatch=True),
                          st.lists(st.integers(0, 2**40), min_size=11, max_size=17)), max_size=8))
def test_diskstats_roundtrip(rows: list[tuple[str, list[int]]]) -> None:
    text = "".join(f"   8       0 {name} {' '.join(map(str, nums))}\n" for name, nums in rows)
    parsed = parse_diskstats(text)
    assert [(d.name, d.reads, d.sectors_written, d.io_time_ms) for d in parsed] == [
        (name, nums[0], nums[6], nums[9]) for name, nums in rows
    ]


def test_memory_part_is_plain_data(proc_root: Path) -> None:
    m = read_memory(str(proc_root))
    assert isinstance(m, MemoryPart)
    assert all(isinstance(getattr(m, f), int) for f in MEMINFO_FIELDS)
