"""Check dltop's GPU numbers against nvidia-smi and torch on a machine with an NVIDIA GPU, unattended, in one report.

It starts a PyTorch process holding known weights (a stack of fp16 Linear layers) and a known KV tensor, which
prints its pid and its own torch.cuda.memory_allocated() / memory_reserved() and stays alive; then reads dltop's
`gpus` twice (in this process through dltop.sources.gpu with the real pynvml backend, and `dltop snapshot --json`
as a subprocess) and nvidia-smi's --query-compute-apps and --query-gpu, and checks:

  - torch allocated exactly the known weights + KV bytes;
  - dltop's per-process used memory equals nvidia-smi's within 1% (nvidia-smi reports MiB: compared in MiB),
    for both readings of dltop;
  - NVML's per-process figure holds torch's reserved memory (the rest is non-torch: CUDA context, cuBLAS);
  - every GPU's memory total agrees with nvidia-smi's (to its MiB rounding);
  - the split, joined from the worker's probe file (it runs dltop.probe, watching its model and KV tensor) by
    dltop.derive.join_splits as the Sampler does: weights and KV are the known bytes, torch allocated / reserved
    are the worker's own, and the five parts sum to NVML's per-process figure within 1% (in both readings);
and measures an NVML tick's real cost: median and p95 of 50 GpuReader.read() calls.
Exit 0 when every check passes, 1 otherwise (also when it cannot run: it says what is missing).

  python benchmarks/gpu_check.py               # on the GPU machine (needs torch with CUDA, nvidia-ml-py, nvidia-smi)
  python benchmarks/gpu_check.py --fake         # here: fake NVML, fake nvidia-smi, no torch (the reporting path)
  python benchmarks/gpu_check.py --fake --fake-skew 5   # the same with nvidia-smi 5% off: a failing run
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from dltop.derive import join_splits  # noqa: E402
from dltop.model import GpuDevice, GpuProcess, Unavailable  # noqa: E402
from dltop.model.gpu import SPLIT_FIELDS  # noqa: E402
from dltop.sources.gpu import FAKE_ENV, FakeBackend, GpuReader, NvmlBackend, PynvmlBackend  # noqa: E402
from dltop.sources.probes import read_probes  # noqa: E402

MIB = 1 << 20
TOLERANCE = 0.01
FAKE_SCENARIO = REPO / "tests/data/gpu-scenarios/h100-2proc.json"
HIDDEN, LAYERS = 4096, 16  # weights: 16 fp16 Linear(4096, 4096) without bias = 512 MiB
KV_ELEMENTS = 1 << 29  # one fp16 KV tensor of 1 GiB
FP16 = 2
WEIGHTS_BYTES = LAYERS * HIDDEN * HIDDEN * FP16
KV_BYTES = KV_ELEMENTS * FP16
FAKE_RESERVED_EXTRA = 2 * MIB  # what the fake worker says the caching allocator keeps beyond allocated
FAKE_CONTEXT = 500 * MIB  # what the fake NVML says the fake worker holds beyond torch's reserve
TICKS = 50
WORKER_START_S = 90.0  # CUDA initialisation and the allocations


# -- the worker: the process holding known GPU memory --------------------------------------------------------------


class _Tensor:
    """--fake: a tensor's size on cuda:0, as the probe counts it (no torch, no GPU)."""

    def __init__(self, nbytes: int) -> None:
        self.n, self.device, self.grad = nbytes // FP16, "cuda:0", None

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return FP16


class _Model:
    def __init__(self, params: list[_Tensor]) -> None:
        self.params = params

    def parameters(self) -> Any:
        return iter(self.params)

    def buffers(self) -> Any:
        return iter(())


def _fake_torch(allocated: int, reserved: int, uuid: str) -> None:
    """--fake: a stand-in `torch` whose cuda reports what a process on the scenario's GPU 0 would."""
    import types

    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, current_device=lambda: 0,
        memory_stats=lambda i: {"allocated_bytes.all.current": allocated, "reserved_bytes.all.current": reserved},
        get_device_properties=lambda i: types.SimpleNamespace(uuid=uuid.removeprefix("GPU-")))
    sys.modules["torch"] = types.SimpleNamespace(cuda=cuda, __version__="stand-in (gpu_check --fake)")  # type: ignore[assignment]


