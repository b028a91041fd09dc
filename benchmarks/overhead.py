"""What dltop costs while it watches, side by side with htop over the same minute.

Both run in real terminals (tmux panes, 80x24) at a 1 s refresh. For each we measure CPU time from
/proc/PID/stat (utime + stime, children included) over the window, resident memory (VmRSS at the end and VmHWM,
the peak), and the time from start to the first frame on screen (tmux capture-pane polled every 10 ms).

usage: python benchmarks/overhead.py [--seconds 60] [--code CHECKOUT] [--gpu-scenario FILE | --all-layers [--settle 40]]
Targets (issue 2, tightened by issue 22): dltop <= 0.5% of one core at 1 s refresh on the Page cache tab,
<= 80 MB resident, first frame <= 0.5 s.

--all-layers runs every layer at once (issue 22, item 5): dltop watches a 100,000 x 4 KiB dataset (made in
--dataset-dir once), scrapes a vLLM-like server (a local HTTP server answering /metrics with a real vLLM
payload from ../shared/fixtures/metrics), shows a probe job (a process that publishes with dltop.probe and
iterates a tracked loader) and a 2,000-file inductor-like cache. Targets: <= 1.5% of a core, <= 80 MB,
first frame <= 0.5 s; the plain run (nothing watched, the Page cache tab) <= 0.5%.

--gpu-scenario FILE runs dltop on the fake NVML backend playing that scenario (DLTOP_FAKE_NVML), its GPU tab
(the first) visible, e.g. tests/data/gpu-scenarios/8gpu-20proc.json: 8 GPUs, 20 processes each. The baseline is
still htop: nvtop needs a GPU and its driver, which a machine running the fake does not have (issue 9: <= 1% of
a core with the GPU pane visible).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    name: str
    first_frame_s: float
    first_cpu_s: float
    cpu_pct: float
    rss_mb: float
    hwm_mb: float


# The benchmarks' own tmux server; DLTOP_BENCH_TMUX names another, so two benchmarks run at once do not kill
# each other's sessions.
TMUX_SOCKET = os.environ.get("DLTOP_BENCH_TMUX", "dltop-bench")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", TMUX_SOCKET, *args], capture_output=True, text=True, check=True).stdout


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime, stime, cutime, cstime are fields 14-17 (1-based) of the whole line; here offset by the 2 cut off.
    return sum(int(x) for x in fields[11:15]) / TICKS


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def start(name: str, command: str, marker: str, env: dict[str, str] | None = None) -> tuple[int, float, float]:
    """Start `command` in its own 80x24 tmux window; return its PID, seconds until `marker` is on screen and the
    CPU seconds it had used by then."""
    t0 = time.monotonic()
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    tmux("new-window", "-d", "-n", name, f"exec env {prefix}{command}")
    pid = int(tmux("list-panes", "-t", name, "-F", "#{pane_pid}").split()[0])
    while time.monotonic() - t0 < 20:
        if marker in tmux("capture-pane", "-p", "-t", name):
            return pid, time.monotonic() - t0, cpu_seconds(pid)
        time.sleep(0.01)
    raise RuntimeError(f"{name}: no first frame with {marker!r} within 20 s")


def dltop_command(code: Path) -> str:
    """dltop from the checkout `code` (PYTHONPATH), compiled first as an install compiles it: a run with
    PYTHONDONTWRITEBYTECODE set would otherwise compile every module at every start (~0.15 s of CPU)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "dltop")], check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""})
    return f"env PYTHONPATH={shlex.quote(str(code))} {shlex.quote(sys.executable)} -m dltop --refresh 1"


# A vLLM-like server: any GET answers the fixture (a real vLLM /metrics payload), as text exposition 0.0.4.
SERVER = """
import http.server, sys
body = open(sys.argv[1], "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""

# A probe job: publishes with dltop.probe once a second and iterates a tracked loader 200 items a second.
PROBE_JOB = """
import time
from dltop import probe
probe.start()
for _ in probe.track(iter(range(10**9)), name="train"):
    time.sleep(0.005)
