"""Epochs as the user means them in zero-code mode (DLTOP_PROBE=1, issue 34 item 3): a pass over the loader's
sampler, also with persistent workers (the DataLoader keeps its iterator and resets it), or what the script tells
its sampler (`set_epoch`). Real DataLoaders with real workers on the CPU, in a subprocess each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.probe_helpers import REPO, probe_env

pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, the test extra)")

PERSISTENT = """
import os, time, torch
ds = torch.utils.data.TensorDataset(torch.zeros(24, 4))
train = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(16, 4)), batch_size=8, num_workers=1, persistent_workers=True)
model = torch.nn.Linear(4, 2).to("cpu")
for epoch in range(3):
    for (x,) in train:
        model(x).sum().backward()
    time.sleep(0.4)  # after the pass: validation, a checkpoint (not the epoch's)
    for (x,) in val:
        model(x)
print(os.getpid(), flush=True)
"""

SET_EPOCH = """
import os, torch
from torch.utils.data.distributed import DistributedSampler
ds = torch.utils.data.TensorDataset(torch.zeros(12, 4))
sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=False)
loader = torch.utils.data.DataLoader(ds, batch_size=2, sampler=sampler)  # 6 batches a pass
model = torch.nn.Linear(4, 2).to("cpu")
def forever():
    while True:
        yield from loader
batches = forever()
for epoch in range(3):
    sampler.set_epoch(epoch)
    for _ in range(4):  # 4 steps an epoch over a loader that goes on
        model(next(batches)[0]).sum().backward()
print(os.getpid(), flush=True)
"""


def _epochs(code: str, tmp_path: Path) -> list[dict]:
    r = subprocess.run([sys.executable, "-c", code], env=probe_env(tmp_path, DLTOP_PROBE="1", PYTHONPATH=str(REPO)),
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "dltop" / f"{int(r.stdout)}.json").read_text())
    assert doc["exit"]["how"] == "exit"
    return doc["epochs"]


def test_persistent_workers_give_one_epoch_a_pass(tmp_path: Path) -> None:
    """Three passes over a loader with persistent workers are three epochs of 6 steps (they were one of 18: the
    iterator is reused, so no new one starts); each closes when its pass runs out, so the time after it (a sleep,
    the val loader, also persistent and not timed) is in no epoch."""
    epochs = _epochs(PERSISTENT, tmp_path)
    assert [e["steps"] for e in epochs] == [6, 6, 6]
    assert [e["samples"] for e in epochs] == [24, 24, 24]  # the loader's batch size: samples/s unasked
    for before, after in zip(epochs, epochs[1:], strict=False):
        assert after["started_at"] - before["ended_at"] >= 0.35  # the 0.4 s sleep is between, not inside


def test_set_epoch_says_where_epochs_are(tmp_path: Path) -> None:
    """A loop of 4 steps an epoch over a loader that goes on, telling its sampler each epoch: the epochs are the
    script's (4 steps each), not the passes over the data (6)."""
    epochs = _epochs(SET_EPOCH, tmp_path)
    assert [e["steps"] for e in epochs] == [4, 4, 4]
