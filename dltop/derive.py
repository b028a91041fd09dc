"""Rates as pure functions of two Snapshots, and the GPU processes' split as a pure function of one Snapshot's
parts: live, pause and replay run this code and show the same numbers.

Hints are `dltop.hints`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dltop.fmt import human_bytes
from dltop.model import (
    CachesPart,
    GpuDevice,
    GpuPart,
    GpuProcess,
    MemoryPart,
    MemorySplit,
    ModelStats,
    ProbeDevice,
    ProbesPart,
    ProcessProbe,
    ServerStats,
    Snapshot,
    Unavailable,
)
from dltop.model.gpu import NO_PROBE, SPLIT_FIELDS, SplitSource, unprobed_split
from dltop.model.memory import DiskStat, VmStat

SECTOR_BYTES = 512


@dataclass(frozen=True)
class DiskRates:
    """One device over one interval, in the columns of `iostat -x`."""

    name: str
    reads_per_s: float
    writes_per_s: float
    read_bytes_per_s: float
    write_bytes_per_s: float
    await_ms: float | None  # None when no I/O completed in the interval (iostat prints 0.00)
    util_pct: float


@dataclass(frozen=True)
class VmRates:
    """Page-cache traffic over one interval."""

    refaults_per_s: float | None  # evicted file pages read back soon after: the cache is thrashing
    activations_per_s: float | None
    major_faults_per_s: float | None
    page_in_bytes_per_s: float | None
    page_out_bytes_per_s: float | None
    scanned_per_s: float | None
    oom_kills: int | None  # new OOM kills in the interval


def _rate(prev: int | None, cur: int | None, dt: float) -> float | None:
    if prev is None or cur is None or dt <= 0 or cur < prev:  # counter reset (reboot, replayed mix-up)
        return None
    return (cur - prev) / dt


def disk_rates(prev: Sequence[DiskStat], cur: Sequence[DiskStat], dt: float) -> list[DiskRates]:
    """iostat -x's r/s, w/s, rMB/s, wMB/s, await and %util for devices present in both readings."""
    before = {d.name: d for d in prev}
    out: list[DiskRates] = []
    if dt <= 0:
        return out
    for d in cur:
        p = before.get(d.name)
        if p is None or d.reads < p.reads or d.writes < p.writes:
            continue
        ios = (d.reads - p.reads) + (d.writes - p.writes)
        ticks = (d.read_time_ms - p.read_time_ms) + (d.write_time_ms - p.write_time_ms)
        out.append(DiskRates(
            name=d.name, reads_per_s=(d.reads - p.reads) / dt, writes_per_s=(d.writes - p.writes) / dt,
            read_bytes_per_s=(d.sectors_read - p.sectors_read) * SECTOR_BYTES / dt,
            write_bytes_per_s=(d.sectors_written - p.sectors_written) * SECTOR_BYTES / dt,
            await_ms=ticks / ios if ios > 0 else None,
            util_pct=min(100.0, max(0.0, (d.io_time_ms - p.io_time_ms) / (dt * 1000) * 100))))
    return out


def vm_rates(prev: VmStat, cur: VmStat, dt: float) -> VmRates:
    """Refaults, major faults, paging and reclaim scanning per second, from two /proc/vmstat readings."""
    pin = _rate(prev.pgpgin, cur.pgpgin, dt)
    pout = _rate(prev.pgpgout, cur.pgpgout, dt)
    oom = None
    if prev.oom_kill is not None and cur.oom_kill is not None and cur.oom_kill >= prev.oom_kill:
        oom = cur.oom_kill - prev.oom_kill
    return VmRates(
        refaults_per_s=_rate(prev.workingset_refault_file, cur.workingset_refault_file, dt),
        activations_per_s=_rate(prev.workingset_activate_file, cur.workingset_activate_file, dt),
        major_faults_per_s=_rate(prev.pgmajfault, cur.pgmajfault, dt),
        page_in_bytes_per_s=pin * 1024 if pin is not None else None,
        page_out_bytes_per_s=pout * 1024 if pout is not None else None,
        scanned_per_s=_rate(prev.pgscan, cur.pgscan, dt),
        oom_kills=oom,
    )


