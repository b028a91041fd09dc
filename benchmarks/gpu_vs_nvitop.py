"""dltop's GPU tab beside nvitop on one NVML double: time to the first frame with the GPUs' numbers, CPU at a 1 s
refresh, and RSS, with a bare one-widget Textual app's RSS as the floor a Textual program starts from.

Both tools load the same double (benchmarks/nvml_double): a `pynvml` module first on PYTHONPATH answering from
tests/data/gpu-scenarios/8gpu-20proc.json, with 20 real processes (sleeps named like a job's ranks) put on its 8
GPUs, and a stub libnvidia-ml.so.1 (built here from nvml_double/stub.c with cc) on LD_LIBRARY_PATH, which dltop
dlopens before it imports pynvml and the real binding loads. nvitop comes from its own virtual environment
(scripts/install-bench-deps makes /tmp/nvitop-venv: nvitop 1.7.2 and its nvidia-ml-py).

Each program runs in a real pty of 80x24 (TERM=xterm-256color), exec'd directly, one after the other, RUNS times
in turn (the machine's load falls on all alike). First frame: from the fork until the program has written its
GPUs' memory figures (dltop "GiB/79.6 GiB", nvitop "GiB / 79.65GiB"; the bare app "hello"), wall time, the
program's CPU time then and its RSS. Then each runs WINDOW seconds at a 1 s refresh (dltop --refresh 1, nvitop
-m --interval 1) after a settling time, CPU time over the window and RSS at the end.

usage: python benchmarks/gpu_vs_nvitop.py [--runs 5] [--window 30] [--nvitop /tmp/nvitop-venv/bin/nvitop]
Targets (issue 36): first frame <= 1.5 x nvitop's and <= 1 s; CPU <= 1.2 x nvitop's; RSS <= bare Textual + 15 MB.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOUBLE = REPO / "benchmarks" / "nvml_double"
SCENARIO = REPO / "tests/data/gpu-scenarios/8gpu-20proc.json"
PROCESSES = 20
BARE_APP = ("from textual.app import App\nfrom textual.widgets import Static\n"
            "class Bare(App):\n    def compose(self):\n        yield Static('hello')\nBare().run()\n")
TICK_HZ = os.sysconf("SC_CLK_TCK")


def scenario_with(pids: list[int]) -> dict:
    """The 8-GPU scenario with `pids` spread over its GPUs (GPU i gets every 8th), each sampled every 1/6 s."""
    s = json.loads(SCENARIO.read_text())
    for i, g in enumerate(s["gpus"]):
        mine = pids[i::len(s["gpus"])]
        procs, samples = g["compute_processes"], g.get("process_utilization", [])
        g["compute_processes"] = [dict(procs[j], pid=pid) for j, pid in enumerate(mine)]
        g["process_utilization"] = [dict(samples[j % len(samples)], pid=pid, period_us=166_666)
                                    for j, pid in enumerate(mine)] if samples else []
    return s


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_HZ


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def spawn(argv: list[str], env: dict[str, str]) -> tuple[int, int]:
    """`argv` exec'd in a new pty of 80x24; (pid, the pty's master fd)."""
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        os.execve(argv[0], argv, env)
    return pid, fd


def drain(fd: int, until: float, mark: bytes | None = None) -> bool:
    """Read the pty until `until` (monotonic); True as soon as `mark` has been written (never split: kept)."""
    seen = b""
    while (left := until - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], min(left, 0.05))
        if not ready:
            continue
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            return False
        if mark is not None:
            seen = seen[-len(mark):] + chunk
            if mark in seen:
                return True
    return False


def stop(pid: int, fd: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(fd)


def first_frame(argv: list[str], env: dict[str, str], mark: bytes) -> dict[str, float]:
    t0 = time.monotonic()
    pid, fd = spawn(argv, env)
    try:
        if not drain(fd, t0 + 30, mark):
            raise SystemExit(f"{argv[0]} drew no {mark!r} in 30 s")
        wall = time.monotonic() - t0
        return {"wall": wall, "cpu": cpu_s(pid), "rss": rss_mb(pid)}
    finally:
        stop(pid, fd)


def steady(argv: list[str], env: dict[str, str], settle: float, window: float) -> dict[str, float]:
    pid, fd = spawn(argv, env)
    try:
        drain(fd, time.monotonic() + settle)
        before, t0 = cpu_s(pid), time.monotonic()
        drain(fd, t0 + window)
        return {"cpu_pct": 100 * (cpu_s(pid) - before) / (time.monotonic() - t0), "rss": rss_mb(pid)}
    finally:
        stop(pid, fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--window", type=float, default=30.0, help="seconds of steady running measured (default 30)")
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--nvitop", default="/tmp/nvitop-venv/bin/nvitop")
    ap.add_argument("--python", default=sys.executable, help="the interpreter dltop and the bare app run on")
    ap.add_argument("--repo", default=str(REPO), help="the dltop checkout to run")
    a = ap.parse_args()
    if not os.access(a.nvitop, os.X_OK):
        print(f"no nvitop at {a.nvitop}: run scripts/install-bench-deps (it makes /tmp/nvitop-venv)")
        return 2
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("no C compiler (cc) to build the stub libnvidia-ml.so.1")
        return 2
    sleeper = "import time; time.sleep(10**6)"
    names = [["train.py", "--lr", "3e-4", f"--local-rank={i}"] for i in range(8)] + \
            [["serve.py", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", str(8000 + i)] for i in range(12)]
    jobs = [subprocess.Popen([sys.executable, "-c", sleeper, *n]) for n in names[:PROCESSES]]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            lib = Path(tmp, "libnvidia-ml.so.1")
            subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(DOUBLE / "stub.c")], check=True)
            scen = Path(tmp, "scenario.json")
            scen.write_text(json.dumps(scenario_with([p.pid for p in jobs])))
            base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DLTOP_FAKE_NVML")}
            base.update(TERM="xterm-256color", LD_LIBRARY_PATH=tmp, NVML_DOUBLE_SCENARIO=str(scen),
                        HOME=tmp, XDG_STATE_HOME=tmp, XDG_CONFIG_HOME=tmp, COLUMNS="80", LINES="24")
            double_env = {**base, "PYTHONPATH": str(DOUBLE)}
            dltop_env = {**base, "PYTHONPATH": f"{DOUBLE}{os.pathsep}{a.repo}"}
            subprocess.run([a.python, "-m", "compileall", "-q", f"{a.repo}/dltop"], check=False,
                           stdout=subprocess.DEVNULL)
            tools = {
                "nvitop": ([a.nvitop, "-m", "auto", "--interval", "1"], double_env, b"GiB / 79.65GiB"),
                "dltop": ([a.python, "-P", "-m", "dltop", "--refresh", "1"], dltop_env, b"GiB/79.6 GiB"),
                "bare Textual": ([a.python, "-c", BARE_APP], base, b"hello"),
            }
            frames: dict[str, list[dict[str, float]]] = {t: [] for t in tools}
            for _ in range(a.runs):
                for name, (argv, env, mark) in tools.items():
                    frames[name].append(first_frame(argv, env, mark))
            runs = {name: steady(argv, env, a.settle, a.window) for name, (argv, env, _) in tools.items()}
        finally:
            for p in jobs:
                p.kill()
                p.wait()
    med = {t: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "rss")} for t, rs in frames.items()}
    print(f"8 GPUs (NVML double), {PROCESSES} real processes, 80x24 pty; {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}; first frame: median of {a.runs}; steady: {a.window:.0f} s at a 1 s refresh")
    print(f"{'':22}{'first frame s':>14}{'CPU then s':>12}{'RSS then MB':>13}{'CPU % steady':>14}{'RSS MB':>9}")
    for t in tools:
        print(f"{t:22}{med[t]['wall']:14.2f}{med[t]['cpu']:12.2f}{med[t]['rss']:13.1f}"
              f"{runs[t]['cpu_pct']:14.2f}{runs[t]['rss']:9.1f}")
    walls = {t: [round(r["wall"], 2) for r in rs] for t, rs in frames.items()}
    print(f"first frames (s): {walls}")
    d, n, bare = med["dltop"], med["nvitop"], runs["bare Textual"]["rss"]
    checks = [("first frame <= 1.5 x nvitop's", d["wall"] / n["wall"], 1.5),
              ("first frame <= 1 s", d["wall"], 1.0),
              ("CPU at 1 s refresh <= 1.2 x nvitop's", runs["dltop"]["cpu_pct"] / runs["nvitop"]["cpu_pct"], 1.2),
              ("RSS - bare Textual's <= 15 MB", runs["dltop"]["rss"] - bare, 15.0)]
    for what, got, limit in checks:
        print(f"  {what:40} {got:8.2f}  {'met' if got <= limit else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
