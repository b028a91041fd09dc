"""Zero-code mode's hooks, installed right after torch's import (dltop.autoprobe): what the probe learns unasked.

Step time and data wait from the DataLoader's iterators (the first dataset iterated is the one timed: a
validation loader later is not mixed in), the weights of modules that reach `.to(...)` or `torch.compile`, the
optimizers that step (their state, and the count of steps). Publishing starts at the first of these, so a process
that imports torch and never trains (torchrun's agent, a DataLoader worker) publishes nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import time
import weakref
from typing import Any

from dltop import probe

_installed = False
_watched: weakref.WeakSet[Any] = weakref.WeakSet()  # modules and optimizers handed to the probe
_timed: list[weakref.ref[Any]] = []  # the dataset whose loader is timed (the first one iterated)
_sampler: list[weakref.ref[Any]] = []  # its sampler: where the script calls set_epoch on it, those are the epochs
_told: weakref.WeakSet[Any] = weakref.WeakSet()  # samplers the script called set_epoch on
_batch: list[int] = []  # the timed loader's batch size, where it has one


def _begin() -> None:
    """Publish from now on (start() is idempotent and refuses in a DataLoader worker)."""
    if probe.state.thread is None and not probe.in_dataloader_worker():
        probe.start()


def _watch(obj: Any, kind: str) -> None:
    if obj in _watched:
        return
    _watched.add(obj)
    (probe.watch_model if kind == "model" else probe.watch_optimizer)(obj)


def _is_timed(it: Any) -> bool:
    """Whether the iterator `it` reads the dataset being timed (the first one seen becomes it)."""
    dataset = getattr(it, "_dataset", None)
    if not _timed:
        try:
            _timed.append(weakref.ref(dataset))
        except TypeError:
            return False
        d = probe.state.data
        d.seen = True
        workers = getattr(it, "_num_workers", None)
        d.workers = workers if isinstance(workers, int) else None
        pin = getattr(it, "_pin_memory", None)
        d.pin_memory = pin if isinstance(pin, bool) else None
        root = getattr(dataset, "root", None)
        if isinstance(root, str):
            d.data_dir = root[:probe.MAX_CMD]
        index = getattr(it, "_index_sampler", None)  # the batch sampler (holding the sampler) or the sampler
        with contextlib.suppress(TypeError):
            _sampler.append(weakref.ref(getattr(index, "sampler", index)))
        size = getattr(index, "batch_size", None) if getattr(it, "_auto_collation", False) else None
        if type(size) is int and size > 0:  # samples/s as track() counts a DataLoader's (a short last batch full)
            _batch.append(size)
            d.samples_total = d.samples_total or 0
    return _timed[0]() is dataset


def _told_epochs() -> bool:
    """The script tells the timed loader's sampler its epochs (`sampler.set_epoch`): they are the epochs, not
    the passes over the data (a loop of a fixed number of steps an epoch over a loader that goes on)."""
    return bool(_sampler) and _sampler[0]() in _told


def _new_pass(it: Any) -> bool:
    """The item just yielded is the first of a pass over the sampler: a new iterator, or the same one reset
    (persistent_workers=True keeps its iterator and resets it for each pass)."""
    n = getattr(it, "_num_yielded", None)
    if isinstance(n, int) and not isinstance(n, bool):
        return n == 1
    if getattr(it, "_dltop_seen", False) is False:  # a torch without the count: each iterator is a pass
        it._dltop_seen = True
        return True
    return False


def _close_epoch() -> None:
    d = probe.state.data
    if d.epoch_open and d.n > d.epoch_n0:
        probe.mark_epoch()


def _pass_done(it: Any) -> None:
    """The timed loader's iterator ran out: its pass over the sampler is done, and so is the epoch (unless the
    script tells the sampler its epochs)."""
    if _timed and _timed[0]() is getattr(it, "_dataset", None) and not _told_epochs():
        _close_epoch()


def _patch_dataloader() -> None:
    module = importlib.import_module("torch.utils.data.dataloader")
    base = module._BaseDataLoaderIter
    next_item = base.__next__
    clock = time.perf_counter_ns

    @functools.wraps(next_item)
    def __next__(self: Any) -> Any:
        d = probe.state.data
        if d.explicit:  # the script times its loop with probe.track()
            return next_item(self)
        t0 = clock()
        try:
            item = next_item(self)
        except StopIteration:
            _pass_done(self)
            raise
        t1 = clock()
        if _is_timed(self):
            if _new_pass(self):  # a new pass over the data: a new epoch, unless set_epoch says where they are
                if not _told_epochs():
                    _close_epoch()
                d.last_t = 0
                _begin()
            probe.arrived(d, t0, t1, item, _batch[0] if _batch else None)
        return item

    base.__next__ = __next__


def _patch_set_epoch() -> None:
    """`DistributedSampler.set_epoch` (and its subclasses'): the script says an epoch begins. Called on the timed
    loader's sampler, it closes the epoch open."""
    cls = importlib.import_module("torch.utils.data.distributed").DistributedSampler
    set_epoch = cls.set_epoch

    @functools.wraps(set_epoch)
    def hooked(self: Any, epoch: int) -> None:
        set_epoch(self, epoch)
        with contextlib.suppress(TypeError):
            _told.add(self)
        if not probe.state.data.explicit and _sampler and _sampler[0]() is self:
            _close_epoch()

    cls.set_epoch = hooked


def _patch_module_to(nn: Any) -> None:
    to = nn.Module.to

    @functools.wraps(to)
    def module_to(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = to(self, *args, **kwargs)
        _watch(self, "model")
        _begin()
        return out

    nn.Module.to = module_to


def _patch_compile(torch: Any) -> None:
    compile_ = torch.compile

    @functools.wraps(compile_)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(model, torch.nn.Module):
            _watch(model, "model")
            _begin()
        return compile_(model, *args, **kwargs)

    torch.compile = compile


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _watch(optimizer, "optimizer")
    probe.state.optimizer_steps = (probe.state.optimizer_steps or 0) + 1
    _begin()


def framework(name: str, module: Any) -> None:
    """A framework's Trainer module (Lightning's, the Hugging Face Trainer's) has just run: each Trainer made
    from now on gets the probe's callback (dltop.probe.lightning, .hf), so the epochs are the framework's own and
    its validation is timed apart (Lightning's sanity check would otherwise be the first loader iterated, and so
    the one timed). A Trainer given the callback already keeps its own; the DataLoader hook stands aside once a
    callback times the loop."""
    trainer = getattr(module, "Trainer", None)
    if isinstance(trainer, type) and not getattr(trainer, "_dltop_hooked", False):
        _hook_init(trainer, name)


def _hook_init(cls: Any, name: str) -> None:
    init = cls.__init__
    hf = name.startswith("transformers")

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            _give_callback(self, hf)
        except Exception as e:  # the probe must never take the job down
            probe.warn_once("framework", f"the {name} Trainer did not take the probe's callback: {e!r}")

    cls.__init__ = __init__
    cls._dltop_hooked = True


def _give_callback(trainer: Any, hf: bool) -> None:
    """Add the probe's callback to `trainer` (made once its framework is fully imported), unless it has one."""
    probe.main_data()  # the callback times the loop from here: the DataLoader hook stands aside (a sanity check)
    if hf:
        from dltop.probe.hf import DltopTrainerCallback

        if not any(isinstance(c, DltopTrainerCallback) for c in trainer.callback_handler.callbacks):
            trainer.add_callback(DltopTrainerCallback())
        return
    from dltop.probe.lightning import DltopCallback

    if not any(isinstance(c, DltopCallback) for c in trainer.callbacks):
        trainer.callbacks.append(DltopCallback())


def _close_pass() -> None:
    """At exit, the pass over the data that is open is the last epoch (the script never says where one ends)."""
    d = probe.state.data
    if not d.explicit and d.epoch_open and d.n > d.epoch_n0:
        probe.mark_epoch()


def install(torch: Any) -> None:
    """Put the hooks in (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(_close_pass)  # runs before the probe's own exit record (atexit is last in, first out)
    _patch_dataloader()
    _patch_set_epoch()
    _patch_module_to(torch.nn)
    _patch_compile(torch)
    importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(_after_step)
