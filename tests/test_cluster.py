"""The cluster view against a real Prometheus (the Debian package's server) on loopback, scraping several real
`dltop export` processes as nodes, each watching its own dataset at its own residency, two of them with a rank
of one training job: the view's numbers must be fincore's and each exporter's own /metrics, a node that stops
must be down by its second missed scrape, and the Cluster tab must show it at 80x24."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dltop.config import PrometheusOptions, Settings
from dltop.fmt import printable
from dltop.model import Unavailable
from dltop.sources.cluster import PrometheusClient, read_cluster
from dltop.text.cluster import DATASETS_AT, node_row, warm_commands
from tests.conftest import locked_dataset

from .conftest import DATA, REPO
from .probe_helpers import probe_env
from .test_exporter import Exporter, free_port, get, series
from .test_prometheus import binary
from .waiting import until

FILES, FILE_BYTES = 4, 1 << 20
WARM = (0, 2, 4, 1)  # files of each node's dataset read into the page cache (and locked there)
# Node 2 also watches many small files, two in five resident: their pages hold more page cache than their
# apparent size, so page bytes over apparent size says 100% where the share is 42% (what vmtouch says).
SMALL_FILES = 2500
JOB = "cluster-test-job"
# A rank of the job: steps of argv[1] seconds, its loader quick; it publishes every 0.2 s.
RANK = r"""
import sys, time
from dltop import probe
probe.start(interval_s=0.2)
print("ready", flush=True)
step_s = float(sys.argv[1])
for _ in probe.track(iter(int, 1)):
    time.sleep(step_s)
"""


@dataclass
class Fleet:
    prom: str
    exporters: list[Exporter]
    datasets: list[Path]
    names: list[str]

    def client(self) -> PrometheusClient:
        return PrometheusClient(PrometheusOptions(self.prom))

    def raw(self, expr: str) -> Any:
        status, _, body = get(f"{self.prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        assert status == 200, body
        return json.loads(body)["data"]["result"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    prometheus = binary("prometheus")
    tmp = tmp_path_factory.mktemp("cluster")
    locks, exporters, ranks, datasets, names = [], [], [], [], []
    log = None
    proc = None
    try:
        pending = []
        for i, warm in enumerate(WARM):
            # Node 3's dataset has an escape sequence in its name: hostile text all the way to the screen.
            ds = tmp / f"node{i}" / ("data" if i != 3 else "da\x1b[2Jta")
            locks += locked_dataset(ds, FILES, FILE_BYTES, warm)
            datasets.append(ds)
            more = []
            if i == 2:
                small = tmp / "node2" / "small"
                locks += small_files(small, SMALL_FILES)
                more = [str(small)]
            runtime = tmp / f"run{i}"
            runtime.mkdir(mode=0o700)
            if i in (0, 1, 2):  # a rank of one job on each of two nodes (rank 1 steps three times slower), and
                # on node 2 a process whose probe has no job id (no torchrun, no rendezvous): a group of its own
                job = {"TORCHELASTIC_RUN_ID": JOB, "RANK": str(i), "WORLD_SIZE": "2"} if i < 2 else {}
                r = subprocess.Popen([sys.executable, "-c", RANK, "0.02" if i == 0 else "0.06"], cwd=REPO,
                                     env=probe_env(runtime, **job), stdout=subprocess.PIPE, text=True)
                ranks.append(r)
            env = {"XDG_RUNTIME_DIR": str(runtime)}
            if i == 0:
                env["DLTOP_FAKE_NVML"] = str(DATA / "gpu-scenarios" / "h100-2proc.json")
            pending.append(([str(ds), *more], env))
            names.append(f"node-{i}")
        for r in ranks:
            assert r.stdout is not None and r.stdout.readline().strip() == "ready"
        # The exporters start side by side (each waits for its own "serving" line): the fixture's start is the
        # slowest one's, not the sum.
        with ThreadPoolExecutor(len(pending)) as pool:
            # --user: this test's ranks (root's) only: other users' jobs on a shared node are not counted
            starting = [pool.submit(Exporter, *(a for p in paths for a in ("--dataset", p)), "--interval", "0.5",
                                    "--user", str(os.getuid()), env=env)
                        for paths, env in pending]
            for fut in starting:
                with contextlib.suppress(Exception):
                    exporters.append(fut.result())
        assert len(exporters) == len(WARM), [f.exception() for f in starting]
        statics = [{"targets": [f"127.0.0.1:{e.port}"], "labels": {"node": names[i]}} for i, e in enumerate(exporters)]
        statics[1]["labels"] = {"node": names[1], "pod": "trainer-1", "namespace": "ml"}
        config = {"global": {"scrape_interval": "250ms", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "nodes", "scrape_interval": "250ms", "static_configs": statics},
                                     # the first node again under another job: --selector leaves it out
                                     {"job_name": "other", "scrape_interval": "1s",
                                      "static_configs": [{"targets": [f"127.0.0.1:{exporters[0].port}"]}]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 - open for the life of the server
        proc = subprocess.Popen([prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        f = Fleet(f"http://127.0.0.1:{port}", exporters, datasets, names)
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            try:
                ready = (len(f.raw('up{job="nodes"} == 1')) == len(WARM)
                         and len(f.raw('dltop_dataset_resident_ratio{job="nodes"}')) == len(WARM) + 1
                         and len(f.raw(f'dltop_training_steps_total{{job="nodes",job_id="{JOB}"}}')) == 2
                         and len(f.raw('dltop_training_steps_total{job="nodes",job_id=""}')) == 1)
            except (OSError, AssertionError, KeyError):
                ready = False
            if ready:
                break
            assert time.monotonic() < deadline, (f.raw("up"), f.raw("dltop_dataset_resident_bytes"),
                                                 f.raw("dltop_training_steps_total"))
            time.sleep(0.3)
        yield f
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
        if log is not None:
            log.close()
        for e in exporters:
            if e.proc.poll() is None:
                e.stop()
        for r in ranks:
            r.kill()
            r.wait()
        for lock in locks:
            lock.release()


def small_files(path: Path, count: int) -> list[Any]:
    """`count` files of 1 byte to 2.5 KB (every 50th 10 KB: three pages), made cold, then two in five read and
    locked in the page cache (the caller keeps the locks): 42% of the pages, 126% of the apparent size."""
    from dltop.kernel import LockedMapping

    path.mkdir(parents=True)
    sizes = [10_000 if i % 50 == 49 else 1 + (i * 7919) % 2500 for i in range(count)]
    for i, size in enumerate(sizes):
        (path / f"f{i:05d}").write_bytes(os.urandom(size))
    os.sync()
    locks = []
    for i, size in enumerate(sizes):
        fd = os.open(path / f"f{i:05d}", os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if i % 5 >= 3:
            locks.append(LockedMapping(fd, size))
        os.close(fd)
    return locks


def _vmtouch(path: Path) -> tuple[int, int]:
    """vmtouch's (resident pages, pages) of a folder."""
    r = subprocess.run([binary("vmtouch", "vmtouch"), str(path)], capture_output=True, text=True, check=True)
    m = re.search(r"Resident Pages: (\d+)/(\d+)", r.stdout)
    assert m, r.stdout
    return int(m.group(1)), int(m.group(2))