def worker(fake: bool) -> int:
    """Allocate the known weights and KV tensor, publish the probe, print one JSON line, live until stdin closes."""
    from dltop import probe

    if fake:
        allocated = WEIGHTS_BYTES + KV_BYTES
        reserved = allocated + FAKE_RESERVED_EXTRA
        _fake_torch(allocated, reserved, json.loads(FAKE_SCENARIO.read_text())["gpus"][0]["uuid"])
        model: Any = _Model([_Tensor(WEIGHTS_BYTES)])
        kv: Any = _Tensor(KV_BYTES)
    else:
        import torch

        device = torch.device("cuda", 0)
        model = torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(LAYERS)])
        model = model.to(device=device, dtype=torch.float16)
        kv = torch.empty(KV_ELEMENTS, dtype=torch.float16, device=device)
        torch.cuda.synchronize(device)
        allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    probe.watch_model(model)
    probe.watch_kv(kv)
    published = probe.start()
    print(json.dumps({"pid": os.getpid(), "allocated": allocated, "reserved": reserved,
                      "weights_bytes": WEIGHTS_BYTES, "kv_bytes": KV_BYTES, "probe": published}), flush=True)
    sys.stdin.read()  # until the checker closes the pipe (or exits)
    del model, kv
    return 0


def start_worker(fake: bool, env: dict[str, str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """The worker process and what it printed; RuntimeError with its stderr when it does not come up."""
    args = [sys.executable, str(Path(__file__).resolve()), "--worker", *(["--fake"] if fake else [])]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    import selectors

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(WORKER_START_S) or not (line := proc.stdout.readline()):
        proc.kill()
        _, err = proc.communicate()
        last = (err.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"the torch worker did not start within {WORKER_START_S:.0f} s: {last}")
    return proc, json.loads(line)


def missing_here() -> list[str]:
    """What this interpreter and machine lack for a real run: torch with CUDA, nvidia-ml-py, nvidia-smi."""
    missing = []
    if importlib.util.find_spec("pynvml") is None:
        missing.append(f"nvidia-ml-py is not installed for {sys.executable} (pip install nvidia-ml-py)")
    if shutil.which("nvidia-smi") is None:
        missing.append("nvidia-smi is not on PATH")
    problem = torch_problem()
    return [problem, *missing] if problem else missing


def torch_problem() -> str | None:
    """What stands in the way of a CUDA torch in this interpreter, or None."""
    if importlib.util.find_spec("torch") is None:
        return (f"torch is not installed for {sys.executable} (pip install torch with CUDA, or run this script "
                "with the interpreter that has it)")
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None): install a CUDA build"
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) says torch.cuda.is_available() is False: "
                "no GPU visible to CUDA (driver, CUDA_VISIBLE_DEVICES, container --gpus)")
    return None


# -- nvidia-smi ---------------------------------------------------------------------------------------------------


APPS_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
GPU_QUERY = ["--query-gpu=index,memory.total,memory.used", "--format=csv,noheader,nounits"]


