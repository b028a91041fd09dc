"""Make screenshots/ from a real run: the live app (real Sampler, this machine's kernel) in a headless terminal,
kept open for minutes (the README's picture is of a session, not of its first seconds) while a background
writer makes the page cache move in rounds and examples/train_tiny.py trains with the probe (the Training tab). Each tab at 120x40, the GPU, page-cache and training panes at 80x24; then the Cluster tab from
scripts/cluster_screenshot.py (a real Prometheus and four `dltop export` nodes).
Without a GPU, the GPU tab plays an NVML scenario file through dltop's fake backend (--gpu-scenario).

usage: python scripts/make_screenshots.py [--seconds 240]
SVG files, as Textual draws them (a browser shows them; converters such as rsvg-convert collapse the spaces).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dltop.config import Settings  # noqa: E402
from dltop.sampler import Sampler  # noqa: E402
from dltop.sources.registry import build_sources  # noqa: E402
from dltop.tui.app import DltopApp  # noqa: E402
from scripts.capture_session import make_io  # noqa: E402

OUT = REPO / "screenshots"


async def shoot(size: tuple[int, int], seconds: float, datasets: tuple[str, ...], tabs: bool) -> list[Path]:
    settings = Settings(datasets=datasets)
    app = DltopApp(Sampler(build_sources(settings)), settings)
    saved = []
    async with app.run_test(size=size) as pilot:
        await pilot.pause(seconds)
        small = ("gpu", "pagecache", "training", "caches")
        panes = app.panes if tabs else [p for p in app.panes if p.PANE_ID in small]
        for pane in panes:
            await pilot.press(str(app.panes.index(pane) + 1))
            await pilot.pause(1.5)
            name = f"{pane.PANE_ID}-{size[0]}x{size[1]}.svg"
            app.save_screenshot(filename=name, path=str(OUT))
            saved.append(OUT / name)
    return saved


def io_rounds(directory: Path, stop: threading.Event, rest_s: float = 25.0) -> None:
    """make_io again and again, with a rest between rounds: the charts show minutes of a page cache at work."""
    while not stop.is_set():
        make_io(directory, stop)
        stop.wait(rest_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=240.0, help="how long to let history build up first")
    ap.add_argument("--gpu-scenario", default=str(REPO / "tests/data/gpu-scenarios/two-gpus.json"),
                    help="on a machine without GPUs, play this NVML scenario (DLTOP_FAKE_NVML) for the GPU tab; "
                         "'' for this machine's own NVML")
    args = ap.parse_args()
    if args.gpu_scenario and "DLTOP_FAKE_NVML" not in os.environ:
        os.environ["DLTOP_FAKE_NVML"] = args.gpu_scenario  # the rest of the run is this machine, for real
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=REPO) as tmp:
        data = Path(tmp) / "dataset"
        (data / "train").mkdir(parents=True)
        (data / "val").mkdir()
        for i in range(8):
            (data / "train" / f"shard-{i}.bin").write_bytes(bytes(8 << 20))
        (data / "val" / "shard-0.bin").write_bytes(bytes(4 << 20))
        stop = threading.Event()
        writer = threading.Thread(target=io_rounds, args=(Path(tmp), stop), daemon=True)
        writer.start()
        os.environ["XDG_RUNTIME_DIR"] = tmp  # the training run's probe, and only it, for the Training tab
        train = subprocess.Popen([sys.executable, str(REPO / "examples/train_tiny.py"), "--epochs", "1000",
                                  "--files", "128", "--size-kib", "256", "--decode-ms", "3",
                                  "--data-dir", str(Path(tmp) / "train-tiny"), "--linger", "120"],
                                 stdout=subprocess.DEVNULL)
        try:
            saved = asyncio.run(shoot((120, 40), args.seconds, (str(data),), tabs=True))
            saved += asyncio.run(shoot((80, 24), 3.0, (str(data),), tabs=False))
        finally:
            train.kill()
            train.wait()
            stop.set()
            writer.join()
    for p in saved:
        print(p.relative_to(REPO))
    # The Cluster tab: a real Prometheus scraping a few `dltop export` nodes (its own script: it starts them)
    if shutil.which("prometheus"):
        subprocess.run([sys.executable, str(REPO / "scripts/cluster_screenshot.py")], check=True)
    else:
        print("no prometheus on PATH: no Cluster screenshots (apt install prometheus)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
