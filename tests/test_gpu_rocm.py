"""The split on ROCm torch: torch.cuda is HIP there (cuda:N devices, torch.version.hip set), its device UUIDs are
not amdsmi's, so a real process running dltop.probe under a ROCm-torch stand-in is joined to the fake amdsmi's GPU
by its PCI address, or by HIP_VISIBLE_DEVICES where torch gives none; and never to an NVIDIA GPU."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dltop.derive import join_splits
from dltop.model import GpuProcess
from dltop.probe.files import open_private_dir, write_atomic
from dltop.sources.amd import AmdReader
from dltop.sources.amd_fake import fake_amdsmi
from dltop.sources.gpu import FakeBackend, GpuReader, GpusReader
from dltop.sources.gpu_procs import HostReader
from dltop.sources.probes import read_probes
from tests.conftest import DATA
from tests.probe_helpers import SPEC, STANDIN_TENSORS, Workers

MIB = 1 << 20

# dltop.probe in a process whose torch is ROCm's: torch.version.hip set, cuda:0 a HIP device with its PCI ids.
HIP_WORKER = STANDIN_TENSORS + r"""
class Cuda:  # torch.cuda on ROCm: HIP under CUDA's names
    def is_initialized(self): return True
    def current_device(self): return 0
    def memory_stats(self, i):
        return {"allocated_bytes.all.current": spec["allocated"], "reserved_bytes.all.current": spec["reserved"]}
    def get_device_properties(self, i):
        return types.SimpleNamespace(**spec["props"])

sys.modules["torch"] = types.SimpleNamespace(cuda=Cuda(), __version__="2.13.0+rocm7.0 (stand-in)",
                                             version=types.SimpleNamespace(hip=spec["hip"], cuda=None))
from dltop import probe
model = Model([Tensor(spec["weights"])])  # held: the probe keeps only a weak reference
probe.watch_model(model)
probe.start(interval_s=0.2)
print("ready", flush=True)
time.sleep(120)
"""
# HIP's UUID for a device is the ASCII of its unique id, not amdsmi's UUID: it must not be compared with it.
HIP_PROPS = {"uuid": "GPU-3c8cb9c2a5ff2d4b", "pci_domain_id": 0, "pci_bus_id": 0x0C, "pci_device_id": 0}


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with Workers(tmp_path) as w:
        yield w


def hip_worker(workers: Workers, props: dict[str, Any], hip: str | None = "7.0.51831", **env: str) -> int:
    return workers.start(HIP_WORKER, json.dumps({**SPEC, "props": props, "hip": hip}), **env)


def amd_gpus(pid: int, monkeypatch: pytest.MonkeyPatch, nvidia: bool = False) -> Any:
    """The fake MI300X pair (after the fake NVML's two L40S where `nvidia`), the worker as GPU 0's first process."""
    s = json.loads((DATA / "amd-scenarios" / "mi300x.json").read_text())
    s["gpus"][0]["processes"][0].update(pid=pid, vram_bytes=3500 * MIB)
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(s))
    nv = GpuReader(lambda: FakeBackend(json.loads((DATA / "gpu-scenarios" / "two-gpus.json").read_text())))
    part = GpusReader(nv if nvidia else None, AmdReader(HostReader())).read()
    assert isinstance(part, tuple)
    return part


def process(gpus: Any, pid: int) -> GpuProcess:
    return next(p for g in gpus for p in g.processes if p.pid == pid)


def test_the_probe_says_hip_and_gives_the_pci_address(workers: Workers) -> None:
    hip_worker(workers, HIP_PROPS)
    (probe,) = workers.probes().processes
    (dev,) = [d for d in probe.devices if d.device == "cuda:0"]
    assert (dev.runtime, dev.pci_bus_id, dev.uuid) == ("hip", "0000:0c:00.0", HIP_PROPS["uuid"])


def test_a_hip_process_joins_its_amd_gpu_by_pci_address(workers: Workers, monkeypatch: pytest.MonkeyPatch) -> None:
    pid = hip_worker(workers, HIP_PROPS)
    gpus = join_splits(amd_gpus(pid, monkeypatch, nvidia=True), workers.probes(), None, time.time())
    p = process(gpus, pid)
    # (seen once, not caught again: joined_by was not "pci"; the split and the probe say why if it comes back)
    assert p.split.joined_by == "pci" and p.split.probe_device == "cuda:0", (p.split, workers.probes())
    assert p.split.weights_bytes == SPEC["weights"], p.split.unavailable
    assert p.split.non_torch_bytes == 3500 * MIB - SPEC["reserved"]  # amdsmi's VRAM figure less torch's reserved


def test_without_pci_ids_hip_visible_devices_maps_the_index(workers: Workers,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # cuda:0 is the second AMD GPU by HIP_VISIBLE_DEVICES: the worker, placed on GPU 0, is not joined to it...
    pid = hip_worker(workers, {"uuid": HIP_PROPS["uuid"]}, HIP_VISIBLE_DEVICES="1")
    p = process(join_splits(amd_gpus(pid, monkeypatch), workers.probes(), None, time.time()), pid)
    assert p.split.probe_device is None and "none of the probe's CUDA devices" in p.split.unavailable["weights_bytes"]
    # ...and with HIP_VISIBLE_DEVICES=0 it is, by index, saying how
    pid = hip_worker(workers, {}, HIP_VISIBLE_DEVICES="0")
    p = process(join_splits(amd_gpus(pid, monkeypatch), workers.probes(), None, time.time()), pid)
    assert p.split.probe_device == "cuda:0" and "HIP_VISIBLE_DEVICES=0" in (p.split.joined_by or "")


def test_a_cuda_probe_is_not_joined_to_an_amd_gpu(workers: Workers, monkeypatch: pytest.MonkeyPatch) -> None:
    pid = hip_worker(workers, HIP_PROPS, hip=None)  # the same process on CUDA torch: torch.version.hip None
    p = process(join_splits(amd_gpus(pid, monkeypatch), workers.probes(), None, time.time()), pid)
    assert p.split.probe_device is None
    assert "computes with CUDA, not on this AMD GPU" in p.split.unavailable["weights_bytes"]


@pytest.mark.parametrize(("field", "value", "says"), [
    ("pci_bus_id", "0000:0c:00", "not a PCI address"), ("pci_bus_id", "0000:0c:00.0\x1b[2J", "not a PCI address"),
    ("pci_bus_id", 12, "expected"), ("runtime", "metal", "expected cuda or hip")])
def test_a_bad_pci_address_or_runtime_costs_only_that_device(workers: Workers, tmp_path: Path, field: str,
                                                              value: Any, says: str) -> None:
    hip_worker(workers, HIP_PROPS)
    (path,) = (workers.runtime / "dltop").glob("*.json")
    doc = json.loads(path.read_text())
    doc["devices"]["cuda:0"][field] = value
    other = tmp_path / "other" / "dltop"
    other.parent.mkdir()
    fd = open_private_dir(str(other))
    try:
        write_atomic(fd, path.name, json.dumps(doc).encode())
    finally:
        os.close(fd)
    (probe,) = read_probes([(str(other), os.getuid())]).processes
    assert "cuda:0" not in [d.device for d in probe.devices]
    why = probe.unavailable["devices.cuda:0"]
    assert says in why and "\n" not in why and "\x1b" not in why
