"""A 256-node fleet in a real Prometheus (Debian's server, its samples backfilled with `promtool tsdb
create-blocks-from openmetrics`, as benchmarks/cluster.py does): gpu-0031's exporter has been down since before
any lookback (it last served 2 hours ago, `up` is 0 since), gpu-0100's for 20 minutes, and a node_exporter job
beside them has a target down too. The view lists all 256 nodes of the job that serves dltop's metrics, the two
down with since when, none of the other job's; gpu-0031 was the only node where the dataset is cold, so `w` says
it could not be judged instead of "warm on every node that watches it"."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from dltop.config import PrometheusOptions
from dltop.model.cluster import ClusterPart
from dltop.sources.cluster import PrometheusClient, read_cluster
from dltop.text.cluster import summary_line, warm_commands

from .test_exporter import free_port
from .test_prometheus import binary

NODES = 256
DATASET = "/data/imagenet"
GONE_LONG, GONE_LATELY = 31, 100  # down since 2 h (before the 1 h lookback), and since 20 minutes


def _openmetrics(end: int) -> str:
    """The fleet's series: a node that is up has samples over the last 2 minutes; a down one's dltop series end
    when it went down, and its `up` is 0 over the last 2 minutes. A node_exporter job: its own targets, one down."""
    lines: dict[str, list[str]] = {}

    def add(name: str, labels: dict[str, str], value: float, times: range) -> None:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.setdefault(name, []).extend(f"{name}{{{text}}} {value} {t}" for t in times)

    recent = range(end - 120, end + 1, 15)
    for n in range(NODES):
        node = {"job": "dltop", "instance": f"gpu-{n:04d}:19400", "node": f"gpu-{n:04d}"}
        gone = {GONE_LONG: 7200, GONE_LATELY: 1200}.get(n)
        served = range(end - gone - 120, end - gone + 1, 15) if gone else recent
        add("up", node, 0.0 if gone else 1.0, recent)
        add("dltop_snapshot_timestamp_seconds", node, float(end - gone if gone else end), served)
        ds = {**node, "dataset": DATASET}
        add("dltop_dataset_up", ds, 1.0, served)
        add("dltop_dataset_size_bytes", ds, 150e9, served)
        add("dltop_dataset_resident_bytes", ds, 30e9 if n == GONE_LONG else 150e9, served)
        add("dltop_dataset_resident_ratio", ds, 0.2 if n == GONE_LONG else 1.0, served)
        add("up", {"job": "node", "instance": f"gpu-{n:04d}:9100"}, 0.0 if n == 7 else 1.0, recent)
    out = []
    for name, samples in lines.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(sorted(samples, key=lambda s: int(s.rsplit(" ", 1)[1])))
    return "\n".join([*out, "# EOF", ""])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    prometheus, promtool = binary("prometheus"), binary("promtool")
    tmp = tmp_path_factory.mktemp("fleet")
    end = int(time.time()) - 60
    (tmp / "fleet.om").write_text(_openmetrics(end))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "fleet.om"), str(tmp / "data")],
                   check=True, capture_output=True, timeout=120)
    (tmp / "p.yml").write_text("global: {scrape_interval: 15s}\n")
    port = free_port()
    with open(tmp / "prometheus.log", "w") as log:
        proc = subprocess.Popen([prometheus, f"--config.file={tmp / 'p.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
                try:
                    with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-3000:]
                time.sleep(0.2)
            yield url, end + 1.0
        finally:
            proc.terminate()
            proc.wait(20)


def _read(fleet: tuple[str, float]) -> ClusterPart:
    url, at = fleet
    return read_cluster(PrometheusClient(PrometheusOptions(url)), now=lambda: at)


def test_every_node_of_the_dltop_job_is_listed_and_the_down_ones_say_since_when(fleet: tuple[str, float]) -> None:
    part = _read(fleet)
    assert len(part.nodes) == NODES and {n.job for n in part.nodes} == {"dltop"}  # not node_exporter's targets
    down = {n.name: n for n in part.nodes if not n.up}
    assert sorted(down) == [f"gpu-{GONE_LONG:04d}", f"gpu-{GONE_LATELY:04d}"]
    long_gone, lately = down[f"gpu-{GONE_LONG:04d}"], down[f"gpu-{GONE_LATELY:04d}"]
    assert long_gone.down_reason == "the last scrape failed (up is 0); no reading in the last 1h"
    assert lately.down_reason == "the last scrape failed (up is 0); its newest reading is 20m01s old"
    assert lately.snapshot_age_s == 1201.0 and long_gone.datasets == () and lately.datasets == ()
    assert summary_line(part).startswith(f"{NODES} nodes (2 down)")


def test_w_names_the_down_nodes_it_could_not_judge(fleet: tuple[str, float]) -> None:
    # gpu-0031 is the only node where the dataset was cold (20% when it last served): it is down, so no node is
    # judged cold, and the note says the two down ones could not be judged.
    cmds, notes = warm_commands(_read(fleet), DATASET)
    assert cmds == []
    assert notes == [f"{DATASET} is warm on every node that could be judged",
                     f"not judged: 2 nodes down: gpu-[{GONE_LONG:04d},{GONE_LATELY:04d}]"]
