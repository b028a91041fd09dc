"""The memory source against this machine's real /proc text, captured trees with parts missing, and generated text."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from dltop.model import CgroupMemory, MemoryPart, Pressure, Unavailable, VmStat
from dltop.sources.memory import (
    CGROUP_DIR_KEEP_S,
    MEMINFO_FIELDS,
    CgroupDirs,
    _cgroup_dir,
    parse_cgroup_mounts,
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
from tests.conftest import REPO, capture_proc, write_cgroup_tree

GIB = 1 << 30


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


# /proc/self/cgroup and /proc/self/mountinfo as the kernel writes them on the three kinds of host: a v1 Slurm node
# (CentOS 7), a systemd "hybrid" host (v2 mounted at /sys/fs/cgroup/unified beside v1 controllers, Ubuntu 20.04
# and this project's own CI machine) and a v2-only host.
V1_TASK = "/slurm/uid_1000/job_42/step_0/task_0"
V1_CGROUP = f"""11:memory:{V1_TASK}
10:cpuset:/slurm/uid_1000/job_42/step_0
9:cpu,cpuacct:/slurm/uid_1000/job_42/step_0
1:name=systemd:/system.slice/slurmd.service
"""
V1_MOUNTINFO = """19 41 0:18 / /sys rw,nosuid,nodev,noexec,relatime shared:6 - sysfs sysfs rw,seclabel
25 19 0:21 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,seclabel,mode=755
26 25 0:22 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,seclabel,xattr,name=systemd
32 25 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,seclabel,memory
33 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,seclabel,cpu,cpuacct
"""
HYBRID_SCOPE = "/user.slice/user-1000.slice/session-3.scope"
HYBRID_CGROUP = f"""12:memory:{HYBRID_SCOPE}
4:cpu,cpuacct:{HYBRID_SCOPE}
1:name=systemd:{HYBRID_SCOPE}
0::{HYBRID_SCOPE}
"""
HYBRID_MOUNTINFO = """31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:30 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
40 31 0:37 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,memory
"""
V2_JOB = "/system.slice/slurmstepd.scope/job_7"
V2_MOUNTINFO = "27 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_NO_LIMIT = "9223372036854771712\n"  # what v1 shows for "no limit" with 4 KiB pages


def v1_stat(cache: int, dirty: int, hier_limit: int | str = 9223372036854771712) -> str:
    """memory.stat of a v1 cgroup, the keys in the kernel's order."""
    return (f"cache {cache // 2}\nrss 104857600\nrss_huge 0\nshmem 0\nmapped_file 0\ndirty {dirty // 2}\n"
            f"writeback 0\npgpgin 1000\npgpgout 900\npgfault 5000\npgmajfault 3\n"
            f"hierarchical_memory_limit {hier_limit}\nhierarchical_memsw_limit 9223372036854771712\n"
            f"total_cache {cache}\ntotal_rss 209715200\ntotal_dirty {dirty}\ntotal_writeback 0\n")


def v1_tree(root: Path, limit: str, stat: str, cgroup: str = V1_CGROUP, mountinfo: str | None = V1_MOUNTINFO,
            rel: str = V1_TASK) -> Path:
    base = f"sys/fs/cgroup/memory{rel}"
    return write_cgroup_tree(root, cgroup, mountinfo, {
        f"{base}/memory.limit_in_bytes": limit, f"{base}/memory.usage_in_bytes": "3221225472\n",
        f"{base}/memory.stat": stat, f"{base}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
    })


def test_cgroup_v1_job(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, f"{8 * GIB}\n", v1_stat(GIB, 8192, 8 * GIB))
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory), cg
    assert (cg.version, cg.path, cg.current_bytes, cg.max_bytes, cg.file_bytes, cg.file_dirty_bytes, cg.oom_kill) == (
        1, V1_TASK, 3 * GIB, 8 * GIB, GIB, 8192, 2)
    assert not cg.no_limit and cg.unavailable == {}


def test_cgroup_v1_limit_set_on_the_job_binds_its_task(tmp_path: Path) -> None:
    # Slurm sets the limit on job_42; task_0 itself has none, and the kernel says so in hierarchical_memory_limit.
    root = v1_tree(tmp_path, V1_NO_LIMIT, v1_stat(GIB, 0, 16 * GIB))
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory) and cg.max_bytes == 16 * GIB and not cg.no_limit


