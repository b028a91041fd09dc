"""dltop/fields.py: every field named in Prometheus' conventions, and the samples of real Snapshot parts — /proc
captured from this machine, files the test made and scanned, every fake-NVML scenario, real vLLM and SGLang
payloads over HTTP, a real probe file — checked against the text they came from, never against typed-in numbers."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dltop import probe
from dltop.fields import FIELDS, HINT_ACTIVE, Field, hint_samples, samples
from dltop.hints import Hint
from dltop.model import ProbesPart, ServerStats, Snapshot, Unavailable
from dltop.model.datasets import DatasetsPart, FoundDataset, FoundReader
from dltop.model.gpu import SPLIT_FIELDS, MemorySplit
from dltop.probe.files import open_private_dir, write_atomic
from dltop.residency.scan import scan_paths
from dltop.sampler import Sampler
from dltop.sources.base import Source
from dltop.sources.gpu import FakeBackend, GpuReader
from dltop.sources.memory import read_memory
from dltop.sources.probes import read_probes
from dltop.sources.servers import read_server

from .conftest import DATA, REPO, SHARED_FIXTURES, write_cgroup_tree
from .test_servers import LLAMA2, _hub

SCENARIOS = DATA / "gpu-scenarios"
METRICS = SHARED_FIXTURES / "metrics"
UNIT_IN_NAME = {"bytes", "seconds", "ratio", "tokens", "celsius", "watts", "hertz"}


def by_name(snapshot: Snapshot, prev: Snapshot | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for f, labels, v in samples(snapshot, prev):
        out.setdefault(f.name, []).append((labels, v))
    return out


def gpus(name: str) -> tuple:
    part = GpuReader(lambda: FakeBackend(json.loads((SCENARIOS / f"{name}.json").read_text())), "/").read()
    assert isinstance(part, tuple), part
    return part


# -- the names -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_each_name_follows_prometheus_conventions(f: Field) -> None:
    assert re.fullmatch(r"[a-z][a-z0-9_]*[a-z0-9]", f.name) and "__" not in f.name
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", label) for label in f.labels)
    assert f.name.endswith("_total") == (f.kind == "counter")
    assert f.name.endswith("_info") == (f.kind == "info")
    if f.unit in UNIT_IN_NAME:  # base unit in the name, before _total
        assert re.search(rf"_{f.unit}(_total)?$", f.name), f.name
    assert f.help.strip() and "\n" not in f.help
    assert f.part in {"sources", "memory", "datasets", "gpus", "servers", "probes", "caches", "hints"}


def test_names_are_unique_and_every_sample_is_a_field(proc_root: Path) -> None:
    assert len({f.name for f in FIELDS}) == len(FIELDS)
    snap = Snapshot(ts=1.0, host="h", memory=read_memory(str(proc_root)), gpus=gpus("h100-2proc"))
    for f, labels, v in samples(snap):
        assert f in FIELDS and tuple(labels) == f.labels, (f.name, labels)
        assert isinstance(v, float | int)


# -- memory ------------------------------------------------------------------------------------------------------

def meminfo_bytes(root: Path, key: str) -> int:
    line = next(ln for ln in (root / "proc/meminfo").read_text().splitlines() if ln.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def test_memory_is_proc_meminfo(proc_root: Path) -> None:
    got = by_name(Snapshot(ts=1.0, host="h", memory=read_memory(str(proc_root))))
    for name, key in (("memory_cached_bytes", "Cached"), ("memory_dirty_bytes", "Dirty"),
                      ("memory_writeback_bytes", "Writeback"), ("memory_available_bytes", "MemAvailable"),
                      ("memory_total_bytes", "MemTotal")):
        assert got[name] == [({}, meminfo_bytes(proc_root, key))]
    vm = dict(ln.split() for ln in (proc_root / "proc/vmstat").read_text().splitlines())
    assert got["memory_paged_in_bytes_total"] == [({}, int(vm["pgpgin"]) * 1024)]
    if (proc_root / "proc/pressure/memory").exists():
        some = (proc_root / "proc/pressure/memory").read_text().splitlines()[0].split()
        total_us = int(some[-1].split("=")[1])
        assert ({"resource": "memory", "kind": "some"}, total_us / 1e6) in got["pressure_stalled_seconds_total"]


def test_a_meminfo_line_missing_is_an_absent_metric_not_a_zero(proc_root: Path) -> None:
    meminfo = proc_root / "proc/meminfo"
    meminfo.write_text("".join(ln + "\n" for ln in meminfo.read_text().splitlines() if not ln.startswith("Dirty:")))
    got = by_name(Snapshot(ts=1.0, host="h", memory=read_memory(str(proc_root))))
    assert "memory_dirty_bytes" not in got and got["memory_cached_bytes"]


def test_cgroup_limit_and_no_limit(tmp_path: Path) -> None:
    files = {"sys/fs/cgroup/job/memory.current": "1048576\n", "sys/fs/cgroup/job/memory.max": "max\n",
             "sys/fs/cgroup/job/memory.stat": "file 4096\nfile_dirty 0\n",
             "sys/fs/cgroup/job/memory.events": "oom_kill 2\n"}
    mountinfo = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    root = write_cgroup_tree(tmp_path / "r", "0::/job\n", mountinfo, files)
    got = by_name(Snapshot(ts=1.0, host="h", memory=read_memory(str(root))))
    assert got["cgroup_memory_max_bytes"] == [({"cgroup": "/job"}, float("inf"))]
    assert got["cgroup_memory_current_bytes"] == [({"cgroup": "/job"}, 1048576)]
    assert got["cgroup_memory_oom_kills_total"] == [({"cgroup": "/job"}, 2)]
    (root / "sys/fs/cgroup/job/memory.max").write_text("2097152\n")
    got = by_name(Snapshot(ts=1.0, host="h", memory=read_memory(str(root))))
    assert got["cgroup_memory_max_bytes"] == [({"cgroup": "/job"}, 2097152)]


# -- sources ------------------------------------------------------------------------------------------------------

def test_an_unavailable_part_is_absent_and_its_source_down(proc_root: Path) -> None:
    def fail() -> None:
        raise OSError("disk on fire")

    sampler = Sampler([Source("memory", 1.0, fail), Source("datasets", 1.0, lambda: scan_paths([str(proc_root)]))])
    try:
        snap = sampler.read_once(5.0)
    finally:
        sampler.close()
    assert isinstance(snap.memory, Unavailable)
    got = by_name(snap)
    assert not [n for n in got if n.startswith(("memory_", "pressure_", "cgroup_"))]
    assert ({"source": "memory"}, 0.0) in got["source_up"] and ({"source": "datasets"}, 1.0) in got["source_up"]
    reasons = dict((lbl["source"], (lbl["reason"], lbl["detail"])) for lbl, _ in got["source_unavailable_info"])
    # the exception's type, not its message: a label value must not change while the cause does not
    assert reasons == {"memory": ("error", "OSError")}
    assert "memory" not in {lbl["source"] for lbl, _ in got.get("source_last_success_timestamp_seconds", [])}


@pytest.mark.parametrize("name", ["no-permission", "version-mismatch"])
def test_nvml_failing_on_a_gpu_machine_is_the_source_down(name: str) -> None:
    part = GpuReader(lambda: FakeBackend(json.loads((SCENARIOS / f"{name}.json").read_text())), "/").read()
    assert isinstance(part, Unavailable)
    from dltop.model import SourceStatus

    snap = Snapshot(ts=1.0, host="h", gpus=part, sources={"gpus": SourceStatus("gpus", 1.0, last_ok_ts=1.0)})
    got = by_name(snap)
    assert not [n for n in got if n.startswith("gpu")]  # no count either: unknown, not 0
    assert got["source_up"] == [({"source": "gpus"}, 0.0)]
    assert got["source_unavailable_info"] == [({"source": "gpus", "reason": "unavailable", "detail": part.reason},
                                               1.0)]


@pytest.mark.parametrize(("name", "absent"), [("library-not-found", "no_library"), ("driver-not-loaded", "no_driver"),
                                              ("no-gpus", "no_devices")])
def test_no_gpu_on_the_node_is_0_gpus_with_the_source_up(name: str, absent: str) -> None:
    # A CPU-only node of a fleet: no NVIDIA library, no driver loaded, or no device on the bus. A state, not a
    # failure: DltopSourceDown must not fire on every such node.
    part = GpuReader(lambda: FakeBackend(json.loads((SCENARIOS / f"{name}.json").read_text())), "/").read()
    from dltop.model import SourceStatus

    snap = Snapshot(ts=1.0, host="h", gpus=part, sources={"gpus": SourceStatus("gpus", 1.0, last_ok_ts=1.0)})
    got = by_name(snap)
    assert got["source_up"] == [({"source": "gpus"}, 1.0)] and "source_unavailable_info" not in got
    assert got["gpus"] == [({}, 0.0)] and got["gpus_absent_info"] == [({"reason": absent}, 1.0)]
    assert not [n for n in got if n.startswith("gpu_")]


def test_a_lost_gpu_is_up_0_with_its_reason_and_the_others_up_1() -> None:
    part = gpus("gpu-lost")
    got = by_name(Snapshot(ts=1.0, host="h", gpus=part))
    assert got["gpus"] == [({}, 2.0)]
    up = {lbl["gpu"]: v for lbl, v in got["gpu_up"]}
    assert up == {"0": 1.0, "1": 0.0}
    assert got["gpu_down_info"] == [({"gpu": "1", "uuid": part[1].uuid or "", "reason": "lost"}, 1.0)]
    assert {lbl["gpu"] for lbl, _ in got["gpu_memory_total_bytes"]} == {"0"}  # the lost one's numbers: absent


def test_a_hanging_source_gives_the_same_series_scrape_after_scrape() -> None:
    # The sampler says "slow: no answer for N s", N growing every second; as a label value that was a new series
    # per scrape for as long as the source hung.
    import asyncio

    from dltop.exporter.collector import SnapshotCollector

    release = threading.Event()

    def hang() -> None:
        release.wait(30)

    async def scrapes() -> list[list[str]]:
        sampler = Sampler([Source("datasets", 60.0, hang, timeout_s=0.05)])
        sampler.start()
        out = []
        try:
            for wait_s in (0.3, 1.1, 1.1):
                await asyncio.sleep(wait_s)
                collector = SnapshotCollector()
                collector.update(sampler.snapshot())
                body, _ = collector.render("text/plain")
                out.append([ln.rsplit(" ", 1)[0] for ln in body.decode().splitlines()
                            if ln.startswith("dltop_source_")])
        finally:
            release.set()
            sampler.close()
        return out

    first, *later = asyncio.run(scrapes())
    assert 'dltop_source_up{source="datasets"}' in first
    [info] = [ln for ln in first if ln.startswith("dltop_source_unavailable_info")]
    assert 'reason="slow"' in info
    assert all(x == first for x in later), (first, later)


# -- datasets -----------------------------------------------------------------------------------------------------

def test_dataset_residency_and_a_missing_dataset(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    ds.mkdir()
    for i in range(3):
        (ds / f"f{i}").write_bytes(os.urandom(256 << 10))
    os.sync()
    for f in ds.iterdir():  # cold, then warm one file of three
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    (ds / "f1").read_bytes()
    gone = str(tmp_path / "gone")
    part = scan_paths([str(ds), gone])
    got = by_name(Snapshot(ts=1.0, host="h", datasets=part))
    assert got["dataset_size_bytes"] == [({"dataset": str(ds)}, 3 * (256 << 10))]
    [(labels, resident)] = got["dataset_resident_bytes"]
    assert labels == {"dataset": str(ds)} and resident == 256 << 10
    assert got["dataset_up"] == [({"dataset": str(ds)}, 1.0), ({"dataset": gone}, 0.0)]
    [(info, _)] = got["dataset_unavailable_info"]
    assert info["dataset"] == gone and "no such file" in info["reason"]
    assert not [lbl for lbl, _ in got["dataset_files"] if lbl["dataset"] == gone]  # no numbers for it at all


# -- GPUs ---------------------------------------------------------------------------------------------------------

def test_gpu_numbers_are_the_scenarios() -> None:
    s = json.loads((SCENARIOS / "h100-2proc.json").read_text())["gpus"][0]
    got = by_name(Snapshot(ts=1.0, host="h", gpus=gpus("h100-2proc")))
    dev = {"gpu": "0", "uuid": s["uuid"]}
    assert got["gpu_memory_total_bytes"] == [(dev, s["memory"]["total"])]
    assert got["gpu_utilization_ratio"] == [(dev, s["utilization"]["gpu"] / 100)]
    assert got["gpu_power_watts"] == [(dev, s["power_mw"] / 1000)]
    assert got["gpu_temperature_celsius"] == [(dev, s["temperature_c"])]
    assert "gpu_retired_pages_sbe" not in got  # NOT_SUPPORTED in this scenario: absent, not 0
    procs = {lbl["pid"]: v for lbl, v in got["gpu_process_memory_bytes"]}
    assert procs == {str(p["pid"]): p["used_bytes"] for p in s["compute_processes"]}
    # Without a probe no process has a split: the only use is the device's free memory.
    assert got["gpu_memory_bytes"] == [({**dev, "pid": "", "use": "free"}, s["memory"]["free"])]


def test_a_known_split_is_exported_and_an_unknown_part_of_it_is_absent() -> None:
    [g] = gpus("h100-2proc")
    p0, p1 = g.processes
    split = MemorySplit(weights_bytes=100, kv_cache_bytes=200, allocator_cache_bytes=None, other_torch_bytes=0,
                        non_torch_bytes=50, unavailable={"allocator_cache_bytes": "no memory_stats"})
    g = dataclasses.replace(g, processes=(dataclasses.replace(p0, split=split), p1))
    got = by_name(Snapshot(ts=1.0, host="h", gpus=(g,)))
    uses = {(lbl["pid"], lbl["use"]): v for lbl, v in got["gpu_memory_bytes"]}
    assert uses == {(str(p0.pid), "weights"): 100, (str(p0.pid), "kv_cache"): 200, (str(p0.pid), "other_torch"): 0,
                    (str(p0.pid), "non_torch"): 50, ("", "free"): g.memory_free_bytes}
    assert {u for _, u in uses} <= {f.removesuffix("_bytes") for f in SPLIT_FIELDS} | {"free"}


def test_mig_free_memory_is_per_instance() -> None:
    part = gpus("a100-mig")
    got = by_name(Snapshot(ts=1.0, host="h", gpus=part))
    free = {lbl["uuid"]: v for lbl, v in got["gpu_memory_bytes"] if lbl["use"] == "free"}
    migs = {m.uuid: m.memory_free_bytes for g in part for m in g.mig_devices}
    assert migs and free == {u: v for u, v in migs.items() if v is not None}


def test_eight_gpus_twenty_processes_series_are_bounded() -> None:
    part = gpus("8gpu-20proc")
    got = by_name(Snapshot(ts=1.0, host="h", gpus=part))
    nprocs = sum(len(g.processes) for g in part if isinstance(g.processes, tuple))
    assert len(got["gpu_process_memory_bytes"]) == nprocs and len(got["gpu_info"]) == len(part) == 8


# -- inference servers ----------------------------------------------------------------------------------------------

@pytest.fixture
def maybe_metrics_server() -> Iterator[str | None]:
    """The real vLLM / SGLang payloads of ../shared/fixtures over HTTP, or None where a checkout lacks them."""
    if not METRICS.is_dir():
        yield None
        return
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(METRICS)))
    SimpleHTTPRequestHandler.log_message = lambda *a: None  # type: ignore[method-assign]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def metrics_server(maybe_metrics_server: str | None) -> str:
    if maybe_metrics_server is None:
        pytest.skip(f"metrics fixtures not found at {METRICS}")
    return maybe_metrics_server


def first_sample(name: str, text: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
    return float(line.rsplit(None, 1)[1])


def test_server_kv_numbers_are_the_payloads(metrics_server: str) -> None:
    urls = {f.name: f"{metrics_server}/{f.name}" for f in METRICS.glob("*.prom")}
    servers = tuple(read_server(u, 5.0) for u in urls.values())
    assert all(s.state == "ok" for s in servers), [s.error for s in servers]
    got = by_name(Snapshot(ts=1.0, host="h", servers=servers))
    usage = {lbl["server"]: v for lbl, v in got["inference_kv_cache_usage_ratio"]}
    v0 = "vllm-0.4.x-v0-datadog-integrations-core.prom"
    assert usage[urls[v0]] == first_sample("vllm:gpu_cache_usage_perc", (METRICS / v0).read_text())
    labels = next(lbl for lbl, _ in got["inference_kv_cache_usage_ratio"] if lbl["server"] == urls[v0])
    assert labels["engine"] == "vllm" and labels["model"]
    assert {lbl["engine"] for lbl, _ in got["inference_kv_cache_capacity_tokens"]} == {"vllm", "sglang"}


def test_v1_prefix_hit_ratio_needs_two_readings(metrics_server: str) -> None:
    [name] = [f.name for f in METRICS.glob("vllm-0.10*.prom")]
    s = read_server(f"{metrics_server}/{name}", 5.0)
    m = s.models[0]
    assert m.prefix_cache_hits_total is not None and m.prefix_cache_queries_total is not None
    cur = Snapshot(ts=2.0, host="h", servers=(s,))
    assert "inference_prefix_cache_hit_ratio" not in by_name(cur)  # one reading: no rate, and no 0
    later = dataclasses.replace(m, prefix_cache_hits_total=m.prefix_cache_hits_total + 30,
                                prefix_cache_queries_total=m.prefix_cache_queries_total + 120)
    nxt = Snapshot(ts=3.0, host="h", servers=(dataclasses.replace(s, models=(later, *s.models[1:])),))
    [(_, ratio)] = [x for x in by_name(nxt, cur)["inference_prefix_cache_hit_ratio"] if x[0]["model"] == m.model_name
                    and x[0]["replica"] == (m.replica or "")]
    assert ratio == 30 / 120


def test_a_server_that_is_down_has_no_numbers() -> None:
    from dltop.model import SourceStatus

    s = ServerStats(url="http://127.0.0.1:9", state="down", error="connection refused")
    snap = Snapshot(ts=1.0, host="h", servers=(s,),
                    sources={"server http://127.0.0.1:9": SourceStatus("server http://127.0.0.1:9", 2.0)})
    got = by_name(snap)
    assert not [n for n in got if n.startswith("inference_")]
    assert got["source_up"] == [({"source": "server http://127.0.0.1:9"}, 0.0)]
    assert got["source_unavailable_info"] == [({"source": "server http://127.0.0.1:9", "reason": "error",
                                                "detail": "down"}, 1.0)]  # the state, of a fixed set


# -- caches ------------------------------------------------------------------------------------------------------

def caches_part(tmp_path: Path):  # type: ignore[no-untyped-def]
    from dltop.sources.caches import environment_of, read_caches

    inductor = tmp_path / "inductor"
    (inductor / "fxgraph" / "ab").mkdir(parents=True)
    for i in range(5):
        (inductor / "fxgraph" / "ab" / f"entry{i}").write_bytes(os.urandom(10000 + i))
    env = environment_of({"TORCHINDUCTOR_CACHE_DIR": str(inductor), "HOME": str(tmp_path / "home"),
                          "TMPDIR": str(tmp_path / "tmp")}, os.getuid(), "test")
    return read_caches(env), inductor


def test_cache_sizes_are_du_s(tmp_path: Path) -> None:
    from .test_caches_util import du_bytes

    part, inductor = caches_part(tmp_path)
    got = by_name(Snapshot(ts=1.0, host="h", caches=part))
    sizes = {lbl["cache"]: v for lbl, v in got["compile_cache_size_bytes"]}
    assert sizes["torchinductor"] == du_bytes(inductor)
    assert {lbl["cache"]: v for lbl, v in got["compile_cache_files"]}["torchinductor"] == 5
    absent = [c.name for c in part.caches if not c.exists]
    assert absent and not set(absent) & set(sizes)  # a cache not made yet has no size, not 0 bytes


# -- probes and hints -----------------------------------------------------------------------------------------------

def probes_part(tmp_path: Path, doc: dict) -> ProbesPart:
    """The probes part dltop reads from a probe file of this process holding `doc`."""
    d = tmp_path / "dltop"
    fd = open_private_dir(str(d))
    write_atomic(fd, f"{os.getpid()}.json", json.dumps(doc).encode())
    os.close(fd)
    part = read_probes([(str(d), os.getuid())])
    assert len(part.processes) == 1, part.ignored
    return part


DATA_DOC = {"recent_steps": 8, "recent_wait_s": 1.5, "recent_step_s": 6.0, "steps": 40}


def test_probe_numbers_are_the_probe_files(tmp_path: Path) -> None:
    doc = {**probe.report(), "data": DATA_DOC, "rank": 3, "started_at": 1700000000.5}
    got = by_name(Snapshot(ts=1.0, host="h", probes=probes_part(tmp_path, doc)))
    labels = {"pid": str(os.getpid()), "rank": "3", "job_id": "", "uid": str(os.getuid())}
    assert got["training_start_timestamp_seconds"] == [(labels, doc["started_at"])]
    assert got["training_data_wait_ratio"] == [(labels, DATA_DOC["recent_wait_s"] / DATA_DOC["recent_step_s"])]
    assert got["training_step_seconds"] == [(labels, DATA_DOC["recent_step_s"] / DATA_DOC["recent_steps"])]
    assert got["training_steps_total"] == [(labels, DATA_DOC["steps"])]
    assert "training_memory_bytes" not in got  # the probe watched no model: unknown, not 0


def test_a_watched_model_gives_its_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(probe, "state", probe._State())
    model = torch.nn.Linear(64, 32)
    probe.watch_model(model)
    got = by_name(Snapshot(ts=1.0, host="h", probes=probes_part(tmp_path, probe.report())))
    uses = {lbl["use"]: v for lbl, v in got["training_memory_bytes"]}
    assert uses["weights"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert uses["gradients"] == 0  # no backward yet: the probe counted 0 bytes, and says so


def test_hints_are_one_series_each() -> None:
    hs = [Hint("page-cache-squeeze", "warn", "t"), Hint("dataset-cold", "info", "t")]
    assert list(hint_samples(hs)) == [(HINT_ACTIVE, {"id": "page-cache-squeeze", "severity": "warn"}, 1.0),
                                      (HINT_ACTIVE, {"id": "dataset-cold", "severity": "info"}, 1.0)]


def test_every_field_comes_out_of_some_real_snapshot(tmp_path: Path, proc_root: Path,
                                                     maybe_metrics_server: str | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # No field is described and never produced: together the parts of this machine, a cgroup tree, datasets,
    # every fake-NVML scenario, every real server payload (twice, for the rates) and a probe give them all.
    files = {"sys/fs/cgroup/job/memory.current": "1048576\n", "sys/fs/cgroup/job/memory.max": "max\n",
             "sys/fs/cgroup/job/memory.stat": "file 4096\nfile_dirty 0\n",
             "sys/fs/cgroup/job/memory.events": "oom_kill 0\n"}
    write_cgroup_tree(proc_root, "0::/job\n", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", files)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "f").write_bytes(b"x" * 5000)
    monkeypatch.setattr(probe, "state", probe._State())
    kv = __import__("torch").zeros(16)
    probe.watch_kv(kv)
    # Without the server payloads of ../shared/fixtures (a bare clone) the server fields are left out of the check.
    servers = () if maybe_metrics_server is None else tuple(
        read_server(f"{maybe_metrics_server}/{f.name}", 5.0) for f in sorted(METRICS.glob("*.prom")))
    if servers and LLAMA2.is_file():
        # The pool in bytes needs the model's config.json in a hub cache: the first server's model is given
        # Llama-2-7b's there (tests/test_servers.py checks the bytes themselves with the matching model).
        first = servers[0]
        hub = _hub(tmp_path, first.models[0].model_name, LLAMA2)
        servers = (read_server(first.url, 5.0, cache=str(hub)), *servers[1:])
    bumped = tuple(dataclasses.replace(s, models=tuple(dataclasses.replace(
        m, prefix_cache_hits_total=m.prefix_cache_hits_total + 1, prefix_cache_queries_total=(
            m.prefix_cache_queries_total or 0) + 2) if m.prefix_cache_hits_total is not None else m
        for m in s.models)) for s in servers)
    sampler = Sampler([Source("memory", 1.0, lambda: read_memory(str(proc_root)))])
    try:
        snap = sampler.read_once(5.0)
    finally:
        sampler.close()
    for _ in probe.track([kv] * 3, batch_size=2, tokens=8):  # a loop that hands over its samples, tokens, loss
        probe.log(loss=0.5)
    # as many samples and tokens an item as that loop had, over DATA_DOC's steps
    counts = {f"{pre}{kind}": k * DATA_DOC[f"{pre}steps"] for kind, k in (("samples", 2), ("tokens", 8))
              for pre in ("", "recent_")}
    assert probe.report()["data"]["samples"] == 2 * 3 and probe.report()["loss"]["value"] == 0.5
    parts = dict(memory=snap.memory, datasets=scan_paths([str(tmp_path / "ds"), str(tmp_path / "gone")]),
                 probes=probes_part(tmp_path, {**probe.report(), "data": {**DATA_DOC, **counts},
                                               "started_at": time.time() - 10}))
    seen = {f.name for f, _, _ in samples(dataclasses.replace(snap, **parts))}
    seen |= {f.name for f, _, _ in samples(Snapshot(ts=2.0, host="h", servers=bumped),
                                           Snapshot(ts=1.0, host="h", servers=servers))}
    seen |= {f.name for f, _, _ in samples(Snapshot(ts=1.0, host="h", gpus=Unavailable("x"),
                                                    sources={"gpus": snap.sources["memory"]}))}
    seen |= {f.name for f, _, _ in samples(Snapshot(ts=1.0, host="h", gpus=Unavailable("x", "no_library")))}
    for path in SCENARIOS.glob("*.json"):
        part = GpuReader(lambda p=path: FakeBackend(json.loads(p.read_text())), "/").read()
        if isinstance(part, tuple):
            split = MemorySplit(**dict.fromkeys(SPLIT_FIELDS, 1))
            part = tuple(dataclasses.replace(g, processes=tuple(dataclasses.replace(p, split=split)
                                                                for p in g.processes))
                         if isinstance(g.processes, tuple) else g for g in part)
        seen |= {f.name for f, _, _ in samples(Snapshot(ts=1.0, host="h", gpus=part))}
    seen |= {f.name for f, _, _ in hint_samples([Hint("dataset-cold", "info", "t")])}
    scanned = parts["datasets"].paths[0]  # a dataset found read by a job, listed as --export-found lists it
    found = DatasetsPart(found=(FoundDataset(scanned.path, (FoundReader(1, 0, "root"),), 1.0, scanned),))
    seen |= {f.name for f, _, _ in samples(Snapshot(ts=1.0, host="h", datasets=found.with_found_listed()))}
    seen |= {f.name for f, _, _ in samples(Snapshot(ts=1.0, host="h", caches=caches_part(tmp_path / "c")[0]))}
    expected = [f for f in FIELDS if servers or f.part != "servers"]
    assert sorted(f.name for f in expected if f.name not in seen) == []


def test_the_exporter_doc_lists_every_field() -> None:
    # docs/exporter.md's table is written from FIELDS by scripts/exporter_doc.py; a field added without rerunning
    # it (or a table edited by hand) fails here.
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "exporter_doc.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    doc = (REPO / "docs" / "exporter.md").read_text()
    listed = set(re.findall(r"^\| `dltop_(\w+)` \|", doc, re.M))
    assert listed == {f.name for f in FIELDS}
