"""The /proc and /sys readers on damaged captures (`--root`): real trees, mutated file by file, never raise.

Each reader gets a tree copied from this machine's /proc and /sys (and, for the CPU reader, the real Arm and x86
captures in ../shared/fixtures/cpu-dumps), whose files are truncated, bit-flipped, given NULs and non-UTF-8 bytes,
numbers made huge, negative, nan or inf, or replaced by an empty file, a directory, a FIFO (an open for read would
block), a symlink loop or a link to /dev/zero (endless). Whatever is read must be valid (numbers finite,
non-negative, within 64 bits) or marked unavailable with a one-line reason; nothing may raise or hang.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dltop import cpuregs
from dltop.errors import DltopError
from dltop.fmt import printable
from dltop.model.base import Unavailable, to_dict
from dltop.model.cpu import CpuPart
from dltop.model.memory import CgroupMemory, MemoryPart, VmStat
from dltop.sampler import read_uptime
from dltop.sources import memory as memsrc
from dltop.sources.cpu import read_cpu
from dltop.sources.gpu import FakeBackend, GpuReader
from tests.conftest import DATA, REPO

DUMPS = REPO.parent / "shared" / "fixtures" / "cpu-dumps"
CAPTURES = {  # small real captures with what the live machine may lack: Arm MIDRs, clusters, a partial sysfs
    "arm-A510-A710-A715-X3": DUMPS / "util-linux" / "arm-A510-A710-A715-X3.tar.gz",
    "ghw-graviton2": DUMPS / "ghw" / "linux-arm64-c288e0776090cd558ef793b2a4e61939.tar.gz",
}
SCENARIOS = DATA / "gpu-scenarios"
GPU_PIDS = (41230, 41877)  # the processes of h100-2proc.json

EXAMPLES = int(os.environ.get("DLTOP_FUZZ_EXAMPLES", "200"))
TRIED: Counter[str] = Counter()  # reader -> inputs tried, printed at the end of the module
AS_ROOT = os.geteuid() == 0

# Replacements for one number in a file: past 64 bits, past int()'s 4300-digit limit, signed, not finite.
NUMBERS = ("9" * 400, "9" * 5000, "18446744073709551616", "-1", "-9223372036854775808", "nan", "inf", "-inf",
           "1e999", "0", "0x" + "f" * 40, "-0", "+7", "½", "٣")
# The parts whose every count is either read or has its reason in `unavailable`.
MISSING_HAS_REASON = (MemoryPart, VmStat, CgroupMemory)
KINDS = ("truncate", "flip", "nul", "non_utf8", "number", "empty", "directory", "fifo", "symlink_loop",
         "dev_zero", "long_line") + (() if AS_ROOT else ("unreadable",))


# ------------------------------------------------------------------------------------------- building trees


def _copy(src: str, dst_root: Path, rel: str | None = None) -> None:
    """Copy one file of the live system (procfs and sysfs files have st_size 0: read them, do not copy)."""
    try:
        data = Path(src).read_bytes()
    except OSError:
        return
    dst = dst_root / (rel if rel is not None else src.lstrip("/"))
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)


def live_tree(dst: Path) -> Path:
    """A tree of this machine's own /proc and /sys files, the ones the memory, CPU and GPU readers open."""
    for name in ("meminfo", "vmstat", "diskstats", "uptime", "cpuinfo", "locks", "pressure/memory", "pressure/io",
                 "pressure/cpu", "self/cgroup", "self/mountinfo"):
        _copy(f"/proc/{name}", dst)
    with contextlib.suppress(OSError):
        for name in os.listdir("/sys/block"):
            (dst / "sys/block" / name).mkdir(parents=True, exist_ok=True)
    cg = memsrc.parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    if cg is not None:
        with contextlib.suppress(ValueError, OSError):
            base, top = memsrc._cgroup_dir("/", cg[0], cg[1])
            for d in {base, top}:
                for name in os.listdir(d):
                    if name in ("memory.current", "memory.max", "memory.stat", "memory.events",
                                "memory.usage_in_bytes", "memory.limit_in_bytes", "memory.oom_control"):
                        _copy(os.path.join(d, name), dst)
    cpu = "/sys/devices/system/cpu"
    for name in ("online", "possible", "present"):
        _copy(f"{cpu}/{name}", dst)
    for entry in sorted(os.listdir(cpu)):
        if not re.fullmatch(r"cpu[0-9]+", entry):
            continue
        for sub in ("cache", "topology"):
            for dirpath, _, files in os.walk(f"{cpu}/{entry}/{sub}"):
                for f in files:
                    if f != "uevent":
                        _copy(os.path.join(dirpath, f), dst)
        for f in ("online", "cpu_capacity", "regs/identification/midr_el1", "cpufreq/cpuinfo_max_freq"):
            _copy(f"{cpu}/{entry}/{f}", dst)
    for pid in GPU_PIDS:  # the fake NVML's processes, with this test's own cmdline, comm and stat
        for f in ("cmdline", "comm", "stat", "status"):
            _copy(f"/proc/self/{f}", dst, f"proc/{pid}/{f}")
    return dst