def memory_rates(prev: Snapshot | None, cur: Snapshot) -> tuple[VmRates | None, list[DiskRates]]:
    """The rates between two Snapshots' memory parts, or (None, []) when either lacks them."""
    if prev is None or not isinstance(prev.memory, MemoryPart) or not isinstance(cur.memory, MemoryPart):
        return None, []
    dt = cur.ts - prev.ts
    vm = None
    if isinstance(prev.memory.vmstat, VmStat) and isinstance(cur.memory.vmstat, VmStat):
        vm = vm_rates(prev.memory.vmstat, cur.memory.vmstat, dt)
    disks: list[DiskRates] = []
    if not isinstance(prev.memory.disks, Unavailable) and not isinstance(cur.memory.disks, Unavailable):
        disks = disk_rates(prev.memory.disks, cur.memory.disks, dt)
    return vm, disks


@dataclass(frozen=True)
class ServerRates:
    """One model behind one server over one interval."""

    url: str
    model_name: str
    replica: str | None
    # vLLM V1: new hits / new queries; the engine's own gauge (V0, SGLang) where it gives one; else why not.
    prefix_cache_hit_rate: float | Unavailable
    preemptions: int | None  # new preemptions in the interval (the pool is too small for the load)


def server_rates(prev: Snapshot | None, cur: Snapshot) -> list[ServerRates]:
    """Per model of every server answering in both Snapshots: the prefix-cache hit rate over the interval and
    the new preemptions; a counter that went backwards (a restart) gives no rate."""
    if prev is None or not isinstance(prev.servers, tuple) or not isinstance(cur.servers, tuple):
        return []
    before = {(s.url, m.model_name, m.replica): m for s in prev.servers for m in s.models}
    out = []
    for s in cur.servers:
        for m in s.models:
            p = before.get((s.url, m.model_name, m.replica))
            if p is not None:
                out.append(ServerRates(s.url, m.model_name, m.replica, _hit_rate(p, m), _new_preemptions(p, m)))
    return out


def _new_preemptions(p: ModelStats, m: ModelStats) -> int | None:
    """Preemptions since `p`; None where a reading lacks the counter or it went backwards (a restart)."""
    if (isinstance(p.preemptions_total, int) and isinstance(m.preemptions_total, int)
            and m.preemptions_total >= p.preemptions_total):
        return m.preemptions_total - p.preemptions_total
    return None


def _hit_rate(p: ModelStats, m: ModelStats) -> float | Unavailable:
    """vLLM V1's counters' new hits over new queries; the engine's own gauge where it has no counters."""
    if m.prefix_cache_hits_total is None or m.prefix_cache_queries_total is None:
        return m.prefix_cache_hit_rate
    if p.prefix_cache_hits_total is None or p.prefix_cache_queries_total is None:
        return Unavailable("no prefix-cache counters in the previous reading")
    hits = m.prefix_cache_hits_total - p.prefix_cache_hits_total
    queries = m.prefix_cache_queries_total - p.prefix_cache_queries_total
    if hits < 0 or queries < 0:
        return Unavailable("prefix-cache counters went backwards (the server restarted)")
    if queries == 0:
        return Unavailable("no prefix-cache queries in the interval")
    return min(1.0, hits / queries)


@dataclass(frozen=True)
class GpuRates:
    """One GPU's PCIe traffic over one interval (or, where the driver has no byte counters, NVML's own rate)."""

    index: int
    uuid: str | None
    pcie_tx_bytes_per_s: float | Unavailable
    pcie_rx_bytes_per_s: float | Unavailable
    nvlink_tx_bytes_per_s: float | Unavailable = Unavailable("no NVLink reading")
    nvlink_rx_bytes_per_s: float | Unavailable = Unavailable("no NVLink reading")