def test_cgroup_v1_without_limit_says_no_limit(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, V1_NO_LIMIT, v1_stat(GIB, 0))
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory)
    assert cg.version == 1 and cg.max_bytes is None and cg.no_limit
    assert cg.unavailable["max_bytes"] == "no limit (memory.limit_in_bytes is 9223372036854771712)"


def test_cgroup_v1_unreadable_limit_is_not_no_limit(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, "", v1_stat(GIB, 0))
    limit = root / f"sys/fs/cgroup/memory{V1_TASK}/memory.limit_in_bytes"
    limit.unlink()
    limit.mkdir()  # EISDIR, even for root: the read fails as a permission problem would
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory)
    assert cg.max_bytes is None and not cg.no_limit and cg.current_bytes == 3 * GIB
    assert cg.unavailable["max_bytes"].startswith("limit not read (cannot read memory.limit_in_bytes")
    limit.rmdir()
    limit.write_text("-1\n")  # not a count: never taken as a limit, nor as none
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory) and not cg.no_limit
    assert cg.unavailable["max_bytes"] == "limit not read (memory.limit_in_bytes holds '-1', not a number)"


def test_cgroup_v1_hierarchy_not_mounted(tmp_path: Path) -> None:
    no_memory = "".join(ln + "\n" for ln in V1_MOUNTINFO.splitlines() if not ln.endswith(",memory"))
    root = v1_tree(tmp_path, f"{8 * GIB}\n", v1_stat(GIB, 0), mountinfo=no_memory)
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, Unavailable)
    assert cg.reason.startswith("cgroup v1: limit not read (no cgroup v1 with the memory controller mounted")


def test_cgroup_v1_in_a_container_sees_its_own_part_of_the_tree(tmp_path: Path) -> None:
    # Docker on v1 bind-mounts the container's cgroup as /sys/fs/cgroup/memory: mount root /docker/ID.
    cid = "/docker/3f1c9a"
    mountinfo = f"700 690 0:37 {cid} /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:18 - cgroup cgroup rw,memory\n"
    root = write_cgroup_tree(tmp_path, f"12:memory:{cid}\n0::/\n", mountinfo, {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{4 * GIB}\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{GIB}\n",
        "sys/fs/cgroup/memory/memory.stat": v1_stat(GIB // 2, 0, 4 * GIB),
    })
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory) and (cg.path, cg.max_bytes, cg.current_bytes) == (cid, 4 * GIB, GIB)


def test_hybrid_host_reads_the_v1_memory_controller(tmp_path: Path) -> None:
    # The unified (v2) hierarchy has the session's folder but no memory controller; v1 holds it.
    base = f"sys/fs/cgroup/memory{HYBRID_SCOPE}"
    root = write_cgroup_tree(tmp_path, HYBRID_CGROUP, HYBRID_MOUNTINFO, {
        f"sys/fs/cgroup/unified{HYBRID_SCOPE}/cgroup.procs": "1234\n",
        f"{base}/memory.limit_in_bytes": f"{6 * GIB}\n", f"{base}/memory.usage_in_bytes": f"{2 * GIB}\n",
        f"{base}/memory.stat": v1_stat(GIB, 4096, 6 * GIB),
    })
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory), cg
    assert (cg.version, cg.path, cg.max_bytes, cg.current_bytes, cg.file_bytes) == (
        1, HYBRID_SCOPE, 6 * GIB, 2 * GIB, GIB)
    assert "oom_control" in cg.unavailable["oom_kill"]  # a kernel before 4.13 has no oom_kill there: says so


def test_real_cgroup_of_this_process() -> None:
    cg = read_cgroup_memory("/", os.getpid())
    found = parse_proc_cgroup(Path(f"/proc/{os.getpid()}/cgroup").read_text())
    assert found is not None
    version, rel = found
    if isinstance(cg, Unavailable):
        assert cg.reason.startswith(f"cgroup v{version}: ")
        return
    assert cg.version == version and cg.path == rel
    base = Path(_cgroup_dir("/", version, rel)[0])  # found as the source finds it (tested on trees above)
    usage = "memory.usage_in_bytes" if version == 1 else "memory.current"
    # Usage moves while the test runs; the limit and its unit do not.
    assert abs(cg.current_bytes - int((base / usage).read_text())) < 64 << 20  # type: ignore[operator]
    limit = (base / ("memory.limit_in_bytes" if version == 1 else "memory.max")).read_text().strip()
    if cg.no_limit:
        assert limit == "max" or int(limit) >= 1 << 62
    elif version == 2:
        assert cg.max_bytes == int(limit)


