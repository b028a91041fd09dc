"""What basic auth costs `dltop export`: the latency of a 401 for an unknown user and for a wrong password (a gap
between the two tells an attacker which names exist), and the exporter's CPU over 100 scrapes with the same bad
credentials (a scraper left with an old password).

The exporter runs in a child process (the real HTTP server, a web config with one user whose hash has --cost);
CPU is its utime + stime from /proc/PID/stat. With --before DIR the same is measured with the dltop package
found in DIR (e.g. an older commit: `git archive REV dltop | tar -x -C DIR`) and the ratios are printed.

usage: python benchmarks/auth.py [--cost 12] [--samples 15] [--scrapes 100] [--before DIR] [--json]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")

SERVE = """
import sys
import dltop.exporter.webconfig
from dltop.exporter.collector import SnapshotCollector
from dltop.exporter.server import ExporterServer
from dltop.exporter.webconfig import load_web_config
server = ExporterServer("127.0.0.1:0", SnapshotCollector(), load_web_config(sys.argv[1]))
server.start()
print(server.port, dltop.exporter.webconfig.__file__, flush=True)
sys.stdin.read()  # until the benchmark closes it
"""


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def status(url: str, user: str, password: str) -> int:
    header = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": header}), timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def measure(pythonpath: str, web: Path, samples: int, scrapes: int) -> dict[str, Any]:
    """Latency medians (ms) of both kinds of 401 and the CPU (s) of `scrapes` identical bad scrapes."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(web)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": pythonpath},
                            cwd=pythonpath)  # -c puts the cwd first on sys.path: the package measured is DIR's
    try:
        assert proc.stdout is not None
        port, code = proc.stdout.readline().split(maxsplit=1)
        url = f"http://127.0.0.1:{port}/metrics"
        assert status(url, "prom", "s3cret") == 200
        unknown_ms: list[float] = []
        wrong_ms: list[float] = []
        for i in range(samples):  # interleaved, each a name or password not seen before (nothing remembered)
            for user, password, into in ((f"nobody-{i}", "s3cret", unknown_ms), ("prom", f"wrong-{i}", wrong_ms)):
                t0 = time.perf_counter()
                assert status(url, user, password) == 401
                into.append((time.perf_counter() - t0) * 1000)
        before = cpu_s(proc.pid)
        for _ in range(scrapes):
            assert status(url, "prom", "old-password") == 401
        cpu = cpu_s(proc.pid) - before
        return {"unknown_user_ms": statistics.median(unknown_ms), "wrong_password_ms": statistics.median(wrong_ms),
                "bad_scrapes": scrapes, "bad_scrapes_cpu_s": cpu,
                "code": code.strip()}
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(30)


def main() -> None:
    """Measure, print a table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost", type=int, default=12, help="bcrypt cost of the user's hash (htpasswd -C)")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--scrapes", type=int, default=100)
    ap.add_argument("--before", metavar="DIR", help="also measure the dltop package in DIR, and the ratios")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import bcrypt

    with tempfile.TemporaryDirectory() as tmp:
        web = Path(tmp) / "web.yml"
        hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=args.cost)).decode()
        web.write_text(f"basic_auth_users:\n  prom: {hashed}\n")
        runs = {"after": measure(str(REPO), web, args.samples, args.scrapes)}
        if args.before:
            runs["before"] = measure(args.before, web, args.samples, args.scrapes)
    if args.json:
        print(json.dumps({"cost": args.cost, **runs}, indent=2))
        return
    print(f"bcrypt cost {args.cost}; medians of {args.samples} 401s each; {args.scrapes} scrapes with one bad password")
    print(f"{'':8} {'unknown user':>14} {'wrong password':>15} {'unknown/wrong':>14} {'CPU of bad scrapes':>19}")
    for name, r in runs.items():
        print(f"{name:8} {r['unknown_user_ms']:11.1f} ms {r['wrong_password_ms']:12.1f} ms "
              f"{r['unknown_user_ms'] / r['wrong_password_ms']:14.2f} {r['bad_scrapes_cpu_s']:17.2f} s  {r['code']}")
    if "before" in runs:
        b, a = runs["before"], runs["after"]
        ratio = b["bad_scrapes_cpu_s"] / max(a["bad_scrapes_cpu_s"], 1 / TICKS)  # one clock tick at least
        print(f"CPU of the bad scrapes, before/after: {ratio:.0f}x")


if __name__ == "__main__":
    main()