def gpu_rates(prev: Snapshot | None, cur: Snapshot) -> list[GpuRates]:
    """PCIe bytes per second per GPU of `cur`: the byte counters' difference over the interval where the GPU has
    them (a GPU is matched by index and UUID, so a swapped GPU gives no rate), else NVML's throughput reading."""
    if not isinstance(cur.gpus, tuple):
        return []
    before: dict[tuple[int, str | None], GpuDevice] = {}
    dt = 0.0
    if prev is not None and isinstance(prev.gpus, tuple):
        before = {(g.index, g.uuid): g for g in prev.gpus}
        dt = cur.ts - prev.ts
    out = []
    for g in cur.gpus:
        p = before.get((g.index, g.uuid))
        pcie_dt, link_dt = _span(p, g, "pcie_counters_at", dt), _span(p, g, "nvlink_counters_at", dt)
        out.append(GpuRates(g.index, g.uuid, _pcie_rate(p, g, "tx", pcie_dt), _pcie_rate(p, g, "rx", pcie_dt),
                            _counter_rate(p, g, "nvlink_tx_bytes_total", link_dt, "NVLink byte counter"),
                            _counter_rate(p, g, "nvlink_rx_bytes_total", link_dt, "NVLink byte counter")))
    return out


def _span(p: GpuDevice | None, g: GpuDevice, at: str, dt: float) -> float:
    """The interval two counter readings really span: between the times NVML stamped them where both have one,
    else between the two Snapshots."""
    then, now = (None if p is None else getattr(p, at)), getattr(g, at)
    return now - then if then is not None and now is not None else dt


def _counter_rate(p: GpuDevice | None, g: GpuDevice, total: str, dt: float, what: str) -> float | Unavailable:
    """Bytes per second of one of a GPU's cumulative byte counters (`what`, in the reasons) over the interval, or
    why there is none."""
    now = getattr(g, total)
    if now is None:
        return Unavailable(g.why(total) or f"no {what} reading")
    before = None if p is None else getattr(p, total)
    if before is None:
        return Unavailable(f"a rate needs two readings of the {what}")
    if dt <= 0:
        return Unavailable("no time between the two readings")
    if now < before:
        return Unavailable(f"the {what} went backwards (driver reloaded or GPU reset)")
    return (now - before) / dt


def _pcie_rate(p: GpuDevice | None, g: GpuDevice, direction: str, dt: float) -> float | Unavailable:
    """The PCIe byte counters' rate where the GPU has them (and had them before), else NVML's own rate."""
    if g.pcie_source == "byte_counters":
        before = p if p is not None and p.pcie_source == "byte_counters" else None
        return _counter_rate(before, g, f"pcie_{direction}_bytes_total", dt, "PCIe byte counter")
    per_s = f"pcie_{direction}_bytes_per_s"
    rate = getattr(g, per_s)
    return float(rate) if rate is not None else Unavailable(g.why(per_s) or "no PCIe reading")


def cache_growth(first: Snapshot, cur: Snapshot) -> dict[str, int]:
    """Bytes each cache grew (negative: shrank) from `first` to `cur`, by name; a cache without a size in
    either Snapshot (missing, unreadable, another path now) is left out, never 0."""
    if not isinstance(first.caches, CachesPart) or not isinstance(cur.caches, CachesPart):
        return {}
    out = {}
    for c in cur.caches.caches:
        before = first.caches.get(c.name)
        if before is not None and before.path == c.path and before.size_bytes is not None and c.size_bytes is not None:
            out[c.name] = c.size_bytes - before.size_bytes
    return out


# -- the split of each GPU process: its probe file and its inference server joined to NVML's figure ---------------

STALE_PROBE_S = 10.0  # a probe file older than this (the process stopped publishing) is not joined
ALLOCATED, RESERVED = "allocated_bytes.all.current", "reserved_bytes.all.current"
NO_MODEL = ("the process watches no model (probe.watch_model): its weights, if any, are counted in other torch")
NO_KV = ("the process names no KV cache to the probe (probe.watch_kv) and no server gives its pool: any KV cache "
         "is counted in other torch")
NO_OPTIMIZER = "the process watches no optimizer (probe.watch_optimizer)"
ON_MIG_ROW = unprobed_split("the GPU is in MIG mode: the split is on the row of the process's MIG instance")


