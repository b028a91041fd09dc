"""`dltop report` over a 7-day recording at 1 s (604,800 samples), whole process, on the machine of record.py.

  python benchmarks/report.py                        # make the week (in a temp dir), time `dltop report` on it
  python benchmarks/report.py --keep DIR             # keep the recording made, in DIR
  python benchmarks/report.py --recording DIR        # time the report on a recording kept before
  python benchmarks/report.py --before CHECKOUT      # also time CHECKOUT's dltop (an older one) on --before-hours
                                                     # of it, and extrapolate to the week

The week is made fast: one hour of record.py's moving Snapshots (4 GPUs x 5 processes, 5 datasets, this
machine's memory and CPU parts) goes through the real Recorder once; its open segment is then stamped 168 times
an hour apart (the same 3,600 distinct Snapshots each hour, their times moved) and sealed by the writer's own
`compress_segment` with the writer's per-sample values, as the recorder seals each hour. Reported: its size per
day, and the wall and CPU time of `python -m dltop report DIR` (stdout a pipe, so no progress line) over the
week, over a day, and over an hour in the middle.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from record import base_snapshot, dir_bytes, moving  # noqa: E402

from dltop.recorder import Recorder, Recording, store  # noqa: E402
from dltop.recorder.segment import compress_segment  # noqa: E402
from dltop.recorder.summary import sample_values  # noqa: E402
from dltop.recorder.writer import BLOCK_SAMPLES  # noqa: E402

HOUR = 3600


def make_week(rec_dir: Path, work: Path, days: float) -> None:
    """`days` of 1 s samples in rec_dir: one real recorded hour, restamped hour after hour and sealed."""
    base = base_snapshot(work)
    t0 = time.time() - days * 86400 - 60
    snaps = list(moving(base, HOUR, t0))
    a = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dltop-hour-") as tmp, \
            Recorder(tmp, retain_s=None, max_bytes=None, segment_s=2 * HOUR, warn=lambda _t: None) as rec:
        for s in snaps:
            rec.write(s, wait=True)
        while rec.samples < len(snaps):
            time.sleep(0.01)
        (seg,) = [p for p in Path(tmp).iterdir() if p.name.endswith(store.OPEN_SUFFIX)]
        template = [store.check_line(line)[0] for line in seg.read_bytes().splitlines()]
    print(f"one hour through the real Recorder: {time.perf_counter() - a:.1f} s")
    values = [(s.ts, sample_values(s)) for s in snaps]
    heads = [store.line_prefix(line) for line in template]
    rec_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    hours = int(days * 24)
    a = time.perf_counter()
    for h in range(hours):
        shift = h * HOUR
        out = []
        for line, head in zip(template, heads, strict=True):
            assert head is not None
            ts, kind = head
            if kind == "event" and (h > 0 or b'"kind":"start"' not in line):
                continue  # one start for the week (and hints once): not 168 runs that ended without a stop
            # The line's time and the Snapshot's own ("ts": both, the same repr); other times stay as recorded.
            out.append(line.replace(b'"ts":' + repr(ts).encode(), b'"ts":' + repr(ts + shift).encode()))
        if h == hours - 1:
            out.append(store.encode_line(snaps[-1].ts + shift, "event", {"kind": "stop", "data": {}}, checksum=False)
                       .rstrip(b"\n"))
        stem = store.segment_stem(snaps[0].ts + shift, str(rec_dir))
        (rec_dir / (stem + store.OPEN_SUFFIX)).write_bytes(b"\n".join(out) + b"\n")
        compress_segment(str(rec_dir), stem, BLOCK_SAMPLES, [(ts + shift, v) for ts, v in values])
    print(f"{hours} hours restamped and sealed: {time.perf_counter() - a:.0f} s")


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall and CPU seconds of a whole process, and its stdout."""
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    a = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    took = time.perf_counter() - a
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return took, (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime), r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=float, default=7.0, help="length of the recording (default 7)")
    ap.add_argument("--keep", metavar="DIR", help="write the recording into DIR and keep it")
    ap.add_argument("--recording", metavar="DIR", help="time the report on this recording; write none")
    ap.add_argument("--before", metavar="CHECKOUT", help="also time this checkout's dltop (decoding every sample)")
    ap.add_argument("--before-hours", type=float, default=24.0, help="the span the older dltop reads (default 24)")
    ap.add_argument("--width", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dltop-bench-") as tmp:
        rec_dir = Path(args.recording or args.keep or Path(tmp) / "rec")
        if not args.recording:
            make_week(rec_dir, Path(tmp), args.days)
        r = Recording(str(rec_dir))
        first, last = r.first_ts or 0.0, r.last_ts or 0.0
        span_days = (last - first) / 86400
        size = dir_bytes(rec_dir)
        print(f"recording: {len(r)} samples over {span_days:.2f} days, {size / 1e6:.0f} MB = "
              f"{size / max(span_days, 1e-9) / 1e6:.1f} MB per day  [target <= 25 MB per day]")
        del r
        report = [sys.executable, "-m", "dltop", "report", str(rec_dir), "--width", str(args.width)]
        mid = first + (last - first) / 2
        for what, extra in (("the whole recording", []),
                            ("a day", ["--from", repr(mid - 43200), "--to", repr(mid + 43200)]),
                            ("an hour", ["--from", repr(mid - 1800), "--to", repr(mid + 1800)])):
            wall, cpu, out = timed(report + extra, REPO)
            samples = next((ln for ln in out.splitlines() if " samples every " in ln), "").split("), ")[-1]
            print(f"dltop report, {what}: {wall:.1f} s wall, {cpu:.1f} CPU-s ({samples.split(' every')[0]})"
                  f"{'  [target <= 30 s]' if not extra else ''}")
        if args.before:
            checkout = Path(args.before).resolve()
            span = args.before_hours * 3600
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            wall, cpu, _ = timed([sys.executable, "-m", "dltop", "report", str(rec_dir), "--width", str(args.width),
                                  "--from", repr(first), "--to", repr(first + span)], checkout, env)
            week = (last - first) / span
            print(f"before ({checkout}), {args.before_hours:g} h: {wall:.1f} s wall, {cpu:.1f} CPU-s; the whole "
                  f"recording at that rate: ~{wall * week:.0f} s wall, ~{cpu * week:.0f} CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