def capture_tree(name: str, dst: Path) -> Path:
    with tarfile.open(CAPTURES[name]) as tf:
        tf.extractall(dst, filter="data")
    inner = dst / name
    return inner if (inner / "sys").is_dir() else dst


def files_under(root: Path, *subs: str) -> list[Path]:
    """The regular files a reader may open, in a stable order."""
    out = []
    for sub in subs:
        top = root / sub
        if top.is_file():
            out.append(top)
            continue
        for dirpath, dirs, files in os.walk(top):
            dirs.sort()
            out.extend(Path(dirpath) / f for f in sorted(files) if (Path(dirpath) / f).is_file())
    return out


# ----------------------------------------------------------------------------------------------- mutations


@contextlib.contextmanager
def mutated(path: Path, kind: str, seed: int, number: str) -> Iterator[None]:
    """Damage one file the way a bad copy, a bad disk or a hostile capture would; put it back afterwards."""
    original = path.read_bytes()
    mode = stat.S_IMODE(path.stat().st_mode)
    try:
        data = original
        pos = seed % (len(data) + 1)
        if kind == "truncate":
            path.write_bytes(data[:pos])
        elif kind == "flip":
            if data:
                i = seed % len(data)
                path.write_bytes(data[:i] + bytes([data[i] ^ (1 << (seed >> 20) % 8)]) + data[i + 1:])
        elif kind == "nul":
            path.write_bytes(data[:pos] + b"\0" + data[pos:])
        elif kind == "non_utf8":
            path.write_bytes(data[:pos] + (b"\xff\xfe", b"\xc3", b"\xe2\x80\xae", b"\x1b[2J")[seed % 4] + data[pos:])
        elif kind == "number":
            nums = list(re.finditer(rb"\d+", data))
            if nums:
                m = nums[seed % len(nums)]
                path.write_bytes(data[:m.start()] + number.encode() + data[m.end():])
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "long_line":
            path.write_bytes(data[:pos] + b"7" * (1 << 20) + data[pos:])
        elif kind == "unreadable":
            path.chmod(0)
        else:
            path.unlink()
            if kind == "directory":
                path.mkdir()
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "symlink_loop":
                path.symlink_to(path.name)
            elif kind == "dev_zero":
                path.symlink_to("/dev/zero")
        yield
    finally:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        path.write_bytes(original)
        path.chmod(mode)


class Hung(BaseException):
    """Not an OSError (as TimeoutError is), so no reader's `except OSError` can take it for a read error."""


@contextlib.contextmanager
def deadline(seconds: int, what: str) -> Iterator[None]:
    """A reader that blocks (a FIFO opened for reading) fails the test instead of hanging it."""
    def hung(*_: object) -> None:
        raise Hung(f"{what} still reading after {seconds} s (blocked on a FIFO?)")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


damage = st.lists(st.tuples(st.integers(0, 1 << 30), st.sampled_from(KINDS), st.integers(0, 1 << 30),
                            st.sampled_from(NUMBERS)), min_size=1, max_size=3)


def run_damaged(files: list[Path], plan: list[tuple[int, str, int, str]], read: Callable[[], Any]) -> Any:
    """`read()` with the planned files damaged (one mutation per file: the first planned wins)."""
    with contextlib.ExitStack() as stack:
        done = set()
        for index, kind, seed, number in plan:
            path = files[index % len(files)]
            if path not in done:
                done.add(path)
                stack.enter_context(mutated(path, kind, seed, number))
        with deadline(20, "reader"):
            return read()