def _fincore(path: Path) -> int:
    files = sorted(str(p) for p in path.iterdir())
    r = subprocess.run([binary("fincore", "util-linux"), "--bytes", "--noheadings", "--raw", "--output", "RES",
                        *files], capture_output=True, text=True, check=True)
    return sum(int(x) for x in r.stdout.split())


def test_the_view_is_fincore_and_each_exporters_metrics(fleet: Fleet) -> None:
    client = fleet.client()
    part = read_cluster(client, 'job="nodes"')
    assert part.queries == client.queries <= 20
    by_name = {n.name: n for n in part.nodes}
    assert sorted(by_name) == fleet.names  # the node labels; the "other" job left out by the selector
    for i, (name, ds, exporter) in enumerate(zip(fleet.names, fleet.datasets, fleet.exporters, strict=True)):
        node = by_name[name]
        assert node.up and node.instance == f"127.0.0.1:{exporter.port}", node
        d = node.datasets[0]
        assert d.dataset == printable(str(ds))  # a label from outside is exported escaped (node 3's ESC as \x1b)
        assert d.resident_bytes == _fincore(ds) == WARM[i] * FILE_BYTES  # what the test warmed, as fincore sees it
        assert d.size_bytes == FILES * FILE_BYTES
        metrics = exporter.metrics()
        assert [node.memory_total_bytes] == list(series(metrics, "dltop_memory_total_bytes").values())
        assert [node.gpu_count] == list(series(metrics, "dltop_gpus").values())
    # The table's GPU numbers are Prometheus' sums of the exporter's; no node's GPUs or ranks are read one by one
    gpu_node = by_name["node-0"]
    metrics = fleet.exporters[0].metrics()
    totals = series(metrics, "dltop_gpu_memory_total_bytes")
    used = series(metrics, "dltop_gpu_memory_used_bytes")
    assert gpu_node.gpus_read == len(totals) > 0 and gpu_node.gpu_memory_total_bytes == sum(totals.values())
    assert gpu_node.gpu_memory_used_bytes == sum(used.values())
    assert all(not n.detailed and n.gpus == () and n.ranks == () for n in part.nodes)
    # Enter's read: node-0's every GPU, its memory by use and its rank, three queries more, no other node's
    detail = read_cluster(client, 'job="nodes"', detail=[(gpu_node.job, gpu_node.instance)])
    assert detail.queries == part.queries + 3 <= 20
    [gpu_node] = [n for n in detail.nodes if n.detailed]
    assert gpu_node.name == "node-0" and len(gpu_node.gpus) == len(totals) and len(gpu_node.ranks) == 1
    assert sorted(g.memory_total_bytes for g in gpu_node.gpus) == sorted(totals.values())  # type: ignore[type-var]
    assert sorted(g.memory_used_bytes for g in gpu_node.gpus) == sorted(used.values())  # type: ignore[type-var]
    by_use = series(metrics, "dltop_gpu_memory_bytes")
    assert sum(sum((g.memory_by_use or {}).values()) for g in gpu_node.gpus) == sum(by_use.values()) > 0
    # the coldest node is first, and only the cold ones are offered a warm
    from dltop.text.cluster import sort_nodes

    assert [n.name for n in sort_nodes(part)][0] == "node-0"
    cmds, _ = warm_commands(part, str(fleet.datasets[0]))
    assert cmds[0].startswith("srun --nodelist=node-0 ") and cmds[0].endswith(f"dltop warm {fleet.datasets[0]}")
    cmds, notes = warm_commands(part, str(fleet.datasets[1]))
    assert cmds == [f"kubectl exec -n ml trainer-1 -- dltop warm {fleet.datasets[1]}"]
    cmds, notes = warm_commands(part, str(fleet.datasets[2]))
    assert cmds == [] and "warm on every node" in notes[0]
    cmds, notes = warm_commands(part, str(fleet.datasets[3]))
    assert cmds == [] and "control characters" in notes[0]  # never pasted into a command line