def test_snapshot_json_names_the_cgroup_version(tmp_path: Path) -> None:
    root = v1_tree(capture_proc(tmp_path / "root"), f"{8 * GIB}\n", v1_stat(GIB, 0, 8 * GIB))
    out = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json", "--root", str(root)],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    cg = json.loads(out)["memory"]["cgroup"]
    assert (cg["version"], cg["max_bytes"], cg["path"]) == (1, 8 * GIB, V1_TASK)


def _fake_cgroup_root(tmp_path: Path, cgroup_line: str, files: dict[str, str]) -> Path:
    base = "sys/fs/cgroup/job.slice/job_42"
    return write_cgroup_tree(tmp_path, cgroup_line, V2_MOUNTINFO, {f"{base}/{k}": v for k, v in files.items()})


def test_cgroup_v2_job(tmp_path: Path) -> None:
    stat = "anon 1000\nfile 4096000\nfile_dirty 8192\n"
    root = _fake_cgroup_root(tmp_path, "0::/job.slice/job_42\n", {
        "memory.current": "5000000\n", "memory.max": "8000000\n", "memory.stat": stat,
        "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
    })
    cg = read_cgroup_memory(str(root))
    assert not isinstance(cg, Unavailable)
    assert (cg.version, cg.current_bytes, cg.max_bytes, cg.file_bytes, cg.file_dirty_bytes, cg.oom_kill) == (
        2, 5000000, 8000000, 4096000, 8192, 1)


def test_cgroup_v2_limit_set_on_the_job_binds_its_step(tmp_path: Path) -> None:
    # Slurm on v2: the job's cgroup carries memory.max, the step the process runs in has none ("max").
    # The job's usage (all its steps) is what the limit is held against: that is what must be shown.
    job = "sys/fs/cgroup/system.slice/slurmstepd.scope/job_42"
    root = write_cgroup_tree(tmp_path, "0::/system.slice/slurmstepd.scope/job_42/step_0\n", V2_MOUNTINFO, {
        f"{job}/memory.max": f"{4 * GIB}\n", f"{job}/memory.current": f"{3 * GIB}\n",
        f"{job}/memory.stat": f"anon {GIB}\nfile {2 * GIB}\nfile_dirty 0\n",
        f"{job}/step_0/memory.max": "max\n", f"{job}/step_0/memory.current": f"{GIB}\n",
        "sys/fs/cgroup/system.slice/memory.max": "max\n",
    })
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory) and not cg.no_limit
    assert (cg.path, cg.limit_path) == ("/system.slice/slurmstepd.scope/job_42/step_0",
                                        "/system.slice/slurmstepd.scope/job_42")
    assert (cg.max_bytes, cg.current_bytes, cg.file_bytes) == (4 * GIB, 3 * GIB, 2 * GIB)
    from dltop.model.memory import cgroup_room_bytes

    room = cgroup_room_bytes(cg)  # the guard counts the job's anon memory, not the step's
    assert room is not None and room[0] == 4 * GIB - GIB - min(max(4 * GIB // 10, 64 << 20), 1 << 30)
    # A lower limit on the step itself binds instead.
    (root / job / "step_0/memory.max").write_text(f"{2 * GIB}\n")
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory) and cg.limit_path is None and cg.max_bytes == 2 * GIB


def test_cgroup_v2_found_without_mountinfo(tmp_path: Path) -> None:
    # A captured tree without proc/self/mountinfo: v2 is looked for where it is mounted everywhere.
    root = _fake_cgroup_root(tmp_path, "0::/job.slice/job_42\n", {"memory.current": "5\n", "memory.max": "9\n"})
    (root / "proc/self/mountinfo").unlink()
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory) and cg.max_bytes == 9


