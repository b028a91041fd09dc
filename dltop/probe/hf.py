"""The probe for the Hugging Face Trainer: `Trainer(..., callbacks=[DltopTrainerCallback()])` does the probe's
calls for its loop.

Imports transformers when this module is imported, never from `import dltop.probe`. What it times and counts is
described in docs/probe.md ("Lightning and Hugging Face").
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

import dltop.probe as probe

__all__ = ["DltopTrainerCallback"]


class DltopTrainerCallback(TrainerCallback):
    """Publish the probe for a Trainer run: the model and optimizer watched, each optimizer step timed (the
    wait: from the end of the last step, less the Trainer's own logging, evaluation and saving, to the start of
    this one, which is when the Trainer has fetched its batches), its samples counted
    (`per_device_train_batch_size` × the batches it accumulated) and its tokens where the Trainer counts them
    (`include_num_input_tokens_seen`: its count is of all processes, so each rank takes its share), the loss
    the Trainer logs, and an epoch closed with each of the Trainer's epochs.

    `interval_s`: how often the probe publishes."""

    def __init__(self, interval_s: float = 1.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._end_ns = 0  # perf_counter_ns when the last step ended, or the Trainer's own work after it did
        self._tokens_seen: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        probe.start(interval_s=self.interval_s)
        optimizer = kwargs.get("optimizer")
        probe.watch_once(kwargs.get("model"), [optimizer] if optimizer is not None else [])
        self._tokens_seen = getattr(state, "num_input_tokens_seen", None)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_ns = time.perf_counter_ns()
        probe.main_data().last_t = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter_ns()
        accumulated = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
        per_device = getattr(args, "per_device_train_batch_size", None)
        samples = per_device * accumulated if isinstance(per_device, int) and per_device > 0 else None
        probe.arrived(probe.main_data(), self._end_ns or now, now, None, samples, None)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        probe.count_gradients()  # after the step, before zero_grad: the gradients are there, nothing writes them

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        seen = getattr(state, "num_input_tokens_seen", None)
        counting = getattr(args, "include_num_input_tokens_seen", "no") not in ("no", False, None)
        if counting and isinstance(seen, int) and self._tokens_seen is not None and seen >= self._tokens_seen:
            world = max(1, int(getattr(args, "world_size", 1) or 1))
            d = probe.main_data()
            probe.counted(d, (d.n - 1) & (probe.RING - 1), None, (seen - self._tokens_seen) // world)
        self._tokens_seen = seen if isinstance(seen, int) else None
        self._end_ns = time.perf_counter_ns()

    def _own_work_done(self) -> None:
        # logging, evaluation and checkpoints run between two steps: neither a data wait nor the next step's
        self._end_ns = time.perf_counter_ns()
        probe.main_data().last_t = 0

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        loss = (logs or {}).get("loss")
        if isinstance(loss, int | float) and not isinstance(loss, bool):
            probe.log(loss=loss)
        self._end_ns = time.perf_counter_ns()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._own_work_done()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._own_work_done()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        probe.mark_epoch()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        probe.mark_epoch()  # max_steps ends a run inside an epoch: close it (None when none is open)
        probe.publish()
