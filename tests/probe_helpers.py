"""Helpers for the probe tests: run a script with the probe in a subprocess, pointed at a test's directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dltop.model import ProbesPart

REPO = Path(__file__).resolve().parents[1]


def probe_env(runtime_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a process whose probe publishes into runtime_dir/dltop."""
    env = {k: v for k, v in os.environ.items() if k not in ("DLTOP_PROBE", "DLTOP_PROBE_DIR")}
    env.update(XDG_RUNTIME_DIR=str(runtime_dir), **extra)
    return env


# A process with the probe on a GPU, for the split's tests on a machine without one: the probe's own code
# publishes its real file, but `torch` is a stand-in whose `cuda` reports what a GPU process's would (the UUID,
# memory_stats) and whose tensors sit on "cuda:0". argv[1] is JSON: uuid (null: no UUID, as an older torch),
# allocated, reserved, and the bytes of weights, gradients, optimizer state and KV cache (each a multiple of 2).
# The start of a stand-in worker: argv[1]'s JSON as `spec`, and tensors on "cuda:0" and a model holding them.
STANDIN_TENSORS = r"""
import json, sys, time, types
spec = json.loads(sys.argv[1])

class Tensor:
    def __init__(self, nbytes, grad=None):
        self.n, self.device, self.grad = nbytes // 2, "cuda:0", grad
    def numel(self): return self.n
    def element_size(self): return 2

class Model:
    def __init__(self, params): self.params = params
    def parameters(self): return iter(self.params)
    def buffers(self): return iter(())
"""
GPU_WORKER = STANDIN_TENSORS + r"""
class Optimizer:
    def __init__(self, state): self.state = state

class Cuda:
    def is_initialized(self): return True
    def current_device(self): return 0
    def memory_stats(self, i):
        return {"allocated_bytes.all.current": spec["allocated"], "reserved_bytes.all.current": spec["reserved"]}
    def get_device_properties(self, i):
        return types.SimpleNamespace(**({"uuid": spec["uuid"]} if spec["uuid"] else {}))

sys.modules["torch"] = types.SimpleNamespace(cuda=Cuda(), __version__="2.13.0+cu130 (stand-in)")
from dltop import probe
weights = Tensor(spec["weights"], grad=Tensor(spec["gradients"]))
model, kv = Model([weights]), [Tensor(spec["kv"])]
opt = Optimizer({weights: {"exp_avg": Tensor(spec["optimizer"])}})
probe.watch_model(model)
probe.watch_optimizer(opt)
if spec["kv"]:
    probe.watch_kv(kv)
probe.start(interval_s=0.2)
print("ready", flush=True)
time.sleep(120)
"""

# A real PyTorch process on the CPU (this machine's torch), its model watched: a probe with no CUDA device.
CPU_WORKER = r"""
import time, torch
from dltop import probe
model = torch.nn.Linear(64, 64)
probe.watch_model(model)
probe.start(interval_s=0.2)
print("ready", flush=True)
time.sleep(120)
"""

MIB = 1 << 20
# what the stand-in GPU process holds, in bytes (allocated covers the named tensors, reserved covers allocated)
SPEC = {"weights": 512 * MIB, "gradients": 512 * MIB, "optimizer": 1024 * MIB, "kv": 256 * MIB,
        "allocated": 2600 * MIB, "reserved": 3072 * MIB}


class Workers:
    """Processes running the probe, publishing into one private directory."""

    def __init__(self, runtime: Path) -> None:
        self.runtime = runtime
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, script: str, *args: str, **env: str) -> int:
        p = subprocess.Popen([sys.executable, "-c", script, *args], env=probe_env(self.runtime, **env), cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
        self.procs.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return p.pid

    def gpu(self, uuid: str | None, **changes: int) -> int:
        return self.start(GPU_WORKER, json.dumps({**SPEC, **changes, "uuid": uuid}))

    def probes(self) -> ProbesPart:
        from dltop.sources.probes import read_probes

        return read_probes([(str(self.runtime / "dltop"), os.getuid())])

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
