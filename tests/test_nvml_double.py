"""The benchmarks' NVML double (benchmarks/nvml_double: a `pynvml` module and a stub libnvidia-ml.so.1) gives dltop,
through its real pynvml backend, the same GPUs and processes as the project's fake gives from the same scenario:
the side-by-side with nvitop (benchmarks/gpu_vs_nvitop.py) measures dltop reading what the tests check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "tests/data/gpu-scenarios/8gpu-20proc.json"
KEPT = ("index", "name", "uuid", "bus_id", "driver_version", "memory_total_bytes", "memory_used_bytes",
        "memory_free_bytes", "memory_reserved_bytes", "utilization_gpu_percent", "temperature_c", "power_mw",
        "power_limit_mw", "clock_sm_mhz", "pcie_source", "pcie_tx_bytes_total", "pcie_rx_bytes_total")


def _gpus(env: dict[str, str]) -> list[dict]:
    out = subprocess.run([sys.executable, "-P", "-m", "dltop", "snapshot", "--json", "--no-discover"],
                         capture_output=True, text=True, env=env, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["gpus"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler for the stub libnvidia-ml.so.1")
def test_the_double_reads_as_the_fake(tmp_path: Path) -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"),
                    str(REPO / "benchmarks/nvml_double/stub.c")], check=True)
    base = {k: v for k, v in os.environ.items() if k not in ("DLTOP_FAKE_NVML", "PYTHONPATH")}
    double = _gpus({**base, "PYTHONPATH": f"{REPO / 'benchmarks/nvml_double'}{os.pathsep}{REPO}",
                    "LD_LIBRARY_PATH": str(tmp_path), "NVML_DOUBLE_SCENARIO": str(SCENARIO)})
    fake = _gpus({**base, "PYTHONPATH": str(REPO), "DLTOP_FAKE_NVML": str(SCENARIO)})
    assert len(double) == len(fake) == 8
    for d, f in zip(double, fake, strict=True):
        assert {k: d[k] for k in KEPT} == {k: f[k] for k in KEPT}
        assert [(p["pid"], p["used_bytes"]) for p in d["processes"]] == \
            [(p["pid"], p["used_bytes"]) for p in f["processes"]]
        assert len(d["processes"]) == 20