def join_splits(gpus: GpuPart | Unavailable | None, probes: ProbesPart | Unavailable | None,
                servers: tuple[ServerStats, ...] | Unavailable | None, now: float) -> GpuPart | Unavailable | None:
    """Every GPU process's split (weights, KV cache, allocator cache, other torch, non-torch), from the probe file
    of the same process (same pid and start time) on the same device (by UUID; by index through
    CUDA_VISIBLE_DEVICES only where the probe gives no UUID) and from an inference server joined to the process;
    what neither can say is unknown with the reason. The one join the TUI, `snapshot`, the recorder and the
    exporter all see: the Sampler applies it when it composes a Snapshot."""
    if not isinstance(gpus, tuple):
        return gpus
    by_pid = {p.pid: p for p in probes.processes} if isinstance(probes, ProbesPart) else {}
    served = _server_kv(gpus, servers)
    if not by_pid and not served:
        return gpus
    one_model = len({g.name for g in gpus}) == 1

    def joined(g: GpuDevice) -> GpuDevice:
        if g.mig_devices and isinstance(g.processes, tuple):
            # In MIG mode the parent lists each instance's processes too, without their memory: the split is
            # on the instance's row, which has NVML's figure and the instance's UUID.
            procs: tuple[GpuProcess, ...] | Unavailable = tuple(
                replace(p, split=ON_MIG_ROW) if p.pid in by_pid or p.pid in served else p for p in g.processes)
        else:
            dev = _Device(g.uuid, _runtime_index(gpus, g), gpus, one_model, g.bus_id, g.backend)
            procs = _join_list(g.processes, dev, by_pid, served, now)
        migs = tuple(replace(m, processes=_join_list(m.processes, _Device(m.uuid, None, gpus, one_model), by_pid,
                                                     served, now)) for m in g.mig_devices)
        return replace(g, processes=procs, mig_devices=migs)

    return tuple(joined(g) for g in gpus)


def _runtime_index(gpus: GpuPart, g: GpuDevice) -> int:
    """cuda:N counts within one runtime: CUDA's GPUs are NVML's, HIP's are amdsmi's, each numbered from 0."""
    return next(i for i, x in enumerate(x for x in gpus if x.backend == g.backend) if x is g)


@dataclass(frozen=True)
class _Device:
    uuid: str | None
    index: int | None  # among its runtime's GPUs (NVML's, or amdsmi's); None for a MIG instance
    gpus: GpuPart
    one_model: bool  # every GPU of one model: CUDA's enumeration is the bus order, as NVML's
    bus_id: str | None = None
    backend: str = "nvml"


def _join_list(procs: tuple[GpuProcess, ...] | Unavailable, dev: _Device, by_pid: dict[int, ProcessProbe],
               served: dict[int, tuple[int, str] | str], now: float) -> tuple[GpuProcess, ...] | Unavailable:
    if isinstance(procs, Unavailable):
        return procs
    return tuple(p if p.pid not in by_pid and p.pid not in served
                 else replace(p, split=check_whole(p, process_split(p, by_pid.get(p.pid), dev, served.get(p.pid), now),
                                                   served.get(p.pid)))
                 for p in procs)


PART_NAMES = {"weights_bytes": "weights", "kv_cache_bytes": "KV cache", "allocator_cache_bytes": "allocator cache",
              "other_torch_bytes": "other torch", "non_torch_bytes": "non-torch"}
SOURCE_NAMES = {"probe": "the probe", "nvml-probe": "NVML less the probe's reserved", "server": "the server"}


def check_whole(p: GpuProcess, split: MemorySplit, server: tuple[int, str] | str | None) -> MemorySplit:
    """`split`, marked inconsistent where its known parts add up to more than NVML's figure for the process (a
    server's KV pool of 34.9 GiB on a process NVML gives 30.0 GiB): both numbers and where each part comes from."""
    known = [(name, v) for name in SPLIT_FIELDS if (v := getattr(split, name)) is not None]
    parts = sum(v for _, v in known)
    if p.used_bytes is None or parts <= p.used_bytes:
        return split

    def source(name: str) -> str:
        where = split.sources.get(name)
        if where == "server" and isinstance(server, tuple):
            return f"the server {server[1]}"
        return SOURCE_NAMES.get(where or "", "?")

    said = " + ".join(f"{PART_NAMES[name]} {human_bytes(v)} from {source(name)}" for name, v in known)
    return replace(split, parts_bytes=parts, inconsistent=(
        f"inconsistent: the parts ({said}) add up to {human_bytes(parts)}, more than NVML's "
        f"{human_bytes(p.used_bytes)} for the process: read at different moments, or one of them is wrong"))