"""


def all_layers(args: argparse.Namespace, keep: list[subprocess.Popen[str]]) -> tuple[str, str, dict[str, str]]:
    """dltop's extra arguments, the probe's runtime folder and its env for --all-layers; starts the server and
    the probe job (in `keep`, for the caller to stop)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from caches import make_cache
    from watch import make_tree

    base = Path(args.dataset_dir)
    make_tree(base / "data", 100_000, 4096)
    cache = make_cache(base / "cache", 2_000)
    fixture = REPO.parent / "shared" / "fixtures" / "metrics" / "vllm-0.4.x-v0-datadog-integrations-core.prom"
    if not fixture.is_file():
        fixture = Path("/work/shared/fixtures/metrics/vllm-0.4.x-v0-datadog-integrations-core.prom")
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(fixture)], stdout=subprocess.PIPE, text=True)
    keep.append(server)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    runtime = base / "run"
    runtime.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(args.code)}
    keep.append(subprocess.Popen([sys.executable, "-c", PROBE_JOB], env=env, text=True))
    extra = f"{shlex.quote(str(base / 'data'))} --server 127.0.0.1:{port} --cache {shlex.quote(str(cache))}"
    return extra, str(runtime), {"XDG_RUNTIME_DIR": str(runtime)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window (default 60)")
    ap.add_argument("--gpu-scenario", metavar="FILE", help="dltop on the fake NVML playing FILE, its GPU tab shown")
    ap.add_argument("--all-layers", action="store_true", help="a dataset, a server, a probe job and a cache at once")
    ap.add_argument("--dataset-dir", default="/var/tmp/dltop-overhead", help="where --all-layers makes its trees")
    ap.add_argument("--code", default=str(REPO), help="the dltop checkout to run (another one: before/after)")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds between the first frame and the window (--all-layers: the first full scans)")
    args = ap.parse_args()
    code = Path(args.code).resolve()
    if args.gpu_scenario and not Path(args.gpu_scenario).is_file():
        print(f"overhead: no scenario file {args.gpu_scenario}", file=sys.stderr)
        return 1
    for tool in ("tmux", "htop"):
        if not shutil.which(tool):
            print(f"overhead: {tool} not found (apt-get install {tool})", file=sys.stderr)
            return 1
    # tmux's windows start in this process's working directory, and `python -m dltop` puts that first on
    # sys.path: started from another checkout's folder, --code ran that folder's code (as gpu_tab.py's --repo did)
    if args.gpu_scenario:
        args.gpu_scenario = str(Path(args.gpu_scenario).resolve())
    args.dataset_dir = str(Path(args.dataset_dir).resolve())
    os.chdir(code)
    subprocess.run(["tmux", "-L", TMUX_SOCKET, "kill-server"], capture_output=True)
    tmux("new-session", "-d", "-s", "bench", "-x", "80", "-y", "24", "sleep 100000")
    env_note = f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    keep: list[subprocess.Popen[str]] = []
    try:
        if args.all_layers:
            extra, _runtime, env = all_layers(args, keep)
            dl = start("dltop", f"{dltop_command(code)} {extra}", "Page cache", env)
        elif args.gpu_scenario:
            dl = start("dltop", dltop_command(code), "GPU0", {"DLTOP_FAKE_NVML": str(Path(args.gpu_scenario).resolve())})
        else:
            dl = start("dltop", dltop_command(code), "Page cache")
        procs = {
            "dltop": dl,
            "htop": start("htop", "htop -d 10", "Mem"),  # -d is in tenths of a second
        }
        time.sleep(args.settle)  # let start-up work settle: the window measures steady-state monitoring
        before = {n: cpu_seconds(pid) for n, (pid, _, _) in procs.items()}
        t0 = time.monotonic()
        time.sleep(args.seconds)
        dt = time.monotonic() - t0
        results = []
        for n, (pid, first, first_cpu) in procs.items():
            used = cpu_seconds(pid) - before[n]
            results.append(Result(n, first, first_cpu, 100 * used / dt, status_kb(pid, "VmRSS") / 1024,
                                  status_kb(pid, "VmHWM") / 1024))
    finally:
        subprocess.run(["tmux", "-L", TMUX_SOCKET, "kill-server"], capture_output=True)
        for p in keep:
            p.terminate()
            p.wait()
    d, h = results
    shown = f", GPU tab on {Path(args.gpu_scenario).name} (fake NVML)" if args.gpu_scenario else ""
    if args.all_layers:
        shown = ", all layers: a 100,000-file dataset, a vLLM /metrics server, a probe job, a 2,000-file cache"
    cpu_target = 1.5 if args.all_layers else 0.5
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"overhead over {args.seconds:.0f} s at 1 s refresh, 80x24 terminal{shown} ({env_note}; load {load})")
    print(f"{'':18}{'dltop':>10}{'htop':>10}{'dltop/htop':>12}   target (dltop)")
    print(f"{'first frame (s)':18}{d.first_frame_s:10.3f}{h.first_frame_s:10.3f}"
          f"{d.first_frame_s / h.first_frame_s:12.1f}   <= 0.5")
    print(f"{'  its CPU (s)':18}{d.first_cpu_s:10.3f}{h.first_cpu_s:10.3f}"
          f"{(d.first_cpu_s / h.first_cpu_s if h.first_cpu_s else float('inf')):12.1f}")
    print(f"{'CPU (% of 1 core)':18}{d.cpu_pct:10.2f}{h.cpu_pct:10.2f}"
          f"{(d.cpu_pct / h.cpu_pct if h.cpu_pct else float('inf')):12.1f}   <= {cpu_target}")
    print(f"{'RSS now (MB)':18}{d.rss_mb:10.1f}{h.rss_mb:10.1f}{d.rss_mb / h.rss_mb:12.1f}   <= 80")
    print(f"{'RSS peak (MB)':18}{d.hwm_mb:10.1f}{h.hwm_mb:10.1f}{d.hwm_mb / h.hwm_mb:12.1f}")
    ok = d.cpu_pct <= cpu_target and d.hwm_mb <= 80 and d.first_frame_s <= 0.5
    print("targets met" if ok else "targets NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