def test_cgroup_without_limit_says_so(tmp_path: Path) -> None:
    root = _fake_cgroup_root(tmp_path, "0::/job.slice/job_42\n", {"memory.current": "5\n", "memory.max": "max\n"})
    cg = read_cgroup_memory(str(root))
    assert not isinstance(cg, Unavailable)
    assert cg.max_bytes is None and cg.no_limit and cg.unavailable["max_bytes"] == "no limit (memory.max is max)"
    assert "memory.stat" in cg.unavailable["file_bytes"]


def test_cgroup_v2_malformed_limit_is_not_no_limit(tmp_path: Path) -> None:
    root = _fake_cgroup_root(tmp_path, "0::/job.slice/job_42\n", {"memory.current": "5\n", "memory.max": "ma\n"})
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory) and not cg.no_limit
    assert cg.unavailable["max_bytes"] == "limit not read (memory.max holds 'ma', not a number)"


def test_cgroup_v2_in_a_cgroup_namespace_is_read_not_called_root(tmp_path: Path) -> None:
    # Docker on v2 gives the container its own cgroup namespace: it sees "0::/" and its own memory.max.
    root = write_cgroup_tree(tmp_path, "0::/\n", V2_MOUNTINFO, {
        "sys/fs/cgroup/memory.max": f"{2 * GIB}\n", "sys/fs/cgroup/memory.current": f"{GIB}\n"})
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, CgroupMemory) and cg.max_bytes == 2 * GIB
    (root / "sys/fs/cgroup/memory.max").unlink()  # the host's real root cgroup has no memory.max
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, Unavailable) and cg.reason.startswith("cgroup v2: dltop runs in the root cgroup")


def test_no_memory_cgroup_at_all(tmp_path: Path) -> None:
    root = write_cgroup_tree(tmp_path, "11:cpu,cpuacct:/job.slice\n", V1_MOUNTINFO, {})
    cg = read_cgroup_memory(str(root))
    assert isinstance(cg, Unavailable) and "neither a v1 memory hierarchy nor cgroup v2" in cg.reason


def test_cgroup_of_vanished_process() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    cg = read_cgroup_memory("/", proc.pid)
    assert isinstance(cg, Unavailable) and str(proc.pid) in cg.reason


def test_disk_partitions_and_idle_loops_left_out(proc_root: Path) -> None:
    rows, bad = parse_diskstats(Path("/proc/diskstats").read_text())
    assert rows and bad == []
    disks = read_disks(str(proc_root))
    assert not isinstance(disks, Unavailable)
    kept = {d.name for d in disks}
    for r in rows:
        if r.name in kept:
            assert (r.reads or r.writes) and os.path.isdir(f"/sys/block/{r.name}")


