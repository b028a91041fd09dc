"""The split of each GPU process (derive.join_splits): real probe files written by real processes running
dltop.probe, joined to the fake NVML's processes by pid, start time and device UUID — and every case where they
must not join (a reused pid, another GPU's UUID, a probe on the CPU only), end to end through `dltop snapshot`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dltop.derive import join_splits
from dltop.model import GpuProcess, ServerStats, Unavailable
from dltop.model.gpu import NO_PROBE, SPLIT_FIELDS
from dltop.probe.files import proc_start_ticks
from dltop.sources.gpu import FakeBackend, GpuReader
from tests.conftest import DATA, REPO
from tests.probe_helpers import CPU_WORKER, GPU_WORKER, SPEC, Workers, probe_env

SCENARIOS = DATA / "gpu-scenarios"
MIB = 1 << 20


def scenario(name: str) -> dict[str, Any]:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def nvml_uuid(s: dict[str, Any], gpu: int, mig: int | None = None) -> str:
    dev = s["gpus"][gpu] if mig is None else s["gpus"][gpu]["mig_devices"][mig]
    return str(dev["uuid"])


def torch_uuid(uuid: str) -> str:
    """NVML's UUID as torch.cuda.get_device_properties(N).uuid gives it: without the GPU- / MIG- prefix."""
    return uuid.split("-", 1)[1]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with Workers(tmp_path) as w:
        yield w


def place(s: dict[str, Any], gpu: int, pid: int, used: int, mig: int | None = None) -> None:
    """Make the scenario's first process on that GPU (or MIG instance) the worker, holding `used` bytes."""
    dev = s["gpus"][gpu] if mig is None else s["gpus"][gpu]["mig_devices"][mig]
    old = dev["compute_processes"][0]["pid"]
    dev["compute_processes"][0].update(pid=pid, used_bytes=used)
    for u in dev.get("process_utilization") if isinstance(dev.get("process_utilization"), list) else ():
        if u["pid"] == old:
            u["pid"] = pid
    if mig is not None:  # the parent lists the instance's processes too, without memory
        for p in s["gpus"][gpu]["compute_processes"]:
            if p["pid"] == old:
                p["pid"] = pid


def read_gpus(s: dict[str, Any], root: str = "/") -> Any:
    part = GpuReader(lambda: FakeBackend(s), root).read()
    assert isinstance(part, tuple)
    return part


def process(gpus: Any, pid: int, gpu: int, mig: int | None = None) -> GpuProcess:
    dev = gpus[gpu] if mig is None else gpus[gpu].mig_devices[mig]
    return next(p for p in dev.processes if p.pid == pid)


def test_a_probed_process_gets_its_split_from_its_probe_and_nvml(workers: Workers) -> None:
    s = scenario("two-gpus")
    pid = workers.gpu(torch_uuid(nvml_uuid(s, 1)))
    used = 3500 * MIB
    place(s, 1, pid, used)
    gpus = join_splits(read_gpus(s), workers.probes(), None, time.time())
    p = process(gpus, pid, 1)
    sp = p.split
    assert (sp.weights_bytes, sp.kv_cache_bytes, sp.gradients_bytes, sp.optimizer_bytes) == (
        SPEC["weights"], SPEC["kv"], SPEC["gradients"], SPEC["optimizer"])
    assert sp.allocator_cache_bytes == SPEC["reserved"] - SPEC["allocated"]
    assert sp.other_torch_bytes == SPEC["allocated"] - SPEC["weights"] - SPEC["kv"]
    assert sp.non_torch_bytes == used - SPEC["reserved"]
    assert sum(getattr(sp, f) for f in SPLIT_FIELDS) == p.used_bytes  # the five parts are NVML's figure
    assert sp.sources == {"weights_bytes": "probe", "gradients_bytes": "probe", "optimizer_bytes": "probe",
                          "kv_cache_bytes": "probe", "torch_allocated_bytes": "probe",
                          "torch_reserved_bytes": "probe", "allocator_cache_bytes": "probe",
                          "other_torch_bytes": "probe", "non_torch_bytes": "nvml-probe"}
    assert (sp.probe_device, sp.joined_by, sp.unavailable) == ("cuda:0", "uuid", {})
    # the other processes have no probe: unknown, with the reason, never 0
    assert isinstance(gpus, tuple)
    others = [q for g in gpus if isinstance(g.processes, tuple) for q in g.processes if q.pid != pid]
    assert others and all(q.split.unavailable == dict.fromkeys(SPLIT_FIELDS, NO_PROBE) for q in others)


