"""Capture a real training session of Snapshots (JSON lines) for the Training pane's tests and screenshots: runs
examples/train_tiny.py (real torch, a dataset on disk read cold by DataLoader workers, the probe publishing) and
samples dltop's sources while it trains. The probes part is read from the run's own probe directory only, so
other users' probes on this machine stay out of the file.

usage: python scripts/capture_training.py OUT.jsonl [--interval 0.5] [-- TRAIN_TINY_ARGS...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dltop.config import Settings  # noqa: E402
from dltop.sampler import Sampler  # noqa: E402
from dltop.sources import gpu, memory  # noqa: E402
from dltop.sources.probes import read_probes  # noqa: E402

DEFAULT_TRAIN = ["--epochs", "4", "--files", "256", "--size-kib", "512", "--decode-ms", "8", "--probe-interval", "0.25",
                 "--data-dir", os.path.join(tempfile.gettempdir(), "dltop-capture-data")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("train", nargs="*", help="arguments for train_tiny.py (after --)")
    args = ap.parse_args()
    settings = Settings()
    sampler = Sampler([memory.source(settings), gpu.source(settings)])
    runtime = tempfile.mkdtemp(prefix="dltop-capture-")
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
    cmd = [sys.executable, str(REPO / "examples" / "train_tiny.py"), *(args.train or DEFAULT_TRAIN), "--linger", "30"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    lines = []
    probes_dir = [(os.path.join(runtime, "dltop"), os.getuid())]
    done = threading.Event()

    def echo() -> None:  # train_tiny's lines, and the moment it says it is done
        for line in proc.stdout:  # type: ignore[union-attr]
            sys.stdout.write(line)
            if line.strip() == "done":
                done.set()

    threading.Thread(target=echo, daemon=True).start()
    try:
        done_at = None
        while done_at is None or time.monotonic() < done_at + 2 * args.interval:
            lines.append(dataclasses.replace(sampler.read_once(), probes=read_probes(probes_dir)).to_json())
            if done.is_set() and done_at is None:
                done_at = time.monotonic()
            if proc.poll() is not None:
                break
            time.sleep(args.interval)
    finally:
        proc.kill()
        proc.wait()
        sampler.close()
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} snapshots -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