def test_the_ranks_of_one_job_across_nodes(fleet: Fleet) -> None:
    summary = read_cluster(fleet.client(), 'job="nodes"')
    part = read_cluster(fleet.client(), 'job="nodes"', detail=True)
    for p in (summary, part):
        # the job, then the process with no job id as a group of its own (last), each counted by Prometheus
        assert [(j.job_id, j.rank_count, j.node_count) for j in p.jobs] == [(JOB, 2, 2), ("", 1, 1)]
        job = p.jobs[0]
        assert job.slowest is not None and job.slowest.rank == "1"  # it sleeps three times as long per step
        assert job.most_waiting is not None
        alone = p.jobs[1].slowest
        assert alone is not None and alone.instance == f"127.0.0.1:{fleet.exporters[2].port}" and alone.job_id == ""
    assert summary.jobs[0].ranks == ()
    job = part.jobs[0]
    assert [(r.rank, r.instance) for r in job.ranks] == [
        ("0", f"127.0.0.1:{fleet.exporters[0].port}"), ("1", f"127.0.0.1:{fleet.exporters[1].port}")]
    from dltop.text.cluster import NO_JOB_ID, job_rows

    rows = job_rows(part)
    assert [r[0] for r in rows] == [JOB, NO_JOB_ID] and rows[1][-1].startswith(f"pid {alone.pid} on ")
    for r, exporter in zip(job.ranks, fleet.exporters, strict=False):
        served = series(exporter.metrics(), "dltop_training_step_seconds")
        [(labels, _)] = served.items()
        assert f'job_id="{JOB}"' in labels and f'pid="{r.pid}"' in labels