def _server_kv(gpus: GpuPart, servers: tuple[ServerStats, ...] | Unavailable | None) -> dict[int, tuple[int, str] | str]:
    """pid -> (KV pool bytes, server URL) for the one GPU process a server is joined to, or why not."""
    if not isinstance(servers, tuple):
        return {}
    places = _gpu_pids(gpus)
    out: dict[int, tuple[int, str] | str] = {}
    for s in servers:
        if s.state == "ok" and isinstance(s.pid, int):
            pids = {s.pid, *s.child_pids}
            held = [pid for pid in places if pid in pids]
            out.update(dict.fromkeys(held, _pool_share(s, len(held))))
    return out


def _gpu_pids(gpus: GpuPart) -> list[int]:
    """The pid of every process on a GPU or a MIG instance, once per place it holds."""
    out = []
    for g in gpus:
        for procs in (g.processes, *(m.processes for m in g.mig_devices)):
            if isinstance(procs, tuple):
                out += [p.pid for p in procs]
    return out


def _pool_share(s: ServerStats, processes: int) -> tuple[int, str] | str:
    """A server's KV pool as one GPU process's of the `processes` it runs on, or why it is not known."""
    pool = s.kv_capacity_bytes
    if isinstance(pool, Unavailable):
        return f"{s.url}: {pool.reason}"
    if processes > 1:
        return (f"the KV pool of {s.url} spans {processes} GPU processes (tensor parallel): "
                "each one's share is not known")
    return pool, s.url


