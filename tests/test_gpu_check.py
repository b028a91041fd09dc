"""benchmarks/gpu_check.py in its fake mode, end to end: a real worker process, the fake NVML through dltop's GPU
source and `dltop snapshot --json`, nvidia-smi's CSV made from the same scenario, and the report and exit code on
a passing and a failing comparison. (Its real mode needs an NVIDIA GPU with torch; see docs/gpu.md.)"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import DATA, REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.py"
MIB = 1 << 20


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


gpu_check = _load()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def lines(out: str, tag: str) -> list[str]:
    return [line[6:] for line in out.splitlines() if line.startswith(f"{tag}  ")]


def test_fake_run_passes_and_reports_each_check() -> None:
    r = run("--fake")
    assert r.returncode == 0, r.stdout + r.stderr
    worker = int(re.search(r"^INFO  worker pid (\d+):", r.stdout, re.M).group(1))  # type: ignore[union-attr]
    assert worker != 0
    total = json.loads((DATA / "gpu-scenarios/h100-2proc.json").read_text())["gpus"][0]["memory"]["total"]
    used = gpu_check.WEIGHTS_BYTES + gpu_check.KV_BYTES + gpu_check.FAKE_RESERVED_EXTRA + gpu_check.FAKE_CONTEXT
    passed = lines(r.stdout, "PASS")
    assert [x for x in passed if " split" not in x] == [
        f"torch allocated = weights + KV: {gpu_check.WEIGHTS_BYTES + gpu_check.KV_BYTES:,} B vs "
        f"{gpu_check.WEIGHTS_BYTES + gpu_check.KV_BYTES:,} B",
        f"process memory, dltop (dltop.sources.gpu) vs nvidia-smi: {used / MIB:.1f} MiB vs {used // MIB} MiB "
        "(0.00%, limit 1%)",
        f"process memory, dltop snapshot --json vs nvidia-smi: {used / MIB:.1f} MiB vs {used // MIB} MiB "
        "(0.00%, limit 1%)",
        f"NVML's process figure holds torch's reserved: {used / MIB:.1f} MiB >= "
        f"{(used - gpu_check.FAKE_CONTEXT) / MIB:.1f} MiB (non-torch 500.0 MiB)",
        f"GPU 0 memory total, dltop vs nvidia-smi: {total / MIB:.1f} MiB vs {total // MIB} MiB",
    ]
    # the worker's real probe file, joined to the fake NVML's process, in both readings
    for label in ("dltop snapshot --json", "dltop (join_splits)"):
        assert f"{label} split: weights and KV are the known bytes: {gpu_check.WEIGHTS_BYTES}, " \
               f"{gpu_check.KV_BYTES} vs {gpu_check.WEIGHTS_BYTES:,}, {gpu_check.KV_BYTES:,}" in passed
        assert f"{label} split sums to NVML's process figure: {used / MIB:.1f} MiB vs {used / MIB:.1f} MiB " \
               "(0.00%, within 1%)" in passed
        assert any(line.startswith(f"{label} split: torch allocated / reserved are the worker's own")
                   for line in passed)
        assert f"{label} split: weights 512.0 MiB, kv_cache 1024.0 MiB, allocator_cache 2.0 MiB, other_torch " \
               "0.0 MiB, non_torch 500.0 MiB; joined cuda:0 by uuid" in lines(r.stdout, "INFO")
    assert not lines(r.stdout, "SKIP")
    assert re.search(r"^INFO  NVML tick \(GpuReader.read, 1 GPU, 50 ticks\): wall median [\d.]+ ms, p95 [\d.]+ ms; "
                     r"CPU median [\d.]+ ms, p95 [\d.]+ ms; PCIe from throughput$", r.stdout, re.M)
    assert not lines(r.stdout, "FAIL")
    assert re.search(r"^result: PASS: 11 of 11 checks passed \([\d.]+ s\)$", r.stdout, re.M)


def test_fake_run_with_nvidia_smi_off_fails_with_its_numbers() -> None:
    r = run("--fake", "--fake-skew", "5")
    assert r.returncode == 1, r.stdout + r.stderr
    failed = lines(r.stdout, "FAIL")
    assert len(failed) == 2 and all(re.fullmatch(r"process memory, dltop .* vs nvidia-smi: 2038\.0 MiB vs 2139 MiB "
                                                 r"\(4\.72%, limit 1%\)", f) for f in failed), failed
    assert re.search(r"^result: FAIL: 9 of 11 checks passed", r.stdout, re.M)
    # Within the tolerance is still a pass.
    assert run("--fake", "--fake-skew", "0.5").returncode == 0


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed: a real run would start")
def test_real_mode_without_torch_says_what_is_missing() -> None:
    r = run()
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"FAIL  cannot run: torch is not installed for {sys.executable}" in r.stdout


def _cpu_only_torch() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.version.cuda is None


@pytest.mark.skipif(not _cpu_only_torch(), reason="needs a CPU-only torch build (the test extras' one)")
def test_real_mode_on_a_machine_without_a_gpu_says_so() -> None:
    r = run()
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout
    assert "FAIL  cannot run: torch " in r.stdout and "is a CPU-only build" in r.stdout
    assert re.search(r"^result: FAIL: 0 of \d+ checks passed", r.stdout, re.M)


@given(st.lists(st.tuples(st.integers(0, 2**22), st.one_of(st.integers(0, 2**40), st.sampled_from(
    ["[N/A]", "[Not Supported]"]))), max_size=5))
def test_nvidia_smi_csv(rows: list[tuple[int, int | str]]) -> None:
    text = "".join(f"{pid}, {mem}\n" for pid, mem in rows)
    assert gpu_check.parse_csv(text, 2) == [[pid, mem if isinstance(mem, int) else None] for pid, mem in rows]


def test_nvidia_smi_csv_with_the_wrong_columns_is_refused() -> None:
    with pytest.raises(ValueError, match="expected 3"):
        gpu_check.parse_csv("0, 81559\n", 3)