def test_cli_json_and_text(fleet: Fleet) -> None:
    run = subprocess.run([sys.executable, "-m", "dltop", "cluster", "--prometheus", fleet.prom, "--selector",
                          'job="nodes"', "--json"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert len(doc["nodes"]) == len(WARM) and doc["queries"] <= 20
    resident = sorted(n["datasets"][0]["resident_bytes"] for n in doc["nodes"])
    assert resident == sorted(w * FILE_BYTES for w in WARM)
    assert [j["job_id"] for j in doc["jobs"]] == [JOB, ""]
    assert all(n["detailed"] and len(n["gpus"]) == n["gpu_totals"]["gpus_read"] for n in doc["nodes"])
    deadline = time.monotonic() + 30
    while True:  # no selector: the "other" job's target too, once Prometheus has scraped it (1 s, later when loaded)
        text = subprocess.run([sys.executable, "-m", "dltop", "cluster", "--prometheus", fleet.prom],
                              capture_output=True, text=True, cwd=REPO, timeout=60)
        if "5 nodes" in text.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert text.returncode == 0 and "\x1b" not in text.stdout and "[2Jta" in text.stdout, text.stdout
    assert "5 nodes" in text.stdout, text.stdout
    bad = subprocess.run([sys.executable, "-m", "dltop", "cluster", "--prometheus", fleet.prom, "--selector",
                          'job="a"} or vector(1'], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "selector" in bad.stderr, bad.stderr


async def test_the_cluster_tab_at_80x24(fleet: Fleet) -> None:
    from textual.widgets import DataTable, Footer

    from dltop.sampler import Sampler
    from dltop.sources.cluster import source
    from dltop.tui.app import DltopApp
    from dltop.tui.screens.cluster import ClusterTextScreen

    # The live app, its cluster source reading the real Prometheus: Enter reads the node's detail, then shows it.
    settings = Settings(prometheus=PrometheusOptions(fleet.prom, selector='job="nodes"'))
    app = DltopApp(Sampler([source(settings)]), settings)

    async with app.run_test(size=(80, 24)) as pilot:
        assert app.query_one("#tabs").active == "tab-cluster"  # first when given
        table = app.query_one("#cluster-nodes", DataTable)
        await until(pilot, lambda: table.row_count == len(WARM), "the nodes")
        first = [str(c) for c in table.get_row_at(0)]
        assert first[0] == "node-0" and first[DATASETS_AT] == "0%"  # the coldest first, its dataset cold
        await pilot.pause()
        # The footer was drawn before the first answer: w (there are datasets now) is in it since
        footer = [k.description for k in app.query_one(Footer).children]
        assert "Warm cmds" in footer and "Sort" in footer, footer
        jobs = app.query_one("#cluster-jobs", DataTable)
        assert [str(jobs.get_row_at(i)[0]) for i in range(jobs.row_count)] == [JOB, "(no job id)"]
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ClusterTextScreen), "the node's detail")
        shown = str(app.screen.query_one("#cluster-dialog-text").render())
        assert "(NVIDIA H100" in shown and "  GPU 0 up: " in shown and "    free " in shown and f"job {JOB}" in shown, shown  # per GPU, per rank
        await pilot.press("escape")
        await pilot.press("w")
        await until(pilot, lambda: isinstance(app.screen, ClusterTextScreen), "the warm commands")
        shown = str(app.screen.query_one("#cluster-dialog-text").render())
        assert "srun --nodelist=node-0" in shown and "\x1b" not in shown
        await pilot.press("escape")
        await pilot.press("s")  # by name
        await pilot.pause()
        assert [str(table.get_row_at(i)[0]) for i in range(table.row_count)] == fleet.names


def test_many_small_files_show_the_share_vmtouch_counts(fleet: Fleet) -> None:
    # Node 2's small files: their share is pages over pages (vmtouch's), never page bytes over apparent size
    small = fleet.datasets[2].parent / "small"
    part = read_cluster(fleet.client(), 'job="nodes"')
    node = next(n for n in part.nodes if n.name == "node-2")
    d = node.dataset(printable(str(small)))
    assert d is not None and isinstance(d.size_bytes, int) and isinstance(d.resident_bytes, int)
    resident, pages = _vmtouch(small)
    assert 0.3 < resident / pages < 0.5 and d.share == pytest.approx(resident / pages, abs=1e-9)
    assert d.resident_bytes == resident * os.sysconf("SC_PAGE_SIZE")  # the page cache it holds
    assert d.resident_bytes > d.size_bytes  # the unit error's ground: min(1, bytes / size) said 100%
    datasets = part.datasets
    assert node_row(node, datasets)[DATASETS_AT + datasets.index(d.dataset)] == f"{100 * resident / pages:.0f}%"
    cmds, notes = warm_commands(part, d.dataset)
    assert cmds[0].startswith("srun --nodelist=node-2 ") and notes == []  # cold: a warm is offered


def test_a_node_that_stops_is_down_by_its_second_missed_scrape(fleet: Fleet) -> None:
    # Runs last: node-3's exporter stops. The view is read as of the second scrape after the stop (Prometheus'
    # own timestamps): no wall-clock assertion.
    victim = fleet.exporters[3]
    instance = f"127.0.0.1:{victim.port}"
    victim.stop()
    stopped = time.time()
    deadline = time.monotonic() + 30
    while True:
        [m] = fleet.raw(f'up{{job="nodes",instance="{instance}"}}[20s]')
        after = [float(ts) for ts, _ in m["values"] if float(ts) > stopped]
        if len(after) >= 2:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.3)
    part = read_cluster(fleet.client(), 'job="nodes"', now=lambda: after[1] + 0.001)
    node = next(n for n in part.nodes if n.instance == instance)
    assert not node.up and node.down_reason and "scrape failed" in node.down_reason
    assert isinstance(node.memory_total_bytes, Unavailable)  # no sample: unknown, never 0
    assert sum(n.up for n in part.nodes) == len(WARM) - 1