# ---------------------------------------------------------------------------------------------- the checks


def one_line(reason: object, where: str) -> None:
    assert isinstance(reason, str) and reason.strip(), f"{where}: empty reason {reason!r}"
    assert "\n" not in reason and "\r" not in reason, f"{where}: reason of more than one line: {reason!r}"
    assert printable(reason) == reason, f"{where}: reason holds controls: {reason!r}"


def check(value: Any, where: str = "part") -> None:
    """Valid or unavailable-with-a-reason, all the way down."""
    if isinstance(value, Unavailable):
        one_line(value.reason, where)
    elif isinstance(value, bool) or value is None or isinstance(value, str):
        pass
    elif isinstance(value, int):
        assert 0 <= value < 1 << 64, f"{where} = {value}: not a count that fits in 64 bits"
    elif isinstance(value, float):
        assert math.isfinite(value) and value >= 0, f"{where} = {value}: not a finite non-negative number"
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            check(v, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            check(v, f"{where}[{k!r}]")
    elif dataclasses.is_dataclass(value):
        missing = getattr(value, "unavailable", {})
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "unavailable":
                for k, why in v.items():
                    one_line(why, f"{where}.unavailable[{k!r}]")
            elif f.name in ("message", "reason", "note", "arrangement_reason"):
                if v is not None:
                    one_line(v, f"{where}.{f.name}")
            elif type(value) in MISSING_HAS_REASON and v is None and "int | None" in str(f.type):
                assert f.name in missing, f"{where}.{f.name} is None with no reason"  # missing is never zero
            else:
                check(v, f"{where}.{f.name}")
    # Everything read must also survive being written as strict JSON (no NaN, no Infinity).
    if where == "part" and not isinstance(value, Unavailable):
        json.dumps(to_dict(value) if dataclasses.is_dataclass(value) else
                   [to_dict(v) if dataclasses.is_dataclass(v) else v for v in value], allow_nan=False)


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return live_tree(tmp_path_factory.mktemp("live"))


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    if not DUMPS.is_dir():
        return []
    return [capture_tree(name, tmp_path_factory.mktemp(name)) for name, tar in CAPTURES.items() if tar.is_file()]


@pytest.fixture(scope="module", autouse=True)
def report_counts(pytestconfig: pytest.Config) -> Iterator[None]:
    """Print how many inputs each reader was given (past pytest's capture: the count goes into the docs)."""
    yield
    if TRIED:
        line = "inputs tried per reader: " + ", ".join(f"{k} {v}" for k, v in sorted(TRIED.items()))
        capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            print("\n" + line)


def fuzz(**kw: Any) -> Callable[..., Any]:
    # DLTOP_FUZZ_NO_SHRINK=1: report the first failure as found (shrinking one that read a FIFO takes minutes).
    phases = (Phase.explicit, Phase.generate) if os.environ.get("DLTOP_FUZZ_NO_SHRINK") else tuple(Phase)
    return settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None, phases=phases,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], **kw)


# ------------------------------------------------------------------------------------------------- readers


def test_the_undamaged_trees_read_valid(live: Path, captures: list[Path]) -> None:
    """The baseline: the real trees themselves pass the checks (so a failure below is the damage's doing)."""
    check(memsrc.read_memory(str(live)))
    for root in [live, *captures]:
        part = read_cpu(root)
        assert isinstance(part, CpuPart), part
        check(part)
    check(GpuReader(lambda: FakeBackend.from_file(str(SCENARIOS / "h100-2proc.json")), str(live)).read())


@fuzz()
@given(plan=damage)
def test_memory_reader_on_damaged_files(live: Path, plan: list[tuple[int, str, int, str]]) -> None:
    files = files_under(live, "proc/meminfo", "proc/vmstat", "proc/pressure", "proc/diskstats", "proc/self",
                        "sys/fs")
    TRIED["memory"] += 1
    check(run_damaged(files, plan, lambda: memsrc.read_memory(str(live))))


def _fuzz_cpu(root: Path, plan: list[tuple[int, str, int, str]]) -> None:
    files = files_under(root, "proc/cpuinfo", "sys/devices/system/cpu")
    part = run_damaged(files, plan, lambda: read_cpu(root))
    check(part)
    if isinstance(part, CpuPart):
        for f in part.flags:
            one_line(f.message, f"flag {f.code}")


