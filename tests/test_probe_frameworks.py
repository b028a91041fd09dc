"""The probe's framework callbacks, run with the real packages on the CPU: a Hugging Face Trainer on a tiny model
built from a config (no download) and a Lightning Trainer on a tiny module, each for a few steps. What the probe
publishes is read back through dltop's reader: steps, samples, tokens, the loss and the epochs as the framework
itself counted them."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

import dltop.probe as probe
from dltop.sources.probes import parse_probe


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A probe of its own, publishing into the test's directory; stopped after the test."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("DLTOP_PROBE_DIR", raising=False)
    monkeypatch.setattr(probe, "state", probe._State())
    yield probe
    probe.stop()


def test_importing_the_probe_imports_no_framework() -> None:
    import subprocess
    import sys

    code = "import sys, dltop.probe; print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.strip() == "[]"


def test_hugging_face_trainer_callback(fresh_probe, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (the test extra)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the test extra)")
    pytest.importorskip("accelerate", reason="accelerate is not installed (the Trainer needs it: the test extra)")
    from dltop.probe.hf import DltopTrainerCallback

    seq, batch, samples = 8, 4, 8  # 2 steps an epoch, 6 steps: 3 epochs
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=seq)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 64, (samples, seq))
    data = [{"input_ids": ids[i], "labels": ids[i]} for i in range(samples)]
    logged: list[tuple[float, float]] = []  # (epoch, loss) as the Trainer logged them

    class Record(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                logged.append((state.epoch, logs["loss"]))

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=batch, logging_steps=1,
        report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        include_num_input_tokens_seen=True, learning_rate=1e-3)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[Record(), DltopTrainerCallback(interval_s=60)])
    trainer.train()
    p = parse_probe(probe.report(), "x", os.getuid())
    assert p.steps == 6 and p.samples == 6 * batch and p.tokens == 6 * batch * seq
    assert p.samples_per_s is not None and p.tokens_per_s is not None and p.tokens_per_s == pytest.approx(
        p.samples_per_s * seq)
    assert p.weights_bytes == sum(t.numel() * t.element_size() for t in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    assert p.optimizer_bytes and p.optimizer_bytes > 0  # AdamW's state, watched from on_train_begin
    assert p.losses_logged == len(logged) == 6 and p.loss == pytest.approx(logged[-1][1])
    assert [e.steps for e in p.epochs] == [2, 2, 2] and [e.samples for e in p.epochs] == [8, 8, 8]
    assert [e.tokens for e in p.epochs] == [8 * seq] * 3
    for i, e in enumerate(p.epochs):  # the mean of what the Trainer logged in that epoch
        mine = [loss for epoch, loss in logged if i < epoch <= i + 1]
        assert e.loss == pytest.approx(sum(mine) / len(mine)) and math.isfinite(e.loss)
        assert 0 <= e.data_wait_s <= e.duration_s


def test_lightning_callback(fresh_probe, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (the test extra)")
    pl = pytest.importorskip("lightning.pytorch", reason="lightning is not installed (pip install -e '.[test]')")
    from torch.utils.data import DataLoader, TensorDataset

    from dltop.probe.lightning import DltopCallback

    losses: list[float] = []

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            loss = self.layer(x).pow(2).mean()
            losses.append(float(loss))
            return loss

        def validation_step(self, batch, batch_idx):
            return None

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    train = DataLoader(TensorDataset(torch.randn(30, 8)), batch_size=8)  # 8, 8, 8 and 6: the last one short
    val = DataLoader(TensorDataset(torch.randn(16, 8)), batch_size=8)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path),
                         callbacks=[DltopCallback(tokens=lambda b: b[0].numel(), interval_s=60)])
    trainer.fit(Tiny(), train, val)
    state = [v for st in trainer.optimizers[0].state.values() for v in st.values() if torch.is_tensor(v)]
    p = parse_probe(probe.report(), "x", os.getuid())
    assert p.steps == 8 and p.samples == 60 and p.tokens == 60 * 8  # Lightning's own batch size: 6 is 6
    assert [e.steps for e in p.epochs] == [4, 4] and [e.samples for e in p.epochs] == [30, 30]
    assert [e.tokens for e in p.epochs] == [240, 240]
    for i, e in enumerate(p.epochs):
        assert e.loss == pytest.approx(sum(losses[4 * i:4 * i + 4]) / 4)
    assert p.losses_logged == 8 and p.loss == pytest.approx(losses[-1])
    assert p.weights_bytes == 9 * 4  # watched from on_fit_start, once
    assert p.optimizer_bytes == sum(v.numel() * v.element_size() for v in state) >= 2 * 9 * 4  # Adam's state
    assert [(v.name, v.steps) for v in p.loaders] == [("val", 4)]  # 2 batches after each epoch, apart


ZERO_CODE_LIGHTNING = """
import os, torch, lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset
class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        return self.layer(batch[0]).pow(2).mean()
    def validation_step(self, batch, i):
        return None
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
train = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4, num_workers=1, persistent_workers=True)
val = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), train, val)  # its sanity check iterates the val loader first
print(os.getpid(), flush=True)
"""

ZERO_CODE_HF = """
import os, torch, transformers
config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=8)
model = transformers.GPT2LMHeadModel(config)
ids = torch.randint(0, 64, (8, 8))
data = [{"input_ids": ids[i], "labels": ids[i]} for i in range(8)]
args = transformers.TrainingArguments(output_dir=os.environ["OUT"], num_train_epochs=2, per_device_train_batch_size=4,
    logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True)
transformers.Trainer(model=model, args=args, train_dataset=data).train()
print(os.getpid(), flush=True)
"""


def test_zero_code_mode_takes_the_frameworks_own_epochs(tmp_path: Path) -> None:
    """DLTOP_PROBE=1 and a script that knows nothing of dltop: a Lightning fit (its sanity check iterates the
    val loader first, which zero-code mode's DataLoader hook took as the loader to time: four 'epochs' of 2 val
    steps) and a Hugging Face Trainer each get the probe's callback, so the epochs and samples are the
    framework's own and Lightning's validation is timed apart (issue 34, item 3)."""
    pytest.importorskip("torch", reason="torch is not installed (the test extra)")
    pytest.importorskip("lightning.pytorch", reason="lightning is not installed (pip install -e '.[test]')")
    pytest.importorskip("transformers", reason="transformers is not installed (the test extra)")
    import json
    import subprocess
    import sys

    from tests.probe_helpers import REPO, probe_env

    runs = {}
    for name, code in (("lightning", ZERO_CODE_LIGHTNING), ("hf", ZERO_CODE_HF)):
        (tmp_path / name).mkdir()
        env = probe_env(tmp_path / name, DLTOP_PROBE="1", PYTHONPATH=str(REPO), OUT=str(tmp_path / "out"))
        runs[name] = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # side by side
    docs = {}
    for name, p in runs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        docs[name] = json.loads((tmp_path / name / "dltop" / f"{int(out.split()[-1])}.json").read_text())
    pl, hf = docs["lightning"], docs["hf"]
    assert [(e["steps"], e["samples"]) for e in pl["epochs"]] == [(6, 24)] * 3
    assert pl["loaders"]["val"]["steps"] == 2 + 3 * 2  # the sanity check's and each epoch's, apart
    assert [(e["steps"], e["samples"]) for e in hf["epochs"]] == [(2, 8)] * 2
    assert pl["exit"]["how"] == hf["exit"]["how"] == "exit"