def test_a_reused_pid_never_takes_the_probe_s_split(workers: Workers, tmp_path: Path) -> None:
    s = scenario("two-gpus")
    pid = workers.gpu(torch_uuid(nvml_uuid(s, 0)))
    place(s, 0, pid, 3500 * MIB)
    # NVML's pid as a later process under the same number: its /proc entry says another start time
    ticks = proc_start_ticks(pid)
    assert ticks is not None
    stat = (Path("/proc") / str(pid) / "stat").read_text().split(" ")
    stat[21] = str(ticks + 100)
    fake = tmp_path / "root" / "proc" / str(pid)
    fake.mkdir(parents=True)
    (fake / "stat").write_text(" ".join(stat))
    (fake / "cmdline").write_bytes(b"python\0new.py\0")
    gpus = join_splits(read_gpus(s, str(tmp_path / "root")), workers.probes(), None, time.time())
    sp = process(gpus, pid, 0).split
    assert all(getattr(sp, f) is None for f in SPLIT_FIELDS)
    assert set(sp.unavailable.values()) == {f"pid {pid} was reused: the probe file is of a process started at tick "
                                            f"{ticks}, NVML's started at tick {ticks + 100}"}


def test_another_gpu_s_uuid_does_not_join(workers: Workers) -> None:
    s = scenario("two-gpus")
    pid = workers.gpu(torch_uuid(nvml_uuid(s, 1)))  # the probe's device is GPU 1, NVML lists the pid on GPU 0
    place(s, 0, pid, 3500 * MIB)
    gpus = join_splits(read_gpus(s), workers.probes(), None, time.time())
    sp = process(gpus, pid, 0).split
    assert all(getattr(sp, f) is None for f in SPLIT_FIELDS)
    why = sp.unavailable["weights_bytes"]
    assert torch_uuid(nvml_uuid(s, 1)) in why and nvml_uuid(s, 0) in why and "not this GPU" in why


def test_a_mig_instance_joins_by_its_own_uuid(workers: Workers) -> None:
    s = scenario("a100-mig")
    mig_uuid = nvml_uuid(s, 0, 1)
    pid = workers.gpu(torch_uuid(mig_uuid))
    used = 3500 * MIB
    place(s, 0, pid, used, mig=1)
    gpus = join_splits(read_gpus(s), workers.probes(), None, time.time())
    sp = process(gpus, pid, 0, mig=1).split
    assert sp.joined_by == "uuid" and sp.non_torch_bytes == used - SPEC["reserved"]
    assert sp.weights_bytes == SPEC["weights"]
    # the parent's listing of the same process (no memory there) points at the instance's row
    parent = process(gpus, pid, 0).split
    assert "MIG mode" in parent.unavailable["weights_bytes"] and parent.weights_bytes is None


def test_a_probe_on_the_cpu_only_says_so(workers: Workers) -> None:
    s = scenario("two-gpus")
    pid = workers.start(CPU_WORKER)  # real torch, a real model on the CPU
    place(s, 0, pid, 1200 * MIB)
    probes = workers.probes()
    assert [d.device for d in probes.processes[0].devices] == ["cpu"] and probes.processes[0].weights_bytes
    sp = process(join_splits(read_gpus(s), probes, None, time.time()), pid, 0).split
    assert all(getattr(sp, f) is None for f in SPLIT_FIELDS)
    assert "sees no CUDA device (its watched tensors are on the CPU)" in sp.unavailable["non_torch_bytes"]


def test_without_a_uuid_cuda_visible_devices_maps_the_index_and_says_so(workers: Workers) -> None:
    s = scenario("two-gpus")  # two GPUs of one model: CUDA's order is the bus order
    pid = workers.start(GPU_WORKER, json.dumps({**SPEC, "uuid": None}), CUDA_VISIBLE_DEVICES="1")
    place(s, 1, pid, 3500 * MIB)
    sp = process(join_splits(read_gpus(s), workers.probes(), None, time.time()), pid, 1).split
    assert sp.weights_bytes == SPEC["weights"]
    assert sp.joined_by is not None and "CUDA_VISIBLE_DEVICES=1" in sp.joined_by and "no UUID" in sp.joined_by