def parse_csv(text: str, columns: int) -> list[list[int | None]]:
    """nvidia-smi's csv,noheader,nounits rows as integers; "[N/A]" or "[Not Supported]" is None."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != columns:
            raise ValueError(f"nvidia-smi row with {len(cells)} columns, expected {columns}: {line!r}")
        rows.append([int(c) if c.isdigit() else None for c in cells])
    return rows


def real_smi(args: list[str]) -> str:
    r = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(args)} exited {r.returncode}: {r.stderr.strip() or r.stdout}")
    return r.stdout


def fake_smi(scenario: dict[str, Any], skew: float) -> Callable[[list[str]], str]:
    """nvidia-smi's answers as the scenario's machine would give them (MiB, floored), per-process memory off by
    `skew` percent (to see a failing comparison)."""

    def run(args: list[str]) -> str:
        if args == APPS_QUERY:
            return "".join(f"{p['pid']}, {int(p['used_bytes'] * (1 + skew / 100)) // MIB}\n"
                           for g in scenario["gpus"] for p in g.get("compute_processes", []))
        return "".join(f"{i}, {g['memory']['total'] // MIB}, {g['memory']['used'] // MIB}\n"
                       for i, g in enumerate(scenario["gpus"]))

    return run


# -- the checks ---------------------------------------------------------------------------------------------------


@dataclass
class Report:
    lines: list[str]
    failed: int = 0
    passed: int = 0

    def check(self, ok: bool, what: str) -> None:
        self.lines.append(f"{'PASS' if ok else 'FAIL'}  {what}")
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def say(self, tag: str, what: str) -> None:
        self.lines.append(f"{tag:<4}  {what}")


def _find(gpus: tuple[GpuDevice, ...], pid: int) -> tuple[GpuDevice, GpuProcess] | None:
    for g in gpus:
        procs = [*(g.processes if isinstance(g.processes, tuple) else ()),
                 *(p for m in g.mig_devices if isinstance(m.processes, tuple) for p in m.processes)]
        for p in procs:
            if p.pid == pid:
                return g, p
    return None


def _mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def within(a: float, b: float, tolerance: float = TOLERANCE) -> tuple[bool, str]:
    """a and b within `tolerance` of b, and the difference in percent."""
    diff = abs(a - b) / b if b else (0.0 if a == b else float("inf"))
    return diff <= tolerance, f"{diff * 100:.2f}%"


def check_process(report: Report, label: str, used_bytes: int | None, smi_mib: int | None) -> None:
    if used_bytes is None or smi_mib is None:
        report.check(False, f"process memory, {label} vs nvidia-smi: dltop {used_bytes!r}, nvidia-smi "
                            f"{smi_mib!r} MiB (one of them gives no number)")
        return
    ok, diff = within(used_bytes / MIB, smi_mib)
    report.check(ok, f"process memory, {label} vs nvidia-smi: {_mib(used_bytes)} vs {smi_mib} MiB "
                     f"({diff}, limit {TOLERANCE:.0%})")


def check_split(report: Report, label: str, p: GpuProcess, w: dict[str, Any]) -> None:
    """The worker's split as dltop joined it: the known bytes, torch's own numbers, and the parts summing to
    NVML's per-process figure within 1%."""
    sp = p.split
    split = [getattr(sp, f) for f in SPLIT_FIELDS]
    if sp.probe_device is None:
        why = sorted(set(sp.unavailable.values()))
        report.check(False, f"{label} split: the worker's probe was not joined ({'; '.join(why)})")
        return
    parts = ", ".join(f"{f.removesuffix('_bytes')} {'?' if v is None else _mib(v)}"
                      for f, v in zip(SPLIT_FIELDS, split, strict=True))
    report.say("INFO", f"{label} split: {parts}; joined {sp.probe_device} by {sp.joined_by}")
    report.check((sp.weights_bytes, sp.kv_cache_bytes) == (w["weights_bytes"], w["kv_bytes"]),
                 f"{label} split: weights and KV are the known bytes: {sp.weights_bytes!r}, {sp.kv_cache_bytes!r} "
                 f"vs {w['weights_bytes']:,}, {w['kv_bytes']:,}")
    report.check((sp.torch_allocated_bytes, sp.torch_reserved_bytes) == (w["allocated"], w["reserved"]),
                 f"{label} split: torch allocated / reserved are the worker's own: {sp.torch_allocated_bytes!r} / "
                 f"{sp.torch_reserved_bytes!r} vs {w['allocated']:,} / {w['reserved']:,}")
    if any(v is None for v in split) or p.used_bytes is None:
        missing = [f"{f} ({sp.unavailable.get(f)})" for f, v in zip(SPLIT_FIELDS, split, strict=True) if v is None]
        report.check(False, f"{label} split: fields without a number: {', '.join(missing) or 'used_bytes'}")
        return
    total = sum(v for v in split if v is not None)
    ok, diff = within(total, p.used_bytes)
    report.check(ok, f"{label} split sums to NVML's process figure: {_mib(total)} vs {_mib(p.used_bytes)} ({diff}, "
                     f"within {TOLERANCE:.0%})")


