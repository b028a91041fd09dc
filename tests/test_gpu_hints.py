"""GPU hints on constructed Snapshot sequences: each fires on the numbers it names and stays quiet on missing
numbers (a split the probe did not give, a pool size the server did not publish) and below its threshold."""

from __future__ import annotations

import dataclasses

from dltop.hints import hints
from dltop.hints.gpu import (
    FRAGMENTED_MIN_BYTES,
    KV_FULL,
    allocator_fragmented,
    kv_pool_full,
    preemptions_rising,
    smi_far_above_kv_pool,
)
from dltop.model import GpuDevice, ServerStats, Snapshot, Unavailable
from dltop.model.gpu import GpuProcess, MemorySplit
from dltop.model.servers import ModelStats

GiB = 1 << 30
URL = "http://127.0.0.1:8000/metrics"


def model(**kw: object) -> ModelStats:
    base: dict[str, object] = dict(model_name="m", kv_usage=0.5, kv_capacity_tokens=100_000, running_requests=4,
                                   waiting_requests=0, preemptions_total=0)
    return ModelStats(**{**base, **kw})  # type: ignore[arg-type]


def server(*models: ModelStats, **kw: object) -> ServerStats:
    base: dict[str, object] = dict(url=URL, state="ok", engine="vllm", models=models, pid=4242)
    return ServerStats(**{**base, **kw})  # type: ignore[arg-type]


def snap(ts: float, servers: tuple[ServerStats, ...] = (), procs: tuple[GpuProcess, ...] = ()) -> Snapshot:
    gpu = GpuDevice(index=0, name="H100", memory_total_bytes=80 * GiB, memory_used_bytes=70 * GiB, processes=procs)
    return Snapshot(ts=ts, host="t", servers=servers, gpus=(gpu,))


def test_kv_pool_full_with_requests_waiting() -> None:
    full = server(model(kv_usage=0.97, waiting_requests=12))
    h = kv_pool_full([snap(1.0, (full,))])
    assert h is not None and h.id == "gpu-kv-pool-full" and h.numbers == {"kv_usage": 0.97, "waiting_requests": 12}
    assert "97% full with 12 request(s) waiting" in h.text
    assert "gpu_memory_utilization" in h.fix and "0.85" in h.fix and "max_num_seqs" in h.fix
    # full but nobody waiting, waiting but room, or usage unknown: no hint
    assert kv_pool_full([snap(1.0, (server(model(kv_usage=0.99, waiting_requests=0)),))]) is None
    assert kv_pool_full([snap(1.0, (server(model(kv_usage=KV_FULL - 0.01, waiting_requests=5)),))]) is None
    assert kv_pool_full([snap(1.0, (server(model(kv_usage=Unavailable("x"), waiting_requests=5)),))]) is None
    # a server that is down has no numbers: no hint from its last ones
    assert kv_pool_full([snap(1.0, (dataclasses.replace(full, state="down"),))]) is None
    # SGLang's knob has another name
    sg = kv_pool_full([snap(1.0, (server(model(kv_usage=0.97, waiting_requests=1), engine="sglang"),))])
    assert sg is not None and "--mem-fraction-static" in sg.fix


def test_preemptions_rising_within_the_window() -> None:
    seq = [snap(float(t), (server(model(preemptions_total=p)),)) for t, p in ((0, 10), (2, 10), (4, 13))]
    h = preemptions_rising(seq)
    assert h is not None and h.numbers == {"preemptions": 3, "interval_s": 4.0} and "too small" in h.text
    assert preemptions_rising(seq[:2]) is None  # steady counter
    restarted = [*seq, snap(6.0, (server(model(preemptions_total=0)),))]
    assert preemptions_rising([restarted[0], restarted[-1]]) is None  # went backwards: a restart, not a rate
    # the registry draws it too (the window is the last 60 s)
    assert "gpu-kv-preemptions" in [x.id for x in hints(seq)]


def _proc(**split: int | None) -> GpuProcess:
    return GpuProcess(pid=77, used_bytes=60 * GiB, split=MemorySplit(**split))  # type: ignore[arg-type]


def test_fragmentation_needs_the_probe_s_numbers() -> None:
    # no probe: the split is unknown; the rule must not fire on None
    assert allocator_fragmented([snap(1.0, procs=(GpuProcess(pid=77, used_bytes=60 * GiB),))]) is None
    frag = _proc(torch_allocated_bytes=26 * GiB, torch_reserved_bytes=46 * GiB)
    h = allocator_fragmented([snap(1.0, procs=(frag,))])
    assert h is not None and h.numbers == {"pid": 77, "reserved_bytes": 46 * GiB, "allocated_bytes": 26 * GiB}
    assert "expandable_segments:True" in h.fix and "20.0 GiB is cached but free" in h.text
    tight = _proc(torch_allocated_bytes=26 * GiB, torch_reserved_bytes=28 * GiB)
    assert allocator_fragmented([snap(1.0, procs=(tight,))]) is None  # 28 of 26: normal caching
    small = _proc(torch_allocated_bytes=FRAGMENTED_MIN_BYTES // 4,
                  torch_reserved_bytes=FRAGMENTED_MIN_BYTES // 4 + FRAGMENTED_MIN_BYTES // 2)
    assert allocator_fragmented([snap(1.0, procs=(small,))]) is None  # a big ratio of little memory


def test_smi_far_above_the_kv_pool_only_where_the_pool_s_bytes_are_known() -> None:
    engine = GpuProcess(pid=4243, used_bytes=70 * GiB)  # vLLM V1's EngineCore, a child of the API server
    unknown = server(model())  # engines publish no pool bytes: kv_capacity_bytes is unavailable
    assert smi_far_above_kv_pool([snap(1.0, (unknown,), (engine,))]) is None
    known = dataclasses.replace(unknown, kv_capacity_bytes=20 * GiB, child_pids=(4243,))
    h = smi_far_above_kv_pool([snap(1.0, (known,), (engine,))])
    assert h is not None and h.numbers == {"nvml_used_bytes": 70 * GiB, "kv_capacity_bytes": 20 * GiB}
    assert "don't blame the KV cache" in h.fix
    most = dataclasses.replace(known, kv_capacity_bytes=50 * GiB)
    assert smi_far_above_kv_pool([snap(1.0, (most,), (engine,))]) is None  # the pool is most of it
    # not joined (another pid): no figure to compare
    assert smi_far_above_kv_pool([snap(1.0, (dataclasses.replace(known, child_pids=()),), (engine,))]) is None