@fuzz()
@given(plan=damage)
def test_cpu_reader_on_damaged_live_files(live: Path, plan: list[tuple[int, str, int, str]]) -> None:
    TRIED["cpu (this machine)"] += 1
    _fuzz_cpu(live, plan)


@pytest.mark.skipif(not DUMPS.is_dir(), reason=f"real captures not found at {DUMPS}")
@fuzz()
@given(which=st.integers(0, 100), plan=damage)
def test_cpu_reader_on_damaged_captures(captures: list[Path], which: int,
                                        plan: list[tuple[int, str, int, str]]) -> None:
    """The Arm captures: MIDRs in sysfs, cluster and package IDs, a tree with only levels and sharing."""
    TRIED["cpu (Arm captures)"] += 1
    _fuzz_cpu(captures[which % len(captures)], plan)


@fuzz()
@given(name=st.sampled_from(["h100-2proc", "gb10-unified"]), plan=damage)
def test_gpu_proc_reads_on_damaged_files(live: Path, name: str, plan: list[tuple[int, str, int, str]]) -> None:
    """The GPU source's /proc side: each process's cmdline, comm and stat, and meminfo on a unified-memory GPU."""
    files = files_under(live, *(f"proc/{pid}" for pid in GPU_PIDS), "proc/meminfo")
    TRIED["gpu /proc"] += 1
    check(run_damaged(files, plan, lambda: GpuReader(
        lambda: FakeBackend.from_file(str(SCENARIOS / f"{name}.json")), str(live)).read()))


@fuzz()
@given(plan=damage)
def test_uptime_on_damaged_files(live: Path, plan: list[tuple[int, str, int, str]]) -> None:
    TRIED["uptime"] += 1
    up = run_damaged([live / "proc/uptime"], plan, lambda: read_uptime(str(live)))
    assert up is None or (math.isfinite(up) and up >= 0), up


@fuzz()
@given(value=st.one_of(st.integers(), st.integers(0, (1 << 64) - 1)),
       reg=st.sampled_from(cpuregs.REGISTERS))
def test_register_decoders_take_any_integer(value: int, reg: str) -> None:
    """A register value read from a capture is any integer: decoded, or a ValueError saying why in one line."""
    TRIED["cpuregs decode"] += 1
    try:
        out = cpuregs.decode_register(reg, value)
    except ValueError as e:
        one_line(str(e), reg)
        assert not 0 <= value < 1 << 64, f"{reg}={value:#x} fits in 64 bits and was refused: {e}"
    else:
        json.dumps(out, allow_nan=False)


@fuzz()
@given(text=st.one_of(st.text(max_size=80), st.sampled_from(NUMBERS).map(lambda n: f"CTR_EL0={n}"),
                      st.sampled_from(NUMBERS).map(lambda n: f"MIDR_EL1=0x{n}")))
def test_register_argument_parser_gives_one_line_reasons(text: str) -> None:
    TRIED["cpuregs --decode"] += 1
    try:
        name, value = cpuregs.parse_decode_arg(text)
    except DltopError as e:
        one_line(str(e), repr(text))
    else:
        assert name in cpuregs.REGISTERS and 0 <= value < 1 << 64


# ---------------------------------------------------------------------------------------------- end to end