def tick_cost(make_backend: Callable[[], NvmlBackend]) -> str:
    reader = GpuReader(make_backend)
    part = reader.read()  # the session start and /proc lookups, not a tick
    wall, cpu = [], []
    for _ in range(TICKS):
        t0, c0 = time.perf_counter(), time.process_time()
        reader.read()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    reader.close()
    wall.sort()
    cpu.sort()
    p95 = int(TICKS * 0.95)
    n = len(part) if isinstance(part, tuple) else 0
    pcie = sorted({g.pcie_source or "none" for g in part}) if isinstance(part, tuple) else []
    return (f"NVML tick (GpuReader.read, {n} GPU{'s' if n != 1 else ''}, {TICKS} ticks): wall median "
            f"{statistics.median(wall) * 1e3:.2f} ms, p95 {wall[p95] * 1e3:.2f} ms; CPU median "
            f"{statistics.median(cpu) * 1e3:.2f} ms, p95 {cpu[p95] * 1e3:.2f} ms; PCIe from {', '.join(pcie)}")


def snapshot_gpus(env: dict[str, str]) -> tuple[GpuDevice, ...] | str:
    """`dltop snapshot --json`'s gpus, as the model, or why not."""
    from dltop.model import Snapshot

    r = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json"], capture_output=True, text=True,
                       cwd=REPO, env=env, timeout=60)
    if r.returncode != 0:
        return f"dltop snapshot exited {r.returncode}: {r.stderr.strip()}"
    gpus = Snapshot.from_json(r.stdout).gpus
    if not isinstance(gpus, tuple):
        return f"dltop snapshot --json: gpus {gpus}"
    return gpus


def run_checks(fake: bool, skew: float) -> Report:
    report = Report([])
    env = dict(os.environ)
    scenario_file = None
    if fake:
        report.say("MODE", f"fake: NVML from {FAKE_SCENARIO.name} plus the worker, nvidia-smi made from the same "
                           f"scenario{f' {skew:+g}% off' if skew else ''}, no torch (the reporting path only)")
    else:
        env.pop(FAKE_ENV, None)
        missing = missing_here()
        for problem in missing:
            report.check(False, f"cannot run: {problem}")
        if missing:
            return report
    # The worker's probe publishes into a private directory of this run; dltop reads it from there.
    runtime = tempfile.TemporaryDirectory(prefix="dltop-gpu-check-")
    env["XDG_RUNTIME_DIR"] = runtime.name
    try:
        proc, w = start_worker(fake, env)
    except RuntimeError as e:
        report.check(False, f"cannot run: {e}")
        runtime.cleanup()
        return report
    if not w.get("probe"):
        report.check(False, f"the worker's probe did not publish into {runtime.name} (see its stderr)")
    try:
        make_backend: Callable[[], NvmlBackend]
        smi: Callable[[list[str]], str]
        if fake:
            scenario = json.loads(FAKE_SCENARIO.read_text())
            scenario["gpus"][0]["compute_processes"].append(
                {"pid": w["pid"], "used_bytes": w["reserved"] + FAKE_CONTEXT})
            scenario_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # noqa: SIM115
            with scenario_file:
                json.dump(scenario, scenario_file)
            env[FAKE_ENV] = scenario_file.name
            make_backend, smi = (lambda: FakeBackend(scenario)), fake_smi(scenario, skew)
        else:
            make_backend, smi = PynvmlBackend, real_smi
        report.say("INFO", f"worker pid {w['pid']}: weights {_mib(w['weights_bytes'])}, KV {_mib(w['kv_bytes'])}; "
                           f"torch allocated {_mib(w['allocated'])}, reserved {_mib(w['reserved'])}")
        want = w["weights_bytes"] + w["kv_bytes"]
        report.check(w["allocated"] == want, f"torch allocated = weights + KV: {w['allocated']:,} B vs {want:,} B")
        _compare(report, w, make_backend, smi, env, Path(runtime.name) / "dltop")
        report.say("INFO", tick_cost(make_backend))
    finally:
        with contextlib.suppress(OSError):
            proc.communicate(input="", timeout=10)
        if proc.poll() is None:
            proc.kill()
        if scenario_file is not None:
            os.unlink(scenario_file.name)
        runtime.cleanup()
    return report