def _norm_uuid(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-").removeprefix("mig-")


def _pci(address: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of "0000:18:00.0" or NVML's "00000000:18:00.0"; None for anything else."""
    try:
        domain, bus, rest = (address or "").split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return None


def _no_device_reason(probe: ProcessProbe, hip: bool) -> str:
    """Why a probe has no device of this GPU's runtime."""
    if any(d.device.startswith("cuda") for d in probe.devices):
        other = "ROCm (HIP)" if not hip else "CUDA"
        return f"the probe in pid {probe.pid} computes with {other}, not on this {'AMD' if hip else 'NVIDIA'} GPU"
    where = " (its watched tensors are on the CPU)" if probe.devices else ""
    return (f"the probe in pid {probe.pid} sees no CUDA device{where}: torch.cuda is not initialised in it, "
            "or it computes with something other than PyTorch")


def _unnamed(cuda: list[ProbeDevice], dev: _Device, hip: bool) -> list[ProbeDevice]:
    """The probe's devices that neither a UUID (not on HIP) nor a PCI address (where this GPU has one) names."""
    bus = _pci(dev.bus_id)
    return [d for d in cuda if not (d.uuid and not hip) and not (d.pci_bus_id and bus is not None)]


def _device_by_env(probe: ProcessProbe, dev: _Device, hip: bool,
                   unnamed: list[ProbeDevice]) -> tuple[ProbeDevice, str] | str | None:
    """cuda:N through CUDA_VISIBLE_DEVICES to NVML's index, for a probe that gives no UUID; None: no match.

    On HIP: HIP_VISIBLE_DEVICES, else ROCR_VISIBLE_DEVICES, else CUDA_VISIBLE_DEVICES, which HIP honours too."""
    names = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if hip else (
        "CUDA_VISIBLE_DEVICES",)
    if "allocator_env" in probe.truncated:
        return f"the probe gives no UUID, and dropped its environment ({names[0]}) to fit 4 KiB"
    entries, said = _visible_devices(probe, names)
    in_order = probe.allocator_env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" or dev.one_model
    for d in unnamed:
        entry = _visible_entry(d.device, entries)
        found = None if entry is None else _entry_is(d, entry, dev, said, in_order)
        if found is not None:
            return found
    return None


def _visible_devices(probe: ProcessProbe, names: tuple[str, ...]) -> tuple[list[str] | None, str]:
    """The entries of the first of `names` the probe's environment sets (None: unset), and that setting in words."""
    var = next((n for n in names if n in probe.allocator_env), names[0])
    visible = probe.allocator_env.get(var)
    if visible is None:
        return None, f"{var} unset"
    return [e.strip() for e in visible.split(",")], f"{var}={visible}"


def _entry_is(d: ProbeDevice, entry: str, dev: _Device, said: str, in_order: bool) -> tuple[ProbeDevice, str] | str | None:
    """Whether the *_VISIBLE_DEVICES entry of probe device `d` (a UUID's prefix, or an index) is this GPU."""
    if entry.lower().startswith(("gpu-", "mig-")):
        if dev.uuid and dev.uuid.lower().startswith(entry.lower()):
            return d, f"{d.device} is {entry} by {said} (the probe gave no UUID)"
        return None
    if not (entry.isdigit() and dev.index is not None and int(entry) == dev.index):
        return None
    if not in_order:
        return (f"the probe gives no UUID, and {d.device} → GPU {dev.index} by index is a guess: CUDA "
                "orders mixed GPUs fastest first, NVML by bus (set CUDA_DEVICE_ORDER=PCI_BUS_ID)")
    return d, f"{d.device} is GPU {dev.index} by index, {said} (the probe gave no UUID)"


def _visible_entry(device: str, entries: list[str] | None) -> str | None:
    """The *_VISIBLE_DEVICES entry that "cuda:N" is (N itself when the variable is unset); None for none."""
    try:
        n = int(device.split(":")[1])
    except (IndexError, ValueError):
        return None
    if entries is None:
        return str(n)
    return entries[n] if n < len(entries) else None


def _device_by_address(cuda: list[ProbeDevice], dev: _Device, hip: bool) -> tuple[ProbeDevice, str] | None:
    """The probe device with this GPU's UUID (not on HIP: its UUIDs are not amdsmi's), else its PCI address."""
    if dev.uuid and not hip:
        uuid = _norm_uuid(dev.uuid)
        for d in cuda:
            if d.uuid and _norm_uuid(d.uuid) == uuid:
                return d, "uuid"
    if (bus := _pci(dev.bus_id)) is not None:
        for d in cuda:
            if _pci(d.pci_bus_id) == bus:
                return d, "pci"
    return None


def _runtime_devices(probe: ProcessProbe, hip: bool) -> list[ProbeDevice]:
    """The probe's devices of this GPU's runtime, CUDA or HIP (a probe file from before `runtime` was written is
    CUDA's)."""
    return [d for d in probe.devices if d.device.startswith("cuda") and (d.runtime == "hip") == hip]


def probe_device(probe: ProcessProbe, dev: _Device) -> tuple[ProbeDevice, str] | str:
    """The probe's CUDA (or HIP) device that is this GPU, and how it was matched; or why none is."""
    hip = dev.backend == "amdsmi"
    cuda = _runtime_devices(probe, hip)
    if not cuda:
        return _no_device_reason(probe, hip)
    named = _device_by_address(cuda, dev, hip)
    if named is not None:
        return named
    unnamed = _unnamed(cuda, dev, hip)
    if not unnamed:
        theirs = ", ".join(f"{d.device} {d.uuid or d.pci_bus_id}" for d in cuda)
        return f"the probe's CUDA devices ({theirs}) are not this GPU ({dev.uuid or 'no UUID from NVML'})"
    found = _device_by_env(probe, dev, hip, unnamed)
    if found is not None:
        return found
    return f"none of the probe's CUDA devices ({', '.join(d.device for d in cuda)}) is this GPU"


def process_split(p: GpuProcess, probe: ProcessProbe | None, dev: _Device, server: tuple[int, str] | str | None,
                  now: float) -> MemorySplit:
    """One process's split on one device (see `join_splits`)."""
    values: dict[str, int] = {}
    sources: dict[str, SplitSource] = {}
    why: dict[str, str] = {}
    kv_server = server if isinstance(server, tuple) else None

    def unknown(reason: str) -> MemorySplit:
        split = unprobed_split(reason)
        if kv_server is None:
            return split
        return replace(split, kv_cache_bytes=kv_server[0], sources={"kv_cache_bytes": "server"},
                       unavailable={k: v for k, v in split.unavailable.items() if k != "kv_cache_bytes"})

    if probe is None:
        return unknown(NO_PROBE)
    if p.start_time_ticks is None:
        return unknown(f"pid {p.pid} is not in dltop's /proc: its probe file cannot be told from another process's")
    if p.start_time_ticks != probe.start_time_ticks:
        return unknown(f"pid {p.pid} was reused: the probe file is of a process started at tick "
                       f"{probe.start_time_ticks}, NVML's started at tick {p.start_time_ticks}")
    age = now - probe.published_at
    if age > STALE_PROBE_S:
        return unknown(f"the probe's last reading is {age:.0f} s old (the process stopped publishing)")
    found = probe_device(probe, dev)
    if isinstance(found, str):
        return unknown(found)
    d, joined_by = found
    _watched_values(probe, d, server, values, sources, why)
    _allocator_values(p, d, values, sources, why)
    return MemorySplit(**values, probe_device=d.device, joined_by=joined_by, sources=sources,  # type: ignore[arg-type]
                       unavailable=why)


def _watched_values(probe: ProcessProbe, d: ProbeDevice, server: tuple[int, str] | str | None,
                    values: dict[str, int], sources: dict[str, SplitSource], why: dict[str, str]) -> None:
    """The parts the probe watches (weights, gradients, optimizer, KV; the server's KV pool else), or why not."""
    watched = probe.watched or {  # an older probe does not say what it watches: what it counts, then
        "models": d.weights_bytes, "optimizers": d.optimizer_bytes, "kv": d.kv_bytes}
    models, optimizers, kv_watched = (watched.get(k, 0) > 0 for k in ("models", "optimizers", "kv"))
    if models:
        values.update(weights_bytes=d.weights_bytes, gradients_bytes=d.gradients_bytes)
    else:
        why.update(weights_bytes=NO_MODEL, gradients_bytes=NO_MODEL)
    if optimizers:
        values["optimizer_bytes"] = d.optimizer_bytes
    else:
        why["optimizer_bytes"] = NO_OPTIMIZER
    if kv_watched:
        values["kv_cache_bytes"] = d.kv_bytes
    elif isinstance(server, tuple):
        values["kv_cache_bytes"] = server[0]
        sources["kv_cache_bytes"] = "server"
    else:
        why["kv_cache_bytes"] = server if isinstance(server, str) else NO_KV
    sources.update({k: "probe" for k in values if k not in sources})


def _allocator_values(p: GpuProcess, d: ProbeDevice, values: dict[str, int], sources: dict[str, SplitSource],
                      why: dict[str, str]) -> None:
    """The allocator's cache, other torch and non-torch bytes from torch's memory stats and NVML, or why not."""
    allocated, reserved = d.memory_stats.get(ALLOCATED), d.memory_stats.get(RESERVED)
    if allocated is None or reserved is None:
        no_stats = f"the probe has no torch.cuda.memory_stats() for {d.device}"
        why.update(allocator_cache_bytes=no_stats, other_torch_bytes=no_stats, non_torch_bytes=no_stats)
    else:
        values.update(torch_allocated_bytes=allocated, torch_reserved_bytes=reserved)
        sources.update(torch_allocated_bytes="probe", torch_reserved_bytes="probe")
        _remainder(values, sources, why, "allocator_cache_bytes", reserved, allocated, "probe",
                   f"torch reserved {reserved:,} is less than allocated {allocated:,}")
        named = sum(values.get(k, 0) for k in ("weights_bytes", "kv_cache_bytes"))
        _remainder(values, sources, why, "other_torch_bytes", allocated, named, "probe",
                   f"weights + KV ({named:,}) exceed torch allocated ({allocated:,})")
        if p.used_bytes is None:
            why["non_torch_bytes"] = p.unavailable.get("used_bytes", "NVML gives no memory for this process")
        else:
            _remainder(values, sources, why, "non_torch_bytes", p.used_bytes, reserved, "nvml-probe",
                       f"NVML's {p.used_bytes:,} is less than torch reserved {reserved:,}")


def _remainder(values: dict[str, int], sources: dict[str, SplitSource], why: dict[str, str], name: str,
               whole: int, part: int, source: SplitSource, said: str) -> None:
    """values[name] = whole - part; a negative remainder is not clamped to 0: the readings disagree."""
    if whole >= part:
        values[name] = whole - part
        sources[name] = source
    else:
        why[name] = f"inconsistent: {said} (read at different moments); not shown"
