"""The first frame of `dltop` in a real terminal, checkouts side by side: CPU and wall time until the first write
that draws the screen, the peak RSS then, and which of dltop's deferred modules were loaded by then.

Each run is `dltop ARGS` under script(1) (a real pty, 80x24), one run of each checkout in turn, so that the
machine's load falls on all alike. The child wraps Textual's LinuxDriver.write: at the first write that holds
MARK (the tab bar's "Page cache" by default) it notes the monotonic clock and the process's CPU time and leaves.
Wall is counted from before script(1) starts (interpreter start-up included); CPU is the dltop process's own.

usage: python benchmarks/first_frame.py --code /work/main --code . [--runs 7] [--mark TEXT] [-- DLTOP ARGS]
Target (issue 22, item 5): the first frame <= 0.5 s of CPU, all layers.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Modules the first frame does not need; those loaded at the first frame are listed per checkout.
DEFERRED = ("dltop.sources.gpu", "pynvml", "ctypes.util", "http.client", "urllib.request", "dltop.tui.panes.gpu",
            "dltop.tui.panes.datasets", "dltop.tui.panes.cpu", "dltop.tui.panes.training",
            "dltop.tui.panes.caches", "dltop.tui.panes.pagecache")

CHILD = r"""
import json, os, sys, time
OUT, MARK = os.environ["FF_OUT"], os.environ["FF_MARK"]
import textual.drivers.linux_driver as ld
write = ld.LinuxDriver.write
def first(self, data):
    write(self, data)
    if MARK in data:
        wall, cpu = time.monotonic(), time.process_time()
        hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]
        watched = json.loads(os.environ["FF_WATCH"])
        assert sys.modules["dltop"].__file__.startswith(os.environ["PYTHONPATH"]), "another checkout ran"
        with open(OUT, "w") as f:
            json.dump({"wall": wall, "cpu": cpu, "hwm_mb": int(hwm) / 1024,
                       "loaded": [m for m in watched if m in sys.modules]}, f)
        os._exit(0)
ld.LinuxDriver.write = first
from dltop.cli import main
main(sys.argv[1:])
"""


def run_once(code: Path, args: list[str], mark: str, out: Path) -> dict[str, object]:
    out.unlink(missing_ok=True)
    # -P: no current folder on sys.path, which would come before PYTHONPATH and run the caller's checkout.
    child = f"{shlex.quote(sys.executable)} -P -c {shlex.quote(CHILD)} {' '.join(map(shlex.quote, args))}"
    cmd = f"stty cols 80 rows 24; exec {child}"
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(code), "FF_OUT": str(out), "FF_MARK": mark,
           "FF_WATCH": json.dumps(DEFERRED)}
    t0 = time.monotonic()
    subprocess.run(["script", "-qfc", cmd, "/dev/null"], stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                   env=env, timeout=60, check=False, cwd=out.parent)
    d = json.loads(out.read_text())
    d["wall"] = float(d["wall"]) - t0
    d["load"] = os.getloadavg()[0]
    return d


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--code", action="append", required=True, help="a checkout to run (repeat to compare)")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--mark", default="Page cache", help="text of the first frame's write (default: the tab bar)")
    p.add_argument("args", nargs="*", help="dltop's arguments (after --)")
    a = p.parse_args()
    codes = [Path(c).resolve() for c in a.code]
    for code in codes:  # byte-compiled first: the first run would pay for it otherwise
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "dltop")], check=False,
                       stdout=subprocess.DEVNULL)
    rows: dict[Path, list[dict[str, object]]] = {c: [] for c in codes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            for code in codes:
                rows[code].append(run_once(code, a.args, a.mark, Path(tmp) / f"ff{i}.json"))
    for code in codes:
        rs = rows[code]
        print(f"{code}  ({len(rs)} runs, dltop {' '.join(a.args) or '(no arguments)'})")
        for key in ("cpu", "wall", "hwm_mb", "load"):
            vals = [float(r[key]) for r in rs]  # type: ignore[arg-type]
            print(f"  {key:7s} median {statistics.median(vals):7.3f}  [{', '.join(f'{v:.3f}' for v in vals)}]")
        counts = {m: sum(m in r["loaded"] for r in rs) for m in DEFERRED}  # type: ignore[operator]
        print("  loaded at the first frame (runs): "
              + (", ".join(f"{m} {n}/{len(rs)}" for m, n in counts.items() if n) or "none of " + ", ".join(DEFERRED)))
    if len(codes) > 1:
        base = statistics.median(float(r["cpu"]) for r in rows[codes[0]])  # type: ignore[arg-type]
        for code in codes[1:]:
            cpu = statistics.median(float(r["cpu"]) for r in rows[code])  # type: ignore[arg-type]
            print(f"CPU at the first frame, {code.name or code} / {codes[0].name or codes[0]}: {cpu / base:.2f}")


if __name__ == "__main__":
    main()