def _compare(report: Report, w: dict[str, Any], make_backend: Callable[[], NvmlBackend],
             smi: Callable[[list[str]], str], env: dict[str, str], probe_dir: Path) -> None:
    reader = GpuReader(make_backend)
    try:
        read = reader.read()
    finally:
        reader.close()
    # as the Sampler composes a Snapshot: the probe files joined to NVML's processes
    part = join_splits(read, read_probes([(str(probe_dir), os.getuid())]), None, time.time())
    if isinstance(part, Unavailable):
        report.check(False, f"dltop reads no GPU: {part.reason}")
        return
    try:
        apps = {row[0]: row[1] for row in parse_csv(smi(APPS_QUERY), 2)}
        devices = {row[0]: row for row in parse_csv(smi(GPU_QUERY), 3)}
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        report.check(False, f"nvidia-smi: {e}")
        return
    found = _find(part, w["pid"])
    if found is None:
        report.check(False, f"worker pid {w['pid']} not among dltop's GPU processes "
                            f"({sorted(p.pid for g in part if isinstance(g.processes, tuple) for p in g.processes)}); "
                            f"nvidia-smi lists {sorted(k for k in apps if k is not None)} (a container without "
                            "--pid=host shows other pids)")
        return
    g, p = found
    report.say("INFO", f"worker on GPU {g.index} ({g.name}, {g.uuid})")
    if w["pid"] not in apps:
        report.check(False, f"worker pid {w['pid']} not in nvidia-smi's compute apps ({sorted(k for k in apps if k is not None)})")
    else:
        check_process(report, "dltop (dltop.sources.gpu)", p.used_bytes, apps[w["pid"]])
        snap = snapshot_gpus(env)
        if isinstance(snap, str):
            report.check(False, snap)
        else:
            again = _find(snap, w["pid"])
            check_process(report, "dltop snapshot --json", None if again is None else again[1].used_bytes,
                          apps[w["pid"]])
            if again is not None:
                check_split(report, "dltop snapshot --json", again[1], w)
    if p.used_bytes is not None:
        report.check(p.used_bytes >= w["reserved"], f"NVML's process figure holds torch's reserved: "
                     f"{_mib(p.used_bytes)} >= {_mib(w['reserved'])} (non-torch "
                     f"{_mib(p.used_bytes - w['reserved'])})")
    for d in part:
        row = devices.get(d.index)
        if row is None or d.memory_total_bytes is None or row[1] is None:
            report.check(False, f"GPU {d.index} memory total: dltop {d.memory_total_bytes!r} B, nvidia-smi "
                                f"{None if row is None else row[1]!r} MiB")
            continue
        # nvidia-smi prints whole MiB: dltop's bytes in MiB are within one of it.
        ok = abs(d.memory_total_bytes / MIB - row[1]) < 1
        report.check(ok, f"GPU {d.index} memory total, dltop vs nvidia-smi: {_mib(d.memory_total_bytes)} vs "
                         f"{row[1]} MiB")
        used = "null" if d.memory_used_bytes is None else _mib(d.memory_used_bytes)
        report.say("INFO", f"GPU {d.index} memory used (moves between reads, not checked): dltop {used}, "
                           f"nvidia-smi {row[2]} MiB")
    check_split(report, "dltop (join_splits)", p, w)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fake", "--dry-run", action="store_true",
                    help="fake NVML and nvidia-smi, no torch: runs anywhere (tests the report)")
    ap.add_argument("--fake-skew", type=float, default=0.0, metavar="PCT",
                    help="with --fake: nvidia-smi's per-process memory this many percent off")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.fake)
    t0 = time.monotonic()
    report = run_checks(args.fake, args.fake_skew)
    print("dltop gpu_check")
    print("\n".join(report.lines))
    total = report.passed + report.failed
    verdict = "PASS" if report.failed == 0 and total else "FAIL"
    print(f"result: {verdict}: {report.passed} of {total} checks passed ({time.monotonic() - t0:.1f} s)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