def _snapshot(root: Path, *prefix: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DLTOP_FAKE_NVML": str(SCENARIOS / "h100-2proc.json"),
           "XDG_CONFIG_HOME": str(root / "no-config"), "XDG_RUNTIME_DIR": str(root / "no-runtime"),
           "HOME": str(root / "no-home")}
    proc = subprocess.run([*prefix, sys.executable, "-m", "dltop", "--root", str(root), "snapshot", "--json",
                           "--timeout", "20"], capture_output=True, text=True, env=env, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    snap = json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    for name, status in snap["sources"].items():  # "no answer within 20 s" is a reader blocked on a FIFO
        assert status["error"] is None, f"the {name} source failed: {status['error']}"
    return snap  # type: ignore[no-any-return]


def _numbers(node: Any, where: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _numbers(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numbers(v, f"{where}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield where, node


def _reasons(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("reason", "unavailable") and isinstance(v, str):
                yield f"{where}.{k}", v
            elif k == "unavailable" and isinstance(v, dict):
                yield from ((f"{where}.unavailable.{f}", why) for f, why in v.items())
            else:
                yield from _reasons(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _reasons(v, f"{where}[{i}]")


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "number", "directory"])
def test_snapshot_of_a_damaged_tree_end_to_end(live: Path, kind: str) -> None:
    """`dltop --root TREE snapshot --json` as a subprocess, with every file of the memory, CPU and GPU readers
    damaged at once: it finishes, prints strict JSON, and no reader's source failed."""
    files = files_under(live, "proc/meminfo", "proc/vmstat", "proc/pressure", "proc/diskstats", "proc/uptime",
                        "proc/cpuinfo", "proc/self", "sys/fs", "sys/devices/system/cpu",
                        *(f"proc/{pid}" for pid in GPU_PIDS))
    with contextlib.ExitStack() as stack:
        for i, path in enumerate(files):
            stack.enter_context(mutated(path, kind, i * 7919, NUMBERS[i % len(NUMBERS)]))
        snap = _snapshot(live)
    TRIED["snapshot end to end"] += 1
    for where, why in _reasons(snap):
        one_line(why, where)
    for where, n in _numbers(snap):  # the recorder and the exporter take 64-bit numbers
        assert abs(n) < 1 << 64, f"{where} = {n}"


@pytest.mark.skipif(not AS_ROOT or shutil.which("setpriv") is None, reason="needs root and setpriv to drop to nobody")
def test_snapshot_with_unreadable_files_as_another_user(live: Path) -> None:
    """Files the reading user may not open (mode 000, read as nobody): each is a reason, never a crash or a 0."""
    base = Path(tempfile.mkdtemp(prefix="dltop-unreadable-"))
    try:
        base.chmod(0o755)
        tree = base / "tree"
        shutil.copytree(live, tree, symlinks=True)
        tree.chmod(0o755)
        for dirpath, dirs, files in os.walk(tree):
            for d in dirs:
                (Path(dirpath) / d).chmod(0o755)
            for f in files:
                (Path(dirpath) / f).chmod(0 if f in ("meminfo", "vmstat", "cpuinfo", "size", "level", "cmdline",
                                                     "diskstats", "memory") else 0o644)
        for d in ("no-config", "no-runtime", "no-home"):
            (tree / d).mkdir(mode=0o777)
        snap = _snapshot(tree, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--")
        TRIED["snapshot as nobody"] += 1
        mem = snap["parts"]["memory"] if "parts" in snap else snap["memory"]
        assert "permission denied" in json.dumps(mem), mem
        for where, why in _reasons(snap):
            one_line(why, where)
    finally:
        shutil.rmtree(base)


# ------------------------------------------------------------------ each bug the fuzzing found, on its own


@pytest.fixture()
def tree(live: Path, tmp_path: Path) -> Path:
    """A fresh copy of the live tree, for one targeted damage."""
    shutil.copytree(live, tmp_path / "t", symlinks=True)
    return tmp_path / "t"


def _cache_file(root: Path, name: str) -> Path:
    found = sorted(root.glob(f"sys/devices/system/cpu/cpu*/cache/index*/{name}"))
    if not found:
        pytest.skip(f"this machine's sysfs has no cache {name}")
    return found[0]


def test_a_fifo_in_place_of_meminfo_is_a_reason_not_a_hang(tree: Path) -> None:
    (tree / "proc/meminfo").unlink()
    os.mkfifo(tree / "proc/meminfo")
    with deadline(10, "read_memory"):
        m = memsrc.read_memory(str(tree))
    assert "a FIFO, not a file" in m.unavailable["total_bytes"], m.unavailable


def test_a_count_past_64_bits_is_malformed_not_a_number(tree: Path) -> None:
    path = tree / "proc/meminfo"
    path.write_text(re.sub(r"^(MemTotal:\s+)\d+", lambda m: m.group(1) + "9" * 5000, path.read_text(), flags=re.M))
    m = memsrc.read_memory(str(tree))
    assert m.total_bytes is None
    assert "not a 64-bit count" in m.unavailable["total_bytes"], m.unavailable["total_bytes"]


def test_psi_averages_must_be_percentages() -> None:
    with pytest.raises(ValueError, match="not percentages"):
        memsrc.parse_pressure("some avg10=nan avg60=0.00 avg300=0.00 total=1\n")
    with pytest.raises(ValueError, match="not a 64-bit count"):
        memsrc.parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=-4\n")


def test_a_cgroup_path_above_the_namespace_is_not_followed_out_of_the_tree(tree: Path, tmp_path: Path) -> None:
    """The kernel writes /../ for a cgroup above the reader's namespace; joined to the tree, it walked out of it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for name, text in (("memory.current", "12345\n"), ("memory.max", "99999\n")):
        (outside / name).write_text(text)
    (tree / "proc/self/mountinfo").write_text("41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    (tree / "sys/fs/cgroup/unified").mkdir(parents=True, exist_ok=True)
    (tree / "proc/self/cgroup").write_text("0::/" + "../" * 40 + str(outside).lstrip("/") + "\n")
    cg = memsrc.read_cgroup_memory(str(tree))
    assert isinstance(cg, Unavailable) and "outside this cgroup namespace" in cg.reason, cg


def test_zero_sets_is_unknown_not_a_division_by_zero(tree: Path) -> None:
    sets = _cache_file(tree, "number_of_sets")
    sets.write_text("0\n")
    part = read_cpu(tree)
    assert isinstance(part, CpuPart), part
    assert any(f.code == "damaged_files" and str(sets.relative_to(tree)) in f.message for f in part.flags)
    assert all(c.sets is None or c.sets > 0 for c in part.caches)


def test_a_midr_past_64_bits_is_unknown(tree: Path) -> None:
    cpu0 = tree / "sys/devices/system/cpu/cpu0"
    (cpu0 / "regs/identification").mkdir(parents=True, exist_ok=True)
    (cpu0 / "regs/identification/midr_el1").write_text("0x" + "f" * 40 + "\n")
    part = read_cpu(tree)
    assert isinstance(part, CpuPart), part
    assert any(f.code == "damaged_files" and "midr_el1" in f.message for f in part.flags), part.flags


def test_a_damaged_hybrid_cpu_list_does_not_take_the_reading_down(tree: Path) -> None:
    if "model name" not in (tree / "proc/cpuinfo").read_text():
        pytest.skip("needs an x86 /proc/cpuinfo (the P/E-core split is x86's)")
    for dev, text in (("cpu_core", "0-x\n"), ("cpu_atom", "1\n")):
        (tree / "sys/devices" / dev).mkdir(parents=True)
        (tree / "sys/devices" / dev / "cpus").write_text(text)
    part = read_cpu(tree)
    assert isinstance(part, CpuPart), part
    assert any(f.code == "damaged_files" and "cpu_core/cpus" in f.message for f in part.flags), part.flags


def test_unified_memory_with_available_over_total_is_a_reason(tree: Path) -> None:
    path = tree / "proc/meminfo"
    path.write_text(re.sub(r"^(MemAvailable:\s+)\d+", r"\g<1>99999999999", path.read_text(), flags=re.M))
    (g,) = GpuReader(lambda: FakeBackend.from_file(str(SCENARIOS / "gb10-unified.json")), str(tree)).read()
    assert g.memory_used_bytes is None
    assert "more than MemTotal" in g.unavailable["memory_used_bytes"], g.unavailable


def test_a_negative_start_time_or_uptime_is_unknown(tree: Path) -> None:
    from dltop.probe.files import proc_start_ticks

    stat_path = tree / f"proc/{GPU_PIDS[0]}/stat"
    fields = stat_path.read_bytes().split(b") ", 1)
    rest = fields[1].split()
    rest[19] = b"-5"
    stat_path.write_bytes(fields[0] + b") " + b" ".join(rest))
    assert proc_start_ticks(GPU_PIDS[0], str(tree / "proc")) is None
    (tree / "proc/uptime").write_text("nan 12.0\n")
    assert read_uptime(str(tree)) is None


def test_decode_refuses_thousands_of_digits_in_one_line() -> None:
    with pytest.raises(DltopError, match="does not fit in a 64-bit register"):
        cpuregs.parse_decode_arg("CTR_EL0=" + "9" * 5000)
