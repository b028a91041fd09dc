"""GPU hints: an inference server's KV pool full with requests waiting, preemptions, a fragmented allocator, and
nvidia-smi's figure read as the KV cache's. Each fires only on numbers the Snapshots have (a split field the
probe did not give, a pool size the server did not publish, is no evidence)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from dltop.fmt import percent_text
from dltop.hints.base import Hint, rule, wanted
from dltop.hints.memory import gib
from dltop.model import ServerStats, Snapshot
from dltop.model.gpu import GpuProcess
from dltop.model.servers import ModelStats

KV_FULL = 0.95  # share of the KV pool in use
FRAGMENTED_RATIO = 1.5  # torch reserved / allocated
FRAGMENTED_MIN_BYTES = 1 << 30  # cached-but-free worth acting on
SMI_OVER_POOL = 2.0  # NVML's per-process figure / the KV pool in bytes


def _servers(snap: Snapshot) -> tuple[ServerStats, ...]:
    if not isinstance(snap.servers, tuple):
        return ()
    return tuple(s for s in snap.servers if s.state == "ok")


def _models(snap: Snapshot) -> Iterator[tuple[ServerStats, ModelStats]]:
    for s in _servers(snap):
        for m in s.models:
            yield s, m


def _name(s: ServerStats, m: ModelStats) -> str:
    return f"{m.model_name} on {s.url}" + (f" [{m.replica}]" if m.replica else "")


def _processes(snap: Snapshot) -> Iterator[GpuProcess]:
    if not isinstance(snap.gpus, tuple):
        return
    for g in snap.gpus:
        for procs in (g.processes, *(m.processes for m in g.mig_devices)):
            if isinstance(procs, tuple):
                yield from procs


@rule
def kv_pool_full(history: Sequence[Snapshot]) -> Hint | None:
    """A server's KV pool nearly full while requests wait: they queue for cache blocks, not for compute."""
    for s, m in _models(history[-1]):
        if not isinstance(m.kv_usage, float) or not isinstance(m.waiting_requests, int):
            continue
        if m.kv_usage < KV_FULL or m.waiting_requests <= 0 or not wanted("gpu-kv-pool-full", f"server {s.url}"):
            continue
        knob = ("--mem-fraction-static" if s.engine == "sglang" else "gpu_memory_utilization")
        return Hint(id="gpu-kv-pool-full", subject=f"server {s.url}", severity="warn",
                    text=(f"KV cache of {_name(s, m)} is {percent_text(100 * m.kv_usage)} full with "
                          f"{m.waiting_requests} request(s) waiting: they wait for cache blocks"),
                    fix=(f"raise {knob} carefully (from 0.85 up, a few hundredths at a time: weights, activations and "
                         f"the CUDA context need the rest) or lower max_num_seqs"),
                    numbers={"kv_usage": m.kv_usage, "waiting_requests": m.waiting_requests})
    return None


@rule
def preemptions_rising(history: Sequence[Snapshot]) -> Hint | None:
    """vLLM preempted requests within the window: the pool is too small for the load (work is recomputed)."""
    first: dict[tuple[str, str, str | None], tuple[int, float]] = {}  # the first count in the window, and its time
    for snap in history:
        for s, m in _models(snap):
            key = (s.url, m.model_name, m.replica)
            if isinstance(m.preemptions_total, int) and key not in first:
                first[key] = (m.preemptions_total, snap.ts)
    last = history[-1]
    for s, m in _models(last):
        key = (s.url, m.model_name, m.replica)
        if not isinstance(m.preemptions_total, int) or key not in first:
            continue
        new = m.preemptions_total - first[key][0]
        if new <= 0 or not wanted("gpu-kv-preemptions", f"server {s.url}"):  # none, or a restart
            continue
        span = last.ts - first[key][1]
        return Hint(id="gpu-kv-preemptions", subject=f"server {s.url}", severity="warn",
                    text=f"{_name(s, m)} preempted {new} request(s) in the last {span:.0f} s: the KV pool is too "
                         "small for the load, and preempted requests are recomputed",
                    fix="give the pool more memory (gpu_memory_utilization), or lower max_num_seqs / max_model_len",
                    numbers={"preemptions": new, "interval_s": span})
    return None


@rule
def allocator_fragmented(history: Sequence[Snapshot]) -> Hint | None:
    """PyTorch's allocator reserves far more than tensors use: fragmentation (needs the probe's numbers)."""
    # the split last passed over: the processes no probe speaks for share one (frozen) object, passed over at once
    passed = None
    for p in _processes(history[-1]):
        sp = p.split
        if sp is passed or not wanted("gpu-allocator-fragmented", f"process {p.pid}"):
            continue
        allocated, reserved = sp.torch_allocated_bytes, sp.torch_reserved_bytes
        if allocated is None or reserved is None:
            passed = sp
            continue
        cached = reserved - allocated
        if cached < FRAGMENTED_MIN_BYTES or reserved < FRAGMENTED_RATIO * allocated:
            continue
        return Hint(id="gpu-allocator-fragmented", subject=f"process {p.pid}", severity="warn",
                    text=(f"pid {p.pid}: PyTorch reserves {gib(reserved)} but tensors use {gib(allocated)}: "
                          f"{gib(cached)} is cached but free (fragmentation)"),
                    fix="try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                    numbers={"pid": p.pid, "reserved_bytes": reserved, "allocated_bytes": allocated})
    return None


@rule
def smi_far_above_kv_pool(history: Sequence[Snapshot]) -> Hint | None:
    """nvidia-smi's figure for a server's process is mostly not KV cache (only where the pool's bytes are known)."""
    last = history[-1]
    for s in _servers(last):
        pool = s.kv_capacity_bytes
        if not isinstance(pool, int) or pool <= 0 or not isinstance(s.pid, int):
            continue
        pids = {s.pid, *s.child_pids}
        used = sum(p.used_bytes for p in _processes(last) if p.pid in pids and p.used_bytes is not None)
        if used < SMI_OVER_POOL * pool or not wanted("gpu-smi-not-kv", f"server {s.url}"):
            continue
        return Hint(id="gpu-smi-not-kv", subject=f"server {s.url}", severity="info",
                    text=(f"nvidia-smi shows {gib(used)} for {s.url} but its KV pool is {gib(pool)}: the rest is "
                          "weights, activations and the CUDA context"),
                    fix="don't blame the KV cache for it: a bigger pool comes from a smaller model or more GPUs",
                    numbers={"nvml_used_bytes": used, "kv_capacity_bytes": pool})
    return None
