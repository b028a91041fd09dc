"""Make screenshots/ from a real run: the live app (real Sampler, this machine's kernel) in a headless terminal,
kept open for minutes (the README's picture is of a session, not of its first seconds) while a background
writer makes the page cache move in rounds and examples/train_tiny.py trains with the probe (the Training tab). Each tab at 120x40, the GPU, page-cache and training panes at 80x24; then the Cluster tab from
scripts/cluster_screenshot.py (a real Prometheus and four `dltop export` nodes).
Without a GPU, the GPU tab plays an NVML scenario file through dltop's fake backend (--gpu-scenario).

usage: python scripts/make_screenshots.py [--seconds 240] [--out DIR]
The Datasets tab is shot once more at 80x24 with the cursor on the dataset found read by the training run
(datasets-found-80x24.svg: no flag names it; the probe's data_dir and its workers' open files do).
--out DIR writes there instead of screenshots/ (and leaves out the Cluster tab's, which its own script writes).
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


async def shoot(size: tuple[int, int], seconds: float, datasets: tuple[str, ...], tabs: bool, found: str = "",
                out: Path = OUT) -> list[Path]:
    settings = Settings(datasets=datasets)
    app = DltopApp(Sampler(build_sources(settings)), settings)
    saved = []
    async with app.run_test(size=size) as pilot:
        await pilot.pause(seconds)
        small = ("gpu", "pagecache", "training", "caches")
        panes = app.panes if tabs else [p for p in app.panes
                                        if p.PANE_ID in small or (found and p.PANE_ID == "datasets")]
        for pane in panes:
            await pilot.press(str(app.panes.index(pane) + 1))
            await pilot.pause(1.5)
            name = f"{pane.PANE_ID}-{size[0]}x{size[1]}.svg"
            if pane.PANE_ID == "datasets" and found:
                name = await _on_found_row(app, pilot, found, size)
            app.save_screenshot(filename=name, path=str(out))
            saved.append(out / name)
    return saved


async def _on_found_row(app: DltopApp, pilot: object, found: str, size: tuple[int, int]) -> str:
    """The cursor on the row of the dataset found read by the training run (waiting for its first scan)."""
    from textual.widgets import DataTable

    table = app.query_one("#ds-table", DataTable)
    for _ in range(60):
        keys = [r.key.value for r in table.ordered_rows]
        if found in keys:
            table.move_cursor(row=keys.index(found))
            break
        await pilot.pause(0.5)  # type: ignore[attr-defined]
    else:
        raise SystemExit(f"the training run's dataset {found} was not found within 30 s")
    await pilot.pause(1.0)  # type: ignore[attr-defined]
    return f"datasets-found-{size[0]}x{size[1]}.svg"


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
    ap.add_argument("--out", type=Path, default=OUT, help="write the screenshots here (default: screenshots/)")
    args = ap.parse_args()
    if args.gpu_scenario and "DLTOP_FAKE_NVML" not in os.environ:
        os.environ["DLTOP_FAKE_NVML"] = args.gpu_scenario  # the rest of the run is this machine, for real
    out: Path = args.out.resolve()
    out.mkdir(exist_ok=True)
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
            saved = asyncio.run(shoot((120, 40), args.seconds, (str(data),), tabs=True, out=out))
            saved += asyncio.run(shoot((80, 24), 3.0, (str(data),), tabs=False,
                                       found=str((Path(tmp) / "train-tiny").resolve()), out=out))
        finally:
            train.kill()
            train.wait()
            stop.set()
            writer.join()
    for p in saved:
        print(p.relative_to(REPO) if p.is_relative_to(REPO) else p)
    if out != OUT.resolve():
        return 0  # the Cluster tab's script writes into screenshots/ only
    # The Cluster tab: a real Prometheus scraping a few `dltop export` nodes (its own script: it starts them)
    if shutil.which("prometheus"):
        subprocess.run([sys.executable, str(REPO / "scripts/cluster_screenshot.py")], check=True)
    else:
        print("no prometheus on PATH: no Cluster screenshots (apt install prometheus)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
