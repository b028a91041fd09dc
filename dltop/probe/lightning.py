"""The probe for Lightning: `Trainer(callbacks=[DltopCallback()])` does the probe's calls for its loop.

Imports Lightning (`lightning`, else `pytorch_lightning`) when this module is imported, never from
`import dltop.probe`. What it times and counts is described in docs/probe.md ("Lightning and Hugging Face").
"""

from __future__ import annotations

import time
from typing import Any

import dltop.probe as probe
from dltop.probe import Count

try:
    from lightning.pytorch import Callback
    from lightning.pytorch.utilities import data as _data
except ImportError:  # the older package name
    from pytorch_lightning import Callback  # type: ignore[no-redef,assignment]
    from pytorch_lightning.utilities import data as _data  # type: ignore[no-redef]

__all__ = ["DltopCallback"]


def _batch_samples(batch: Any) -> int | None:
    """The samples in a batch as Lightning counts them for its own logging (the first dimension of its first
    tensor), or None where it cannot tell."""
    try:
        return int(_data.extract_batch_size(batch))
    except Exception:
        return None


def _step_loss(outputs: Any) -> Any:
    """The loss `training_step` returned: the tensor itself, or a mapping's "loss"."""
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs if hasattr(outputs, "detach") else None


class DltopCallback(Callback):
    """Publish the probe for a Lightning run: the model and its optimizers watched, each training batch's wait
    (from the end of the last batch to the start of this one) and step timed, samples and tokens counted, the
    loss logged, an epoch closed with each training epoch, validation batches timed apart as loader "val".

    `batch_size` and `tokens`: as `probe.track` takes them (a number, or a function of the batch); by default
    the samples are what Lightning's own `extract_batch_size` finds in the batch, and tokens are not counted.
    `interval_s`: how often the probe publishes."""

    def __init__(self, batch_size: Count | None = None, tokens: Count | None = None,
                 interval_s: float = 1.0) -> None:
        super().__init__()
        self.batch_size, self.tokens, self.interval_s = batch_size, tokens, interval_s
        self._end_ns = 0  # perf_counter_ns when the last training batch ended (its wait for the next starts)
        self._val_end_ns = 0

    def _count(self, how: Count | None, batch: Any, default: int | None) -> int | None:
        if how is None:
            return default
        try:
            return probe.how_many(how, batch)
        except Exception as e:  # the user's function: it must never take the run down
            probe.warn_once(f"lightning-count-{id(how)}", f"DltopCallback: counting failed ({e}): not counted")
            return None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        probe.start(interval_s=self.interval_s)
        probe.watch_once(pl_module, getattr(trainer, "optimizers", None) or [])

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # the optimizers exist from here (configure_optimizers ran during setup)
        probe.watch_once(pl_module, getattr(trainer, "optimizers", None) or [])

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._end_ns = time.perf_counter_ns()  # the first batch's wait starts with the epoch
        probe.main_data().last_t = 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter_ns()
        samples = self._count(self.batch_size, batch, None if self.batch_size is not None else _batch_samples(batch))
        tokens = self._count(self.tokens, batch, None)
        probe.arrived(probe.main_data(), self._end_ns or now, now, batch, samples, tokens)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        probe.count_gradients()  # after backward: the gradients are there, nothing writes them

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = _step_loss(outputs)
        if loss is not None:
            probe.log(loss=loss)
        self._end_ns = time.perf_counter_ns()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        probe.mark_epoch()

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._val_end_ns = time.perf_counter_ns()
        d = probe.loader_data("val")
        if d is not None:
            d.last_t = 0

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        d = probe.loader_data("val")
        if d is not None:
            now = time.perf_counter_ns()
            probe.arrived(d, self._val_end_ns or now, now, None)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._val_end_ns = time.perf_counter_ns()

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # a validation inside the training epoch is neither the next batch's data wait nor part of its step
        self._end_ns = time.perf_counter_ns()
        probe.main_data().last_t = 0

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        probe.mark_epoch()  # max_steps ends a run inside an epoch: close it (None when none is open)
        probe.publish()
