"""Make screenshots/cluster-*.svg from a real run: Debian's Prometheus on loopback scraping four real `dltop export`
processes as nodes, each watching its own dataset at its own residency (two with GPUs from an NVML scenario file,
two with a rank of one training job, one with a process that has no job id), read by the live Cluster tab.

usage: python scripts/cluster_screenshot.py     (make_screenshots.py runs it too; needs prometheus on PATH)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dltop.config import PrometheusOptions, Settings  # noqa: E402
from dltop.sampler import Sampler  # noqa: E402
from dltop.sources.cluster import source  # noqa: E402
from dltop.tui.app import DltopApp  # noqa: E402

OUT = REPO / "screenshots"
SCENARIO = REPO / "tests/data/gpu-scenarios/two-gpus.json"
NODES = ("gpu-a01", "gpu-a02", "gpu-b01", "gpu-b02")
WARM = (8, 2, 6, 0)  # of 8 shards of 4 MiB, read into the page cache on each node
JOB = "llama-ft-run-42"
RANK = r"""
import sys, time
from dltop import probe
probe.start(interval_s=0.5)
print("ready", flush=True)
for _ in probe.track(iter(int, 1)):
    time.sleep(float(sys.argv[1]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dataset(path: Path, warm: int) -> None:
    """8 shards of 4 MiB, the first `warm` of them read into the page cache, the rest dropped from it."""
    path.mkdir(parents=True)
    for i in range(8):
        (path / f"shard-{i:02d}.bin").write_bytes(os.urandom(4 << 20))
    os.sync()
    for i in range(8):
        with open(path / f"shard-{i:02d}.bin", "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            if i < warm:
                f.read()


def query(url: str, expr: str) -> list[object]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=5) as r:
        return list(json.load(r)["data"]["result"])


async def shoot(url: str) -> list[Path]:
    from textual.widgets import DataTable

    from dltop.tui.screens.cluster import ClusterTextScreen

    saved = []
    for size in ((120, 40), (80, 24)):
        settings = Settings(prometheus=PrometheusOptions(url))
        app = DltopApp(Sampler([source(settings)]), settings)
        async with app.run_test(size=size) as pilot:
            table = app.query_one("#cluster-nodes", DataTable)
            deadline = time.monotonic() + 30
            while table.row_count < len(NODES) and time.monotonic() < deadline:
                await pilot.pause(0.2)
            await pilot.pause(1.0)
            name = f"cluster-{size[0]}x{size[1]}.svg"
            app.save_screenshot(filename=name, path=str(OUT))
            saved.append(OUT / name)
            if size == (80, 24):  # a GPU node's detail, as Enter reads it
                await pilot.press("down", "enter")
                while not isinstance(app.screen, ClusterTextScreen) and time.monotonic() < deadline:
                    await pilot.pause(0.2)
                await pilot.pause(0.5)
                app.save_screenshot(filename="cluster-node-80x24.svg", path=str(OUT))
                saved.append(OUT / "cluster-node-80x24.svg")
    return saved


def main() -> int:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("needs Debian's prometheus package", file=sys.stderr)
        return 2
    OUT.mkdir(exist_ok=True)
    procs: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="dltop-shot-") as tmp_text:
        tmp = Path(tmp_text)
        try:
            targets = []
            # As root, each node's exporter runs in a mount namespace of its own where one path (c4-shards) is
            # that node's copy of the dataset: one dataset at four residencies, as on four machines.
            shared = tmp / "c4-shards" if os.geteuid() == 0 and shutil.which("unshare") else None
            if shared is not None:
                shared.mkdir()
            for i, (name, warm) in enumerate(zip(NODES, WARM, strict=True)):
                ds = tmp / name / "c4-shards"
                dataset(ds, warm)
                run = tmp / name / "run"
                run.mkdir(mode=0o700)
                env = {**os.environ, "XDG_RUNTIME_DIR": str(run)}
                env.pop("DLTOP_PROBE", None)
                if i < 2:
                    env["DLTOP_FAKE_NVML"] = str(SCENARIO)
                if i < 3:  # ranks 0 and 1 of one job, and a process that gave no job id
                    job = {"TORCHELASTIC_RUN_ID": JOB, "RANK": str(i), "WORLD_SIZE": "2"} if i < 2 else {}
                    procs.append(subprocess.Popen([sys.executable, "-c", RANK, ("0.08", "0.13", "0.3")[i]],
                                                  cwd=REPO, env={**env, **job}, stdout=subprocess.PIPE, text=True))
                port = free_port()
                cmd = [sys.executable, "-m", "dltop", "export", "--listen", f"127.0.0.1:{port}", "--interval", "0.5",
                       "--dataset", str(shared or ds)]
                if shared is not None:
                    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           'mount --bind "$0" "$1" && shift && exec "$@"', str(ds), str(shared), *cmd[:-1], str(shared)]
                exporter = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
                procs.append(exporter)
                assert exporter.stderr is not None
                while "dltop export: serving" not in (line := exporter.stderr.readline()):
                    assert line, f"{name}'s exporter ended"
                targets.append({"targets": [f"127.0.0.1:{port}"], "labels": {"node": name}})
            (tmp / "prometheus.yml").write_text(json.dumps(
                {"global": {"scrape_interval": "500ms"}, "scrape_configs": [
                    {"job_name": "dltop", "static_configs": targets}]}))
            port = free_port()
            log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 - the server's life
            procs.append(subprocess.Popen([prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                           f"--storage.tsdb.path={tmp / 'tsdb'}",
                                           f"--web.listen-address=127.0.0.1:{port}"], stdout=log,
                                          stderr=subprocess.STDOUT))
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (len(query(url, "up == 1")) == len(NODES)
                            and len(query(url, "dltop_dataset_resident_bytes")) == len(NODES)
                            and len(query(url, "dltop_training_step_seconds")) == 3):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    print((tmp / "prometheus.log").read_text()[-2000:], file=sys.stderr)
                    return 1
                time.sleep(0.5)
            time.sleep(3)  # a few step times in, so each rank's mean is its own
            saved = asyncio.run(shoot(url))
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(20)
    for p in saved:
        print(p.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
