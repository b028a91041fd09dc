"""Capture a short real session of Snapshots (JSON lines) while writing and re-reading a file, for the TUI's
deterministic tests and screenshots: Dirty and Writeback rise, Cached grows, the disk gets busy.

usage: python scripts/capture_session.py OUT.jsonl [--seconds 20] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dltop.config import Settings  # noqa: E402
from dltop.sampler import Sampler  # noqa: E402
from dltop.sources.registry import build_sources  # noqa: E402


def make_io(directory: Path, stop: threading.Event) -> None:
    """Write 1.5 GiB in 64 MiB steps without fsync (dirty pages, then writeback), then read it back, then evict."""
    path = directory / "dltop-capture.bin"
    block = os.urandom(1 << 20)
    try:
        with open(path, "wb") as f:
            for _ in range(24):
                if stop.is_set():
                    return
                for _ in range(64):
                    f.write(block)
                time.sleep(0.25)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 1 << 22) and not stop.is_set():
                pass
            time.sleep(2)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--dir", default=".")
    args = ap.parse_args()
    sampler = Sampler(build_sources(Settings()))
    stop = threading.Event()
    worker = threading.Thread(target=make_io, args=(Path(args.dir), stop), daemon=True)
    lines = []
    end = time.monotonic() + args.seconds
    lines.append(sampler.read_once().to_json())
    worker.start()
    while time.monotonic() < end:
        time.sleep(args.interval)
        lines.append(sampler.read_once().to_json())
    stop.set()
    worker.join()
    sampler.close()
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} snapshots -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