def test_diskstats_with_no_good_line_is_unavailable_not_idle(proc_root: Path) -> None:
    # A read cut short inside the first line: before, `disks: []` and "no disk I/O yet" forever.
    path = proc_root / "proc/diskstats"
    first = path.read_text().splitlines()[0]
    path.write_text(first[: len(first) // 3] + "\n")
    m = read_memory(str(proc_root))
    assert isinstance(m.disks, Unavailable)
    assert m.disks.reason.startswith("malformed /proc/diskstats: line 1: ")
    assert "fields, a device has 14 or more" in m.disks.reason


def test_diskstats_bad_line_is_reported_and_the_good_ones_kept(proc_root: Path) -> None:
    path = proc_root / "proc/diskstats"
    good = read_disks(str(proc_root))
    assert not isinstance(good, Unavailable) and good
    lines = path.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.split()[2] == good[0].name)
    f = lines[at].split()
    f[5] = f[5] + "x"  # sectors read, damaged
    lines[at] = " ".join(f)
    path.write_text("\n".join(lines) + "\n")
    m = read_memory(str(proc_root))
    assert not isinstance(m.disks, Unavailable)
    assert [d.name for d in m.disks] == [d.name for d in good[1:]]
    assert m.unavailable["disks"] == f"malformed /proc/diskstats: line {at + 1}: field 6 is {f[5]!r}, not a count"
    assert m.total_bytes is not None and "total_bytes" not in m.unavailable


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
    rows, bad = parse_diskstats(text)
    assert len(rows) + len(bad) == sum(1 for ln in text.splitlines() if ln.split())
    parse_proc_cgroup(text)
    parse_cgroup_mounts(text, 1)
    parse_cgroup_mounts(text, 2)
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
    parsed, bad = parse_diskstats(text)
    assert bad == []
    assert [(d.name, d.reads, d.sectors_written, d.io_time_ms) for d in parsed] == [
        (name, nums[0], nums[6], nums[9]) for name, nums in rows
    ]


disk_row = st.tuples(st.from_regex(r"[a-z]{2,6}[0-9]{0,2}", fullmatch=True),
                     st.lists(st.integers(0, 2**40), min_size=11, max_size=17))
# what a damaged line looks like: cut short, a counter with junk in it, a stray word
bad_line = st.one_of(
    st.lists(st.from_regex(r"[0-9a-z]{1,8}", fullmatch=True), min_size=1, max_size=13).map(" ".join),
    st.tuples(disk_row, st.integers(0, 10), st.sampled_from(["x", "-1", "1.5", "²"])).map(
        lambda t: " ".join(["8", "0", t[0][0]] + [str(v) + (t[2] if i == t[1] else "") for i, v in enumerate(t[0][1])])),
)


@given(st.lists(st.one_of(disk_row, bad_line), max_size=12))
def test_diskstats_keeps_good_rows_and_names_every_bad_line(lines: list[tuple[str, list[int]] | str]) -> None:
    text = "".join((ln if isinstance(ln, str) else f"   8       0 {ln[0]} {' '.join(map(str, ln[1]))}") + "\n"
                   for ln in lines)
    parsed, bad = parse_diskstats(text)
    assert [d.name for d in parsed] == [ln[0] for ln in lines if not isinstance(ln, str)]
    assert [b.split(":")[0] for b in bad] == [f"line {i}" for i, ln in enumerate(lines, 1) if isinstance(ln, str)]


def test_memory_part_is_plain_data(proc_root: Path) -> None:
    m = read_memory(str(proc_root))
    assert isinstance(m, MemoryPart)
    assert all(isinstance(getattr(m, f), int) for f in MEMINFO_FIELDS)


cg_paths = st.from_regex(r"/[a-z0-9_.:@-]{0,12}(/[a-z0-9_.:@-]{1,12}){0,3}", fullmatch=True)
controllers = st.sets(st.sampled_from(["memory", "cpu", "cpuacct", "pids", "name=systemd", "blkio"]), min_size=1)


@given(st.lists(st.tuples(st.integers(1, 15), controllers, cg_paths), max_size=6), st.one_of(st.none(), cg_paths))
def test_proc_cgroup_picks_the_hierarchy_with_memory(v1: list[tuple[int, set[str], str]], v2: str | None) -> None:
    lines = [f"{n}:{','.join(sorted(c))}:{p}" for n, c, p in v1] + ([f"0::{v2}"] if v2 is not None else [])
    memory = next((p for _, c, p in v1 if "memory" in c), None)
    want = (1, memory) if memory is not None else (2, v2) if v2 is not None else None
    assert parse_proc_cgroup("\n".join(lines) + "\n") == want


mount_points = st.from_regex(r"/[a-z \\]{1,10}(/[a-z0-9 ,]{1,10}){0,2}", fullmatch=True)


@given(st.lists(st.tuples(cg_paths, mount_points, st.sampled_from(["cgroup", "cgroup2", "tmpfs", "ext4"]),
                          controllers), max_size=6))
def test_cgroup_mounts_from_mountinfo(rows: list[tuple[str, str, str, set[str]]]) -> None:
    def esc(s: str) -> str:  # as the kernel writes them: space, tab, newline and backslash in octal
        return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in s)

    text = "".join(f"{30 + i} 25 0:{i} {esc(r)} {esc(m)} rw,relatime shared:{i} - {fs} {fs} rw,{','.join(sorted(c))}\n"
                   for i, (r, m, fs, c) in enumerate(rows))
    assert parse_cgroup_mounts(text, 2) == [(r, m) for r, m, fs, _ in rows if fs == "cgroup2"]
    assert parse_cgroup_mounts(text, 1) == [(r, m) for r, m, fs, c in rows if fs == "cgroup" and "memory" in c]