def test_readings_from_different_moments_are_inconsistent_not_clamped(workers: Workers) -> None:
    s = scenario("two-gpus")
    pid = workers.gpu(torch_uuid(nvml_uuid(s, 0)))
    place(s, 0, pid, SPEC["reserved"] - MIB)  # NVML read before the allocator grew: less than torch reserved
    sp = process(join_splits(read_gpus(s), workers.probes(), None, time.time()), pid, 0).split
    assert sp.non_torch_bytes is None and sp.unavailable["non_torch_bytes"].startswith("inconsistent: ")
    assert sp.weights_bytes == SPEC["weights"]  # the probe's own numbers still stand


def test_no_kv_cache_named_is_unknown_and_counted_in_other_torch(workers: Workers) -> None:
    s = scenario("two-gpus")
    pid = workers.gpu(torch_uuid(nvml_uuid(s, 0)), kv=0)  # a training process: watch_kv never called
    place(s, 0, pid, 3500 * MIB)
    sp = process(join_splits(read_gpus(s), workers.probes(), None, time.time()), pid, 0).split
    assert sp.kv_cache_bytes is None and "probe.watch_kv" in sp.unavailable["kv_cache_bytes"]
    assert sp.other_torch_bytes == SPEC["allocated"] - SPEC["weights"]


def test_a_server_joined_to_its_one_gpu_process_gives_the_kv_pool(workers: Workers) -> None:
    s = scenario("two-gpus")
    pid = workers.gpu(torch_uuid(nvml_uuid(s, 1)), kv=0)  # an engine that does not name its cache to the probe
    place(s, 1, pid, 3500 * MIB)
    pool = 300 * MIB
    server = ServerStats(url="http://127.0.0.1:8000/metrics", state="ok", kv_capacity_bytes=pool, pid=os.getpid(),
                         child_pids=(pid,))
    gpus = join_splits(read_gpus(s), workers.probes(), (server,), time.time())
    sp = process(gpus, pid, 1).split
    assert sp.kv_cache_bytes == pool and sp.sources["kv_cache_bytes"] == "server"
    assert sp.other_torch_bytes == SPEC["allocated"] - SPEC["weights"] - pool
    # where the pool's bytes are not known, the reason is the server's
    unknown = ServerStats(url=server.url, state="ok", kv_capacity_bytes=Unavailable("no config"), pid=pid)
    sp = process(join_splits(read_gpus(s), workers.probes(), (unknown,), time.time()), pid, 1).split
    assert sp.kv_cache_bytes is None and sp.unavailable["kv_cache_bytes"] == f"{server.url}: no config"


def test_snapshot_json_has_the_split_of_a_probed_process(workers: Workers, tmp_path: Path) -> None:
    s = scenario("two-gpus")
    pid = workers.gpu(torch_uuid(nvml_uuid(s, 1)))
    used = 3500 * MIB
    place(s, 1, pid, used)
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(s))
    r = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json"], capture_output=True, text=True,
                       cwd=REPO, timeout=60, env=probe_env(tmp_path, DLTOP_FAKE_NVML=str(path)))
    assert r.returncode == 0, r.stderr
    gpus = json.loads(r.stdout)["gpus"]
    mine = next(p for p in gpus[1]["processes"] if p["pid"] == pid)
    assert mine["used_bytes"] == used
    sp = mine["split"]
    assert [sp[f] for f in SPLIT_FIELDS] == [SPEC["weights"], SPEC["kv"], SPEC["reserved"] - SPEC["allocated"],
                                             SPEC["allocated"] - SPEC["weights"] - SPEC["kv"], used - SPEC["reserved"]]
    assert sp["sources"]["non_torch_bytes"] == "nvml-probe" and sp["joined_by"] == "uuid"
    other = next(p for p in gpus[0]["processes"])
    assert other["split"]["weights_bytes"] is None and other["split"]["unavailable"]["weights_bytes"] == NO_PROBE


def test_a_fragmented_allocator_in_a_real_probe_file_fires_the_hint(workers: Workers) -> None:
    from dltop.hints.gpu import allocator_fragmented
    from dltop.model import Snapshot

    s = scenario("two-gpus")
    pid = workers.gpu(torch_uuid(nvml_uuid(s, 0)), reserved=SPEC["allocated"] * 2)
    place(s, 0, pid, SPEC["allocated"] * 2 + 300 * MIB)
    gpus = join_splits(read_gpus(s), workers.probes(), None, time.time())
    h = allocator_fragmented([Snapshot(ts=time.time(), host="here", gpus=gpus)])
    assert h is not None and h.numbers == {"pid": pid, "reserved_bytes": SPEC["allocated"] * 2,
                                           "allocated_bytes": SPEC["allocated"]}
