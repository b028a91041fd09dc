"""What the GPU tab costs with 8 GPUs x 20 processes at 80x24, per-process /proc reads included, beside top.

160 real processes (sleeps) are put on the fake NVML's 8 GPUs (tests/data/gpu-scenarios/8gpu-20proc.json with
their pids, each sampled by NVML every 1/6 s), so every tick dltop reads each one's /proc/PID/stat (parent, RSS,
CPU %, start time) as on a real node, and the GPU tab (the first) shows them: compact mode, the table sorted by
memory. Beside it, in its own 80x24 tmux window, `top -d 1`: what a user would otherwise keep open to see the
same processes' CPU and memory (nvitop and nvtop need a GPU and its driver, which a machine running the fake has
not; htop is not installed on every node, top is). top reads every process on the machine, dltop the 160 on the
GPUs. Both at a 1 s refresh; CPU time of each from /proc/PID/stat (utime + stime) over the same window.

With --threads, dltop's CPU is also split by thread (named as `top -H` shows them: dltop-fast reads the GPUs,
memory, CPU and probes each tick, dltop-datasets, dltop-caches, ... the slow sources; the thread that paints the
screen is python).

usage: python benchmarks/gpu_tab.py [--seconds 60] [--repo CHECKOUT] [--threads]
Target (issue 23): the GPU tab <= 1.0% of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import TMUX_SOCKET, cpu_seconds, dltop_command, start, status_kb, tmux  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[1] / "tests/data/gpu-scenarios/8gpu-20proc.json"


def scenario_with(pids: list[int]) -> dict:
    """The 8-GPU scenario with `pids` as its 160 processes, sampled every NVML period (1/6 s)."""
    s = json.loads(SCENARIO.read_text())
    it = iter(pids)
    for g in s["gpus"]:
        mapping = {p["pid"]: next(it) for p in g["compute_processes"]}
        for p in g["compute_processes"]:
            p["pid"] = mapping[p["pid"]]
        for u in g.get("process_utilization", []):
            u["pid"] = mapping.get(u["pid"], u["pid"])
            u["period_us"] = 166_666
    return s


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (utime + stime) of each of `pid`'s threads, by name (threads of one name summed)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window (default 60)")
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]),
                    help="run dltop from this checkout (another branch, to compare)")
    ap.add_argument("--threads", action="store_true", help="also split dltop's CPU by thread")
    args = ap.parse_args()
    # tmux's windows start in this process's working directory, and `python -m dltop` puts that first on
    # sys.path: run from another checkout's folder, --repo ran that one's code whatever PYTHONPATH said
    os.chdir(args.repo)
    sleeps = [subprocess.Popen(["sleep", "100000"]) for _ in range(160)]
    subprocess.run(["tmux", "-L", TMUX_SOCKET, "kill-server"], capture_output=True)
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(scenario_with([p.pid for p in sleeps]), f)
        tmux("new-session", "-d", "-s", "bench", "-x", "80", "-y", "24", "sleep 100000")
        procs = {
            "dltop": start("dltop", dltop_command(Path(args.repo)), "GPU0", {"DLTOP_FAKE_NVML": f.name}),
            "top": start("procps-top", "top -d 1", "PID"),  # "top" names a pane position in a tmux target
        }
        time.sleep(3)  # start-up settles (each process's command and user are read once)
        screen = tmux("capture-pane", "-p", "-t", "dltop")
        assert "GPU" in screen, screen
        before = {n: cpu_seconds(pid) for n, (pid, *_) in procs.items()}
        threads_before = thread_cpu(procs["dltop"][0])
        t0 = time.monotonic()
        time.sleep(args.seconds)
        dt = time.monotonic() - t0
        cpu = {n: 100 * (cpu_seconds(pid) - before[n]) / dt for n, (pid, *_) in procs.items()}
        threads = {name: 100 * (t - threads_before.get(name, 0.0)) / dt
                   for name, t in thread_cpu(procs["dltop"][0]).items()}
        rss = {n: status_kb(pid, "VmRSS") / 1024 for n, (pid, *_) in procs.items()}
    finally:
        subprocess.run(["tmux", "-L", TMUX_SOCKET, "kill-server"], capture_output=True)
        for p in sleeps:
            p.kill()
            p.wait()
        os.unlink(f.name)
    n_all = sum(1 for d in os.listdir("/proc") if d.isdigit())
    print(f"GPU tab, 8 GPUs x 20 processes (real sleeps on the fake NVML), 80x24, 1 s refresh, {args.seconds:.0f} s; "
          f"{os.cpu_count()} CPUs, {n_all} processes on the machine (top reads them all)")
    print(f"{'':18}{'dltop':>10}{'top':>10}{'dltop/top':>12}   target (dltop)")
    print(f"{'CPU (% of 1 core)':18}{cpu['dltop']:10.2f}{cpu['top']:10.2f}"
          f"{(cpu['dltop'] / cpu['top'] if cpu['top'] else float('inf')):12.1f}   <= 1.0")
    print(f"{'RSS (MB)':18}{rss['dltop']:10.1f}{rss['top']:10.1f}{rss['dltop'] / rss['top']:12.1f}")
    if args.threads:
        print("dltop by thread (% of 1 core; clock ticks of 10 ms, so +/- 0.02 over 60 s):")
        for name, pct in sorted(threads.items(), key=lambda kv: -kv[1]):
            print(f"  {name:16}{pct:8.2f}")
    print("target met" if cpu["dltop"] <= 1.0 else "target NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