def test_cgroup_folder_is_found_through_mountinfo_once_while_it_is_there(tmp_path: Path) -> None:
    """The memory source finds its cgroup's folder through /proc/self/mountinfo once, not every tick (a node with
    hundreds of container mounts has a mountinfo of hundreds of lines), and gives the same numbers as a fresh
    lookup; a process moved to another cgroup, a cgroup removed and an old entry are looked up again."""
    root = v1_tree(tmp_path, f"{8 * GIB}\n", v1_stat(GIB, 8192, 8 * GIB))
    clock = [1000.0]
    dirs = CgroupDirs(clock=lambda: clock[0])
    mountinfo = root / "proc/self/mountinfo"
    first = read_cgroup_memory(str(root), dirs=dirs)
    assert first == read_cgroup_memory(str(root)) and isinstance(first, CgroupMemory) and first.max_bytes == 8 * GIB
    mountinfo.write_text("")  # the mounts are not read again: an empty mountinfo would say none is mounted
    assert read_cgroup_memory(str(root), dirs=dirs) == first
    assert isinstance(read_cgroup_memory(str(root)), Unavailable)  # (a fresh lookup reads it)
    # moved to another cgroup: its path is new, looked up (and found) in the mounts
    mountinfo.write_text(V1_MOUNTINFO)
    other = "/slurm/uid_1000/job_43/step_0/task_0"
    v1_tree(tmp_path, f"{4 * GIB}\n", v1_stat(GIB, 0, 4 * GIB), cgroup=V1_CGROUP.replace(V1_TASK, other), rel=other)
    moved = read_cgroup_memory(str(root), dirs=dirs)
    assert isinstance(moved, CgroupMemory) and (moved.path, moved.max_bytes) == (other, 4 * GIB)
    # its folder removed: looked up again, and the mounts (now without the memory controller) say so
    mountinfo.write_text(V1_MOUNTINFO.replace(",memory", ""))
    (root / f"sys/fs/cgroup/memory{other}").rename(root / "gone")
    gone = read_cgroup_memory(str(root), dirs=dirs)
    assert isinstance(gone, Unavailable) and "limit not read" in gone.reason
    # an entry older than CGROUP_DIR_KEEP_S is looked up again even while its folder is there
    (root / "gone").rename(root / f"sys/fs/cgroup/memory{other}")
    mountinfo.write_text(V1_MOUNTINFO)
    assert isinstance(read_cgroup_memory(str(root), dirs=dirs), CgroupMemory)
    mountinfo.write_text("")
    clock[0] += CGROUP_DIR_KEEP_S + 1
    assert isinstance(read_cgroup_memory(str(root), dirs=dirs), Unavailable)


_COUNT_TEXT = st.one_of(st.integers(0, 2**64 + 5).map(str), st.sampled_from(["¹", "-1", "+7", "1_0", "0x10", "", "9" * 21]),
                        st.text(max_size=4))


@given(st.lists(st.lists(_COUNT_TEXT, min_size=10, max_size=16), max_size=6))
@example([["8", "0", "sda", *["1"] * 10, "²"], ["8", "1", "sda1", "1", "2", str(2**64), *["0"] * 8]])
def test_diskstats_rows_and_reasons_are_those_of_a_field_by_field_check(rows: list[list[str]]) -> None:
    # The eleven counts of a line are checked at once; what is kept and what is said of a bad line are those of
    # checking them one at a time: a count is ASCII digits of at most 20 that fit 64 bits.
    from dltop.procfs import parse_count

    lines = [" ".join(f for f in r if f.split() == [f] == f.splitlines()) for r in rows]  # one field each
    got, bad = parse_diskstats("\n".join(lines))
    want_rows, want_bad = [], []
    for i, line in enumerate(lines, 1):
        f = line.split()
        if not f:
            continue
        if len(f) < 14:
            want_bad.append(f"line {i}: {len(f)} fields, a device has 14 or more: {line.strip()[:60]!r}")
            continue
        wrong = next((j for j in range(3, 14) if parse_count(f[j]) is None), None)
        if wrong is not None:
            want_bad.append(f"line {i}: field {wrong + 1} is {f[wrong][:20]!r}, not a count")
            continue
        want_rows.append((f[2], *(int(x) for x in f[3:14])))
    assert bad == want_bad
    assert [(d.name, d.reads, d.sectors_read, d.read_time_ms, d.writes, d.sectors_written, d.write_time_ms,
             d.in_flight, d.io_time_ms) for d in got] == [
        (r[0], r[1], r[3], r[4], r[5], r[7], r[8], r[9], r[10]) for r in want_rows]
