"""The in-process probe: a training or serving script tells dltop what its bytes are and how long it waits.

Standard library only; torch is used only if the process already imported it, and CUDA is never initialised.
The file it publishes is described in docs/probe.md.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import itertools
import json
import math
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from dltop.probe.files import (
    FORMAT,
    KEEP_EXITED_S,
    MAX_FILE_BYTES,
    MEMFD_NAME,
    open_private_dir,
    probe_dir,
    proc_start_ticks,
    publish_memfd,
    signal_file,
    write_atomic,
)

__all__ = ["count_gradients", "log", "mark_epoch", "publish", "report", "start", "stop", "track", "watch_kv",
           "watch_model", "watch_optimizer"]

T = TypeVar("T")
# How many samples or tokens an item holds: a number for every item, or a function of the item
Count = int | Callable[[Any], Any]
RING = 256  # steps kept for the recent wait fraction and step time (a power of two: an index is n & (RING - 1))
WINDOW_S = 10.0  # the recent numbers cover the steps that ended this long ago or since (issue 18, item 7)
MAX_ERROR = 200  # characters of an uncaught exception kept for the exit record
MAX_SHAPES = 64
MAX_EPOCHS = 16
MAX_CMD = 256
MAIN_LOADER = "train"  # the name of the loader track() times by default: its steps are the epochs' (docs/probe.md)
MAX_LOADERS = 4  # loaders timed apart beside the main one (a val loader, a test loader): more are not timed
MAX_LOADER_NAME = 32
# HIP_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES: ROCm's remapping of cuda:N (torch.cuda is HIP on ROCm torch)
ALLOC_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
             "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
MEMORY_STATS = ("allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current",
                "inactive_split_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.peak",
                "num_alloc_retries", "num_ooms")
TENSOR_DUTY = 0.0005  # the publisher's tensor counts take at most this share of one core
GRADS_EVERY_NS = 1_000_000_000  # the training thread counts the gradients at most this often
GPU_UTIL_SOURCE = ("not measured by the probe (it reads no NVML and never initialises CUDA): dltop joins NVML's "
                   "utilisation over started_at..ended_at")


class _Data:
    """What track() saw: a ring of the last RING (wait, step, end) triples in ns, and the open epoch's totals."""

    def __init__(self) -> None:
        self.waits = [0] * RING
        self.steps_ns = [0] * RING
        self.ends_ns = [0] * RING  # perf_counter_ns when each item arrived: the window and the last step's age
        self.n = 0  # items yielded in all
        self.wait_total = 0  # ns waited for them, in all
        self.last_t = 0  # perf_counter_ns when the last item arrived
        self.shapes: set[Any] = set()
        self.workers: int | None = None
        self.pin_memory: bool | None = None
        self.data_dir: str | None = None
        self.seen = False
        self.explicit = False  # track() is used: zero-code mode's DataLoader hook stands aside
        # Samples and tokens per item, where the script says (track(batch_size=, tokens=) or a framework's
        # callback): the ring beside the times, and the totals (None: not counted)
        self.samples = [0] * RING
        self.tokens = [0] * RING
        self.samples_total: int | None = None
        self.tokens_total: int | None = None
        self.epoch_samples0 = 0
        self.epoch_tokens0 = 0
        # the open epoch
        self.epoch_t0 = 0
        self.epoch_wall0 = 0.0
        self.epoch_cached0: int | None = None
        self.epoch_data0: tuple[dict[str, int], str] | str | None = None  # _data_cached() when it opened
        self.epoch_n0 = 0  # n and wait_total when it opened
        self.epoch_wait0 = 0
        self.epoch_open = False


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.interval_s = 1.0
        self.started_at: float | None = None
        self.models: list[weakref.ref[Any]] = []
        self.optimizers: list[weakref.ref[Any]] = []
        self.kv: list[weakref.ref[Any]] = []
        self.data = _Data()  # the main loader's (MAIN_LOADER, or the first name track() was given)
        self.main_loader: str | None = None
        self.loaders: dict[str, _Data] = {}  # the others by name: a val loop is not mixed into the train steps
        self.epochs: list[dict[str, Any]] = []
        self.dir_fd: int | None = None
        # Why the folder was refused (another user made it first, or a symlink stands there): then the process
        # publishes into a memfd it holds at `memfd` (docs/probe.md), and says so in its report
        self.folder_refused: str | None = None
        self.memfd: int | None = None
        self.warned: set[str] = set()
        # The last count of the watched tensors: the publisher thread recounts only as often as keeps the count
        # under TENSOR_DUTY of a core (a model of thousands of tensors costs milliseconds to walk).
        self.tensors: dict[str, dict[str, Any]] | None = None
        self.identity: tuple[int, int | None, str] | None = None  # pid, its start time, its command
        self.tensors_at = 0.0  # time.time() of the count
        self.tensors_due = 0.0  # time.monotonic() of the next one
        self.error: str | None = None  # the uncaught exception that is ending the process, for the exit record
        self.hooked = False  # sys.excepthook wrapped (once per process)
        self.exit: dict[str, Any] | None = None  # the exit record of the last publication (docs/probe.md)
        self.optimizer_steps: int | None = None  # counted by zero-code mode's optimizer hook (dltop.probe.hooks)
        # The most gradient bytes per device counted while the loop steps: zero_grad(set_to_none=True) frees the
        # gradients every step, so a count between zero_grad and backward read 0 (issue 18, item 11).
        self.grads_held: dict[str, int] = {}
        # Gradient bytes per device as the training thread last counted them (count_gradients), and when it may
        # count again: backward writes `.grad` without the GIL, so the publisher thread never reads it.
        self.grads: dict[Any, int] = {}
        self.grads_due = 0
        # The loss the script hands over (probe.log): the last one as given (a tensor is read by the publisher
        # thread, so the loop never waits for the GPU), how many, when; and the open epoch's sum for its mean.
        self.loss: Any = None
        self.losses = 0
        # The file faulthandler writes the main thread's stack into when SIGTERM ends the process (atexit does not
        # run then, so no exit record): dltop reads it as "killed by SIGTERM in train.py:42" (docs/probe.md)
        self.sigterm_fd: int | None = None
        self.loss_t = 0  # perf_counter_ns of the last
        self.epoch_loss_sum: Any = None
        self.epoch_losses = 0


# The probe's state and the calls below without a leading underscore (arrived, main_data, loader_data,
# watch_once, counted, how_many, warn_once, in_dataloader_worker) are what its own hooks and framework callbacks
# (dltop.probe.hooks, .hf, .lightning) share with track(): not the scripts' API, which is __all__ (docs/probe.md).
state = _State()


def warn_once(key: str, text: str) -> None:
    if key not in state.warned:
        state.warned.add(key)
        sys.stderr.write(f"dltop.probe: {text}\n")


def _torch() -> Any:
    return sys.modules.get("torch")


def in_dataloader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    get = getattr(data, "get_worker_info", None)
    try:
        return get is not None and get() is not None
    except Exception:
        return False


def _ref(obj: Any) -> list[weakref.ref[Any]]:
    try:
        return [weakref.ref(obj)]
    except TypeError:  # a list or tuple: refer to what it holds now
        if isinstance(obj, list | tuple):
            return [r for item in obj for r in _ref(item)]
        raise TypeError(f"dltop.probe: cannot watch a {type(obj).__name__} (no weak reference)") from None


def watch_model(model: Any) -> None:
    """Count the model's parameters and buffers as weights and their gradients apart, per device."""
    state.tensors = None  # counted afresh at the next publication
    state.models.extend(_ref(model))


def watch_optimizer(optimizer: Any) -> None:
    """Count the optimizer's state tensors (Adam's exp_avg, exp_avg_sq, ...) as optimizer state, per device; the
    watched models' gradients are counted after its steps (when they are there, and nothing writes them)."""
    state.tensors = None  # counted afresh at the next publication
    state.optimizers.extend(_ref(optimizer))
    with contextlib.suppress(Exception):  # a wrapper (accelerate's) that never ran Optimizer.__init__ has no hooks
        optimizer.register_step_post_hook(_after_optimizer_step)


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    count_gradients()


def count_gradients(force: bool = False) -> None:
    """Count the watched models' gradients per device, at most once a GRADS_EVERY_NS (`force`: now). Called from
    the training thread between steps (after an optimizer step, between a tracked loader's items): backward
    writes `.grad` from C++ without the GIL, and reading it from another thread meanwhile corrupted the heap."""
    if not force:
        now = time.perf_counter_ns()
        if now < state.grads_due:
            return
        state.grads_due = now + GRADS_EVERY_NS
    sums: dict[Any, int] = {}
    counted: set[int] = set()  # a submodule watched beside its parent counts once
    for model in _live(state.models):
        for p in model.parameters():
            if id(p) not in counted:
                counted.add(id(p))
                if (g := p.grad) is not None:
                    sums[g.device] = sums.get(g.device, 0) + g.numel() * g.element_size()
    state.grads = sums


def watch_kv(obj: Any) -> None:
    """Count a KV cache: a Hugging Face cache object (transformers 4.5x or 5.x), a tensor or a list of tensors."""
    state.tensors = None  # counted afresh at the next publication
    state.kv.extend(_ref(obj))


def input_shape(item: Any) -> Any:
    """What an item's shape is counted as (distinct input shapes: cuDNN autotunes each): the shape of the item, or
    of its first element (`x` of `[x, y]`), or of its first value (`input_ids` of a dict batch); a few attribute
    reads a step. Other items (nested, no tensor first) are described whole, which costs more."""
    shape = getattr(item, "shape", None)
    if shape is not None:
        return shape
    kind = type(item)
    if (kind is list or kind is tuple) and item:
        shape = getattr(item[0], "shape", None)
    elif kind is dict and item:
        shape = getattr(next(iter(item.values())), "shape", None)
    return shape if shape is not None else _shape_of(item)


def _shape_of(item: Any) -> Any:
    shape = getattr(item, "shape", None)
    if shape is not None:
        return tuple(shape)
    if isinstance(item, tuple | list):
        return tuple([_shape_of(x) for x in item[:8]])
    if isinstance(item, dict):
        return tuple([(k, _shape_of(v)) for k, v in list(item.items())[:8]])
    return None


def _meminfo_cached_bytes() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"Cached:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


MAX_SOURCE = 96  # characters of an epoch's data_cached_source: 16 epochs fit the 4 KiB file
MAX_DATA_FILES = 4096  # files of the job's data whose page cache an epoch boundary measures, at most ...
DATA_SCAN_S = 0.25  # ... and the time it may take (the training loop waits for it, once an epoch)


def _cached_bytes(paths: Iterable[str], deadline: float) -> tuple[dict[str, int], int] | str:
    """path -> bytes of it in the page cache (cachestat(2), else mincore(2)), and how many could not be read; or
    why it could not be measured. dltop.kernel (ctypes) is imported here, at the first epoch boundary, not when
    a script imports the probe."""
    from dltop import kernel

    out: dict[str, int] = {}
    failed = 0
    use_cachestat = kernel.have_cachestat()
    for path in paths:
        if time.monotonic() > deadline:
            return f"measuring took over {DATA_SCAN_S:g} s: not measured"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            failed += 1
            continue
        try:
            if use_cachestat:
                out[path] = kernel.cachestat(fd).cache * kernel.PAGE_SIZE
            else:
                out[path] = kernel.mincore_resident_pages(fd, os.fstat(fd).st_size) * kernel.PAGE_SIZE
        except OSError:
            failed += 1
        finally:
            os.close(fd)
    return out, failed


def _files_under(root: str, deadline: float) -> list[str] | str:
    """The regular files under `root` (not following links), or why they are not listed."""
    found: list[str] = []
    stack = [root]
    while stack:
        if time.monotonic() > deadline:
            return f"listing data_dir took over {DATA_SCAN_S:g} s"
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        found.append(entry.path)
                        if len(found) > MAX_DATA_FILES:
                            return f"over {MAX_DATA_FILES} files under data_dir"
        except OSError as e:
            if not found and not stack:
                return f"cannot list data_dir: {e.strerror}"
    return found


def _job_pids() -> list[int]:
    """This process and its children (the DataLoader workers), from /proc/self/task/*/children."""
    pids = [os.getpid()]
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/children", "rb") as f:
                pids += [int(x) for x in f.read().split()]
    return pids


def _read_only(pid: int, fd: str) -> bool:
    """Whether the descriptor was opened read-only (/proc/PID/fdinfo's flags): data is read; a log the job
    appends to or a checkpoint it writes is not its data, and its growth would show as the data coming in."""
    with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
        for line in f.read(4096).splitlines():
            if line.startswith(b"flags:"):
                return int(line.split()[1], 8) & os.O_ACCMODE == os.O_RDONLY
    return False


def _open_files() -> set[str]:
    """The regular files the process and its workers have open read-only (not /proc, /sys, /dev), at most
    MAX_DATA_FILES."""
    out: set[str] = set()
    for pid in _job_pids():
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("/") and not target.startswith(("/proc/", "/sys/", "/dev/")) \
                            and os.path.isfile(target) and _read_only(pid, fd):
                        out.add(target)
                        if len(out) >= MAX_DATA_FILES:
                            return out
    return out


def _data_cached(data_dir: str | None) -> tuple[dict[str, int], str] | str:
    """The page cache held by the job's data, per file, and what was measured; or why it cannot be known. The
    files under `data_dir` where the job names it (bounded: MAX_DATA_FILES, DATA_SCAN_S), else the files the
    process and its DataLoader workers have open."""
    deadline = time.monotonic() + DATA_SCAN_S
    if data_dir:
        files = _files_under(data_dir, deadline)
        if isinstance(files, str):
            return f"{files}: not measured"
        where = "files under data_dir"
    else:
        files = sorted(_open_files())
        where = "files open in the process and its workers"
    got = _cached_bytes(files, deadline)
    if isinstance(got, str):
        return got
    cached, failed = got
    return cached, where + (f", {failed} unreadable" if failed else "")


def _data_delta(start: tuple[dict[str, int], str] | str | None,
                end: tuple[dict[str, int], str] | str) -> tuple[int | None, str]:
    """The change over the epoch of the page cache held by the files measured at both ends, and how it was
    measured (or why it is not known)."""
    if start is None:
        return None, "not measured at the start of the epoch"
    if isinstance(start, str) or isinstance(end, str):
        return None, start if isinstance(start, str) else str(end)
    both = start[0].keys() & end[0].keys()
    if not both:
        return None, "no data file open at both ends of the epoch: name it, track(loader, data_dir=...)"
    return sum(end[0][f] - start[0][f] for f in both), f"cachestat: {len(both)} {end[1]}"


def _dataset_root(iterable: Any) -> str | None:
    """The folder a DataLoader's dataset reads, where it says (torchvision's datasets keep it in `root`)."""
    root = getattr(getattr(iterable, "dataset", None), "root", None)
    return root if isinstance(root, str) else None


def _other_loader(iterable: Iterable[T], name: str) -> Iterator[T]:
    """Time a loader that is not the main one (a val loop) apart, under its name: its steps and waits only (no
    epochs: mark_epoch closes the main loader's); each pass starts without a step before its first item."""
    d = loader_data(name)
    if d is None:
        warn_once("loaders", f"over {MAX_LOADERS} loaders beside the main one: {name!r} is not timed")
        yield from iterable
        return
    d.last_t = 0
    clock, mask = time.perf_counter_ns, RING - 1
    it = iter(iterable)
    while True:
        t0 = clock()
        try:
            item = next(it)
        except StopIteration:
            return
        t1 = clock()
        n, last = d.n, d.last_t
        d.waits[n & mask] = wait = t1 - t0
        d.steps_ns[n & mask] = t1 - last if last else 0
        d.ends_ns[n & mask] = t1
        d.last_t, d.n, d.wait_total = t1, n + 1, d.wait_total + wait
        yield item


def how_many(how: Count, item: Any) -> int:
    """The samples or tokens in `item`: `how` itself, or what it returns for the item (an int, or anything int()
    takes: a tensor's count waits for its device)."""
    k = how(item) if callable(how) else how
    if isinstance(k, bool) or k is None:
        raise TypeError(f"{k!r} is not a count")
    k = k if type(k) is int else int(k)
    if k < 0:
        raise ValueError(f"{k} is negative")
    return k


def counted(d: _Data, i: int, samples: int | None, tokens: int | None) -> None:
    """Store an item's samples and tokens (None: not counted) in ring slot `i` and add them to the totals."""
    if samples is not None:
        d.samples[i] = samples
        d.samples_total = (d.samples_total or 0) + samples
    if tokens is not None:
        d.tokens[i] = tokens
        d.tokens_total = (d.tokens_total or 0) + tokens


def _count(d: _Data, i: int, item: Any, how: list[Count | None]) -> bool:
    """Count `item`'s samples and tokens as `how` (batch_size, tokens) says into ring slot `i`. A count that
    fails (the function raised, or gave no count) is said once on stderr and stops, its totals "not counted";
    returns whether any count goes on."""
    got: list[int | None] = [None, None]
    for k, kind in enumerate(("samples", "tokens")):
        h = how[k]
        if h is None:
            continue
        try:
            got[k] = how_many(h, item)
        except Exception as e:  # the user's function: it must never take the loop down
            warn_once(f"count-{kind}", f"counting {kind} failed ({type(e).__name__}: {e}): not counted")
            how[k] = None
            if k == 0:
                d.samples_total = None
            else:
                d.tokens_total = None
    counted(d, i, got[0], got[1])
    return how[0] is not None or how[1] is not None


def track(iterable: Iterable[T], data_dir: str | None = None, name: str | None = None,
          batch_size: Count | None = None, tokens: Count | None = None) -> Iterator[T]:
    """Yield the items of `iterable`, timing how long each took to arrive (the data wait) and the step time.
    `data_dir`: the folder the data is read from (default: the DataLoader's `dataset.root` when it has one), so
    that dltop can name the dataset to warm. `name`: a loader to time apart from the main one (default
    "train", the first name given), e.g. `track(val_loader, name="val")`: its steps are not the epochs'.
    `batch_size` and `tokens`: the samples and tokens in each item, a number or a function of the item
    (default batch_size: the DataLoader's `batch_size`), for samples/s and tokens/s (the main loader's)."""
    wanted = (MAIN_LOADER if name is None else str(name))[:MAX_LOADER_NAME]
    if state.main_loader is None:
        state.main_loader = wanted
    if wanted != state.main_loader:
        yield from _other_loader(iterable, wanted)
        return
    d = state.data
    _describe_loader(d, iterable, data_dir)
    how = _counts_of(d, iterable, batch_size, tokens)
    # A batch size that is one number and no tokens (a DataLoader's own): counted inline, no call a step
    fixed = how[0] if type(how[0]) is int and how[0] >= 0 and how[1] is None else None
    counting = fixed is None and (how[0] is not None or how[1] is not None)
    # Measured before iter(): a DataLoader's workers start reading ahead as soon as it is called.
    data0 = _data_cached(d.data_dir) if not d.epoch_open else None
    it = iter(iterable)
    clock = time.perf_counter_ns
    waits, steps_ns, ends_ns, samples, shapes, mask = d.waits, d.steps_ns, d.ends_ns, d.samples, d.shapes, RING - 1
    # Per item: two clock reads and a few stores (benchmarks/probe.py). The publisher thread reads the ring and
    # the totals as they are.
    t0 = clock()
    if not d.epoch_open:
        _open_epoch(d, t0, data0)
        t0 = clock()  # the measurement is not the data wait
    grads_due = t0  # the gradients counted between steps, here in the training thread, about once a second
    for item in it:
        t1 = clock()
        n, last = d.n, d.last_t
        i = n & mask
        waits[i] = wait = t1 - t0
        steps_ns[i] = t1 - last if last else 0  # the first item of an epoch has no step before it
        ends_ns[i] = t1
        if fixed is not None:
            samples[i] = fixed
            d.samples_total = (d.samples_total or 0) + fixed
        elif counting:
            counting = _count(d, i, item, how)
        d.last_t, d.n, d.wait_total = t1, n + 1, d.wait_total + wait
        if len(shapes) < MAX_SHAPES:
            shapes.add(input_shape(item))
        yield item
        t0 = clock()
        if t0 >= grads_due:
            grads_due = t0 + GRADS_EVERY_NS
            count_gradients()
            t0 = clock()  # the count is not the next item's data wait
        if not d.epoch_open:  # mark_epoch() in the loop: the next item opens the next epoch
            _open_epoch(d, t0)
            t0 = clock()


def _describe_loader(d: _Data, iterable: Any, data_dir: str | None) -> None:
    """What the main loader says of itself: its workers, pinned memory and folder."""
    d.seen = d.explicit = True
    workers = getattr(iterable, "num_workers", None)
    if isinstance(workers, int):
        d.workers = workers
        pin = getattr(iterable, "pin_memory", None)
        d.pin_memory = pin if isinstance(pin, bool) else None
    where = data_dir or _dataset_root(iterable)
    if where:
        d.data_dir = os.path.abspath(where)[:MAX_CMD]


def _counts_of(d: _Data, iterable: Any, batch_size: Count | None, tokens: Count | None) -> list[Count | None]:
    """How the main loader's items are counted, [samples, tokens] (batch_size: a DataLoader's own), totals started."""
    if batch_size is None:
        size = getattr(iterable, "batch_size", None)  # a DataLoader's (None with a batch_sampler)
        batch_size = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
    if batch_size is not None and d.samples_total is None:
        d.samples_total, d.epoch_samples0 = 0, 0
    if tokens is not None and d.tokens_total is None:
        d.tokens_total, d.epoch_tokens0 = 0, 0
    return [batch_size, tokens]


def _open_epoch(d: _Data, t0: int, data0: tuple[dict[str, int], str] | str | None = None) -> None:
    """Open an epoch: track() before its first item (`data0`: the page cache measured before iter()), zero-code
    mode's DataLoader hook once its first item has arrived (the workers' read-ahead is in the measurement)."""
    d.epoch_open, d.epoch_t0, d.epoch_wall0 = True, t0, time.time()
    d.epoch_cached0, d.epoch_n0, d.epoch_wait0 = _meminfo_cached_bytes(), d.n, d.wait_total
    d.epoch_samples0, d.epoch_tokens0 = d.samples_total or 0, d.tokens_total or 0
    d.epoch_data0 = data0 if data0 is not None else _data_cached(d.data_dir)
    d.last_t = 0


def arrived(d: _Data, t0: int, t1: int, item: Any, samples: int | None = None, tokens: int | None = None) -> None:
    """One item that took t0..t1 (perf_counter_ns) to arrive, as track() counts it, with its samples and tokens
    where known: zero-code mode's DataLoader hook (dltop.probe.hooks) and the frameworks' callbacks call this."""
    if not d.epoch_open:
        _open_epoch(d, t0)
    n, last, i = d.n, d.last_t, d.n & (RING - 1)
    d.waits[i] = wait = t1 - t0
    d.steps_ns[i] = t1 - last if last else 0
    d.ends_ns[i] = t1
    counted(d, i, samples, tokens)
    d.last_t, d.n, d.wait_total = t1, n + 1, d.wait_total + wait
    if item is not None and len(d.shapes) < MAX_SHAPES:
        d.shapes.add(input_shape(item))


def main_data() -> _Data:
    """The main loader's data, for a framework's callback that times the loop itself (dltop.probe.lightning,
    dltop.probe.hf): zero-code mode's DataLoader hook stands aside, as it does for track()."""
    if state.main_loader is None:
        state.main_loader = MAIN_LOADER
    d = state.data
    d.seen = d.explicit = True
    return d


def loader_data(name: str) -> _Data | None:
    """A loader timed apart from the main one, by name, for a framework's callback (None past MAX_LOADERS)."""
    d = state.loaders.get(name)
    if d is None:
        if len(state.loaders) >= MAX_LOADERS:
            return None
        d = state.loaders[name] = _Data()
        d.epoch_open = True  # its items never open an epoch: the epochs are the main loader's
    d.seen = d.explicit = True
    return d


def watch_once(model: Any, optimizers: Iterable[Any]) -> None:
    """Watch the model and the optimizers not yet watched (a callback sees them at more than one hook)."""
    if model is not None and not any(m is model for m in _live(state.models)):
        watch_model(model)
    for opt in optimizers:
        if not any(o is opt for o in _live(state.optimizers)):
            watch_optimizer(opt)


def mark_epoch() -> dict[str, Any] | None:
    """Close the open epoch (opened by the first item track() yields after the last mark_epoch) and return its
    record; None when no epoch was open."""
    d = state.data
    if not d.epoch_open:
        return None
    t = time.perf_counter_ns()
    cached = _meminfo_cached_bytes()
    data_delta, data_source = _data_delta(d.epoch_data0, _data_cached(d.data_dir))
    epoch = {
        "index": len(state.epochs) and state.epochs[-1]["index"] + 1,
        "started_at": round(d.epoch_wall0, 3),
        "ended_at": round(time.time(), 3),
        "duration_s": round((t - d.epoch_t0) / 1e9, 6),
        "data_wait_s": round((d.wait_total - d.epoch_wait0) / 1e9, 6),
        "steps": d.n - d.epoch_n0,
        # the job's own data (docs/probe.md, "Epochs"); the machine's Cached under a name that says so
        "data_cached_delta_bytes": data_delta,
        "data_cached_source": data_source[:MAX_SOURCE],
        "machine_cached_delta_bytes": None if cached is None or d.epoch_cached0 is None else cached - d.epoch_cached0,
        "gpu_util": None,  # see gpu_util_source
        **_epoch_counts(d),
    }
    d.epoch_open = False
    with state.lock:
        state.epochs = [*state.epochs, epoch][-MAX_EPOCHS:]
    return epoch


def _number(value: Any) -> tuple[float | None, str | None]:
    """A loss as JSON can hold it: (the number, None), (None, "nan" / "inf" / "-inf") where it is not finite (a
    diverged run: what the user most needs to see), or (None, None) where it is not one number. A tensor is read
    here (it waits for its device: the publisher thread or an epoch's end, never each step)."""
    try:
        v = float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None, None
    if math.isfinite(v):
        return v, None
    return None, "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"


def _epoch_counts(d: _Data) -> dict[str, Any]:
    """The epoch's samples, tokens and mean loss (those the script hands over), for its record; the loss sum
    starts again."""
    out: dict[str, Any] = {}
    if d.samples_total is not None:
        out["samples"] = d.samples_total - d.epoch_samples0
    if d.tokens_total is not None:
        out["tokens"] = d.tokens_total - d.epoch_tokens0
    s = state
    if s.epoch_losses:
        mean, nonfinite = _number(s.epoch_loss_sum)
        if mean is not None:
            mean /= s.epoch_losses
        out["loss"] = mean
        if nonfinite:
            out["loss_nonfinite"] = nonfinite
    s.epoch_loss_sum, s.epoch_losses = None, 0
    return out


def log(loss: Any = None) -> None:
    """Hand the probe the step's loss (a number, or a one-element tensor: held and read by the publisher thread,
    so the loop never waits for the device) for the Training tab's loss line and the epochs' mean loss."""
    if loss is None:
        return
    if hasattr(loss, "detach"):
        loss = loss.detach()
    elif isinstance(loss, bool) or not isinstance(loss, int | float):
        warn_once("log", f"log(loss=) takes a number or a tensor, not a {type(loss).__name__}: not logged")
        return
    s = state
    try:  # a sum on the loss's device: the mean is read once an epoch
        s.epoch_loss_sum = loss if s.epoch_loss_sum is None else s.epoch_loss_sum + loss
        s.epoch_losses += 1
    except Exception:  # a loss on another device than the last, or of another shape: the mean starts again
        s.epoch_loss_sum, s.epoch_losses = loss, 1
    s.loss, s.losses, s.loss_t = loss, s.losses + 1, time.perf_counter_ns()


def _loss_report() -> dict[str, Any] | None:
    """The last loss logged (its value, or why it has none), how many were, and its age."""
    s = state
    if not s.losses:
        return None
    value, nonfinite = _number(s.loss)
    return {"value": value, **({"nonfinite": nonfinite} if nonfinite else {}), "logged": s.losses,
            "age_s": round((time.perf_counter_ns() - s.loss_t) / 1e9, 3)}


def _device_entry(devices: dict[str, dict[str, Any]], device: Any) -> dict[str, Any]:
    name = str(device)
    if name == "cuda":
        name = "cuda:0"
    entry = devices.get(name)
    if entry is None:
        entry = devices[name] = {"weights_bytes": 0, "gradients_bytes": 0, "optimizer_bytes": 0, "kv_bytes": 0}
    return entry


def _nbytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "numel") and hasattr(x, "element_size") and hasattr(x, "device")


def _kv_tensors(obj: Any, depth: int = 0) -> Iterator[Any]:
    """The tensors of a KV cache, duck-typed: transformers 5.x (`layers[i].keys/values`), 4.5x
    (`key_cache`/`value_cache` lists), a tensor, or nested lists and tuples of them."""
    if depth > 4 or obj is None:
        return
    if _is_tensor(obj):
        yield obj
        return
    for child in _kv_children(obj):
        yield from _kv_tensors(child, depth + 1)


def _kv_children(obj: Any) -> Sequence[Any]:
    """What a KV cache holds: its layers' keys and values (5.x), key_cache and value_cache (4.5x), or its items."""
    layers = getattr(obj, "layers", None)
    if isinstance(layers, list | tuple):
        return [getattr(layer, attr, None) for layer in layers for attr in ("keys", "values")]
    if hasattr(obj, "key_cache") or hasattr(obj, "value_cache"):
        return [getattr(obj, "key_cache", None), getattr(obj, "value_cache", None)]
    return obj if isinstance(obj, list | tuple) else ()


def _live(refs: list[weakref.ref[Any]]) -> list[Any]:
    return [o for o in (r() for r in refs) if o is not None]


def _tensor_bytes(devices: dict[str, dict[str, Any]], tensor_type: Any) -> None:
    # Summed per (device, kind) with the device object as the key: naming a device costs more than counting a
    # tensor, and a model has hundreds of them (the publisher's whole budget is a millisecond or so).
    sums: dict[tuple[Any, str], int] = {}
    _model_bytes(sums)
    _optimizer_bytes(sums, tensor_type)
    seen: set[int] = set()
    for obj in _live(state.kv):
        for t in _kv_tensors(obj):
            if id(t) not in seen:
                seen.add(id(t))
                key = (t.device, "kv_bytes")
                sums[key] = sums.get(key, 0) + _nbytes(t)
    for (device, kind), n in sums.items():
        _device_entry(devices, device)[kind] += int(n)


def _model_bytes(sums: dict[tuple[Any, str], int]) -> None:
    """The watched models' weights (parameters and buffers), and their gradients as the training thread last
    counted them (count_gradients), into `sums`."""
    counted: set[int] = set()  # a submodule watched beside its parent (zero-code mode's .to hook) counts once
    for model in _live(state.models):
        for tensors in (model.parameters(), model.buffers()):
            for t in tensors:
                if id(t) not in counted:
                    counted.add(id(t))
                    key = (t.device, "weights_bytes")
                    sums[key] = sums.get(key, 0) + t.numel() * t.element_size()
    for device, n in state.grads.items():
        sums[(device, "gradients_bytes")] = sums.get((device, "gradients_bytes"), 0) + n


def _optimizer_bytes(sums: dict[tuple[Any, str], int], tensor_type: Any) -> None:
    """The watched optimizers' state tensors, into `sums`."""
    is_tensor = (lambda v: isinstance(v, tensor_type)) if isinstance(tensor_type, type) else _is_tensor
    for opt in _live(state.optimizers):
        for per_param in list(getattr(opt, "state", {}).values()):
            for v in list(per_param.values()) if isinstance(per_param, dict) else ():
                if is_tensor(v):
                    key = (v.device, "optimizer_bytes")
                    sums[key] = sums.get(key, 0) + v.numel() * v.element_size()


def _cuda_stats(torch: Any, devices: dict[str, dict[str, Any]]) -> None:
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():  # never initialise CUDA
        return
    wanted = {n for n in devices if n.startswith("cuda:")} | {f"cuda:{cuda.current_device()}"}
    # On ROCm torch, torch.cuda is HIP (the same names, cuda:N devices) and torch.version.hip is set: its UUIDs
    # are not amdsmi's, so the PCI address is what joins a device to dltop's GPU there.
    runtime = "hip" if getattr(getattr(torch, "version", None), "hip", None) else "cuda"
    for name in sorted(wanted):
        index = int(name.split(":")[1])
        stats = cuda.memory_stats(index)
        entry = _device_entry(devices, name)
        entry["memory_stats"] = {k: stats[k] for k in MEMORY_STATS if k in stats}
        _name_device(entry, cuda.get_device_properties(index))
        entry["runtime"] = runtime


def _name_device(entry: dict[str, Any], props: Any) -> None:
    """A device's UUID and PCI address, where torch gives them: cuda:N counts within CUDA_VISIBLE_DEVICES, so
    these are what join it to NVML's device."""
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        entry["uuid"] = str(uuid)
    pci = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 16 for n in pci):
        entry["pci_bus_id"] = f"{pci[0]:04x}:{pci[1]:02x}:{pci[2]:02x}.0"  # sysfs's form, as torch writes it


def _recompiles() -> int:
    """Compilations of a frame after its first (a guard failed: new shapes, new types), from dynamo's own count of
    compiles per frame."""
    per_frame = getattr(sys.modules.get("torch._dynamo.convert_frame"), "FRAME_COMPILE_COUNTER", None)
    if not isinstance(per_frame, dict):
        return 0
    return sum(max(0, n - 1) for n in list(per_frame.values()) if isinstance(n, int))


# How dynamo names the graph break of a frame it stops compiling at its recompile limit (counters["unimplemented"]):
# torch 2.7+ "Dynamo recompile limit exceeded ... Limit type: recompile_limit"; older "recompile_limit reached",
# before 2.6 "cache_size_limit reached" (the accumulated limit's names hold "accumulated").
RECOMPILE_LIMIT_BREAKS = ("recompile limit exceeded", "recompile_limit reached", "cache_size_limit reached")


def _eager_fallbacks(counters: Any) -> tuple[int, int]:
    """Frames dynamo gave up compiling at its recompile limit (they run eager from then on), and of them those at
    the accumulated limit: what torch logs once as 'torch._dynamo hit config.recompile_limit'."""
    total = accumulated = 0
    for reason, n in list(counters["unimplemented"].items()):
        text = str(reason)
        if isinstance(n, int) and any(k in text for k in RECOMPILE_LIMIT_BREAKS):
            total += n
            accumulated += n if "accumulated" in text else 0
    return total, accumulated


def _recompile_limit() -> int | None:
    """torch._dynamo.config.recompile_limit (cache_size_limit before torch 2.6): recompiles a frame may have."""
    config = sys.modules.get("torch._dynamo.config")
    for name in ("recompile_limit", "cache_size_limit"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _compile_counters() -> dict[str, int] | None:
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return None
    fallbacks, accumulated = _eager_fallbacks(counters)
    limit = _recompile_limit()
    return {
        "eager_fallbacks": fallbacks,
        **({"eager_fallbacks_accumulated": accumulated} if accumulated else {}),
        **({"recompile_limit": limit} if limit is not None else {}),
        "recompiles": _recompiles(),
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "frames_ok": int(counters["frames"]["ok"]),
        "fx_graph_cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fx_graph_cache_misses": int(counters["inductor"]["fxgraph_cache_miss"]),
    }


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _job_id() -> str | None:
    """What the ranks of one distributed job share: torchrun's run id when one was given; else, under torchrun,
    its agent (the ranks' parent) and the rendezvous address; else the rendezvous address and the parent that
    started the ranks (mp.spawn). torchrun without --rdzv-id names every job's run id "none": two unrelated jobs
    would share it."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return run_id[:MAX_CMD]
    where = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '')}" if os.environ.get("MASTER_ADDR") \
        else ""
    if run_id is not None:
        return f"torchrun agent {os.getppid()} {where}".strip()[:MAX_CMD]
    if where:
        return f"{where} parent {os.getppid()}"[:MAX_CMD]
    return None


def _dist_rank() -> tuple[int | None, int | None]:
    """The rank and world size torch.distributed was given (mp.spawn passes the rank as an argument, not in the
    environment), where the process imported it and initialised a process group."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        pass
    return None, None


def _cmdline() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:MAX_CMD]
    except OSError:
        return " ".join(sys.argv)[:MAX_CMD]


def _data_report(d: _Data) -> dict[str, Any] | None:
    if not d.seen:
        return None
    now, n = time.perf_counter_ns(), d.n
    # As they are now (the loop goes on writing the ring), newest first.
    waits, steps, ends = list(d.waits), list(d.steps_ns), list(d.ends_ns)
    order = [(n - 1 - k) & (RING - 1) for k in range(min(n, RING))]
    last = next((steps[i] for i in order if steps[i]), None)
    # The window: WINDOW_S, or two of the newest step's time if longer.
    recent = _recent(order, steps, ends, now - max(int(WINDOW_S * 1e9), 2 * (last or 0)))
    return {
        "steps": n,
        "recent_steps": len(recent),
        "recent_wait_s": sum(waits[i] for i in recent) / 1e9,
        "recent_step_s": sum(steps[i] for i in recent) / 1e9,
        "window_s": WINDOW_S,
        "last_step_s": last / 1e9 if last else None,
        "last_step_age_s": round((now - ends[order[0]]) / 1e9, 3) if order else None,
        "in_epoch": d.epoch_open,
        "input_shapes": len(d.shapes),
        "loader_workers": d.workers,
        "pin_memory": d.pin_memory,
        "data_dir": d.data_dir,
        **_recent_counts(d, recent),
    }


def _recent(order: list[int], steps: list[int], ends: list[int], since: int) -> list[int]:
    """The steps of `order` that ended since `since`: a loop that stopped has none, its old numbers not shown."""
    return [i for i in itertools.takewhile(lambda i: ends[i] >= since, order) if steps[i]]


def _recent_counts(d: _Data, recent: list[int]) -> dict[str, int]:
    """The samples and tokens counted, in all and over the recent steps, where the loop counts them."""
    counts: dict[str, int] = {}
    if d.samples_total is not None:
        counts["samples"], counts["recent_samples"] = d.samples_total, sum(d.samples[i] for i in recent)
    if d.tokens_total is not None:
        counts["tokens"], counts["recent_tokens"] = d.tokens_total, sum(d.tokens[i] for i in recent)
    return counts


def _loaders_report() -> dict[str, dict[str, Any]]:
    """The loaders timed apart from the main one, by name: their recent numbers as `data` has them."""
    keys = ("steps", "recent_steps", "recent_wait_s", "recent_step_s", "last_step_age_s")
    out = {}
    for name, d in list(state.loaders.items()):
        got = _data_report(d)
        if got is not None:
            out[name] = {k: got[k] for k in keys}
    return out


def _counted_tensors(torch: Any, fresh: bool) -> dict[str, dict[str, Any]]:
    """Bytes per device of the watched tensors: counted now when `fresh`, else the last count while it is recent
    enough for the duty cycle (a copy: CUDA numbers are added to it)."""
    if fresh or state.tensors is None or time.monotonic() >= state.tensors_due:
        if fresh:  # the script's own thread (publish, report): the gradients as they are now
            count_gradients(force=True)
        t0 = time.thread_time()
        devices: dict[str, dict[str, Any]] = {}
        _tensor_bytes(devices, getattr(torch, "Tensor", None))
        state.tensors, state.tensors_at = devices, round(time.time(), 3)
        state.tensors_due = time.monotonic() + (time.thread_time() - t0) / TENSOR_DUTY
    return {name: dict(entry) for name, entry in state.tensors.items()}


def _cudnn_built(backend: Any) -> bool:
    try:
        return bool(backend.is_available())  # torch._C._has_cudnn: no CUDA initialised
    except Exception:
        return False


def _loop_is_stepping(d: _Data) -> bool:
    """An epoch is open and its last step ended within WINDOW_S: the loop is training now."""
    return d.epoch_open and d.last_t > 0 and time.perf_counter_ns() - d.last_t < WINDOW_S * 1e9


def _hold_gradients(devices: dict[str, dict[str, Any]]) -> None:
    """Report each device's gradients as the most counted while the loop steps (gradients freed by
    zero_grad(set_to_none=True) and allocated again by backward are the step's, whenever the count falls); the
    count as it is once the loop stops or its epoch closes."""
    if not _loop_is_stepping(state.data):
        state.grads_held = {}
        return
    held = state.grads_held
    for name, entry in devices.items():
        held[name] = max(held.get(name, 0), entry.get("gradients_bytes", 0))
        entry["gradients_bytes"] = held[name]


def report(fresh: bool = True) -> dict[str, Any]:
    """What the probe would publish now (format 1, docs/probe.md). `fresh=False` (the publisher thread) reuses
    the last tensor count while the duty cycle says so; `tensors_counted_at` says when it was made."""
    torch = _torch()
    devices, cudnn, compile_counters = _torch_report(torch, fresh) if torch is not None else ({}, None, None)
    pid = os.getpid()
    if state.identity is None or state.identity[0] != pid:  # read once per process (a fork has its own)
        state.identity = (pid, proc_start_ticks(pid), _cmdline())
    _, start_ticks, cmd = state.identity
    rank, world = _rank_and_world()
    return {
        "format": FORMAT,
        "pid": pid,
        "start_time_ticks": start_ticks,
        "uid": os.getuid(),
        "cmd": cmd,
        "published_at": round(time.time(), 3),
        "started_at": state.started_at,
        "rank": rank,
        "local_rank": _env_int("LOCAL_RANK"),
        "world_size": world,
        "ppid": os.getppid(),
        "job_id": _job_id(),
        "torch": getattr(torch, "__version__", None) and str(torch.__version__),
        "devices": devices,
        "tensors_counted_at": state.tensors_at if torch is not None and state.tensors is not None else None,
        # how many watched objects are alive: a 0 in `devices` is a count only where something was watched
        "watched": {"models": len(_live(state.models)), "optimizers": len(_live(state.optimizers)),
                    "kv": len(_live(state.kv))},
        "allocator_env": {k: os.environ[k] for k in ALLOC_ENV if k in os.environ},
        "cudnn": cudnn,
        "compile": compile_counters,
        "data": _data_report(state.data),
        **({"loss": loss} if (loss := _loss_report()) is not None else {}),
        **({"loaders": _loaders_report()} if state.loaders else {}),
        "epochs": list(state.epochs),
        **({"optimizer_steps": state.optimizer_steps} if state.optimizer_steps is not None else {}),
        "gpu_util_source": GPU_UTIL_SOURCE,
        **({"exit": state.exit} if state.exit is not None else {}),
        **({"folder_refused": state.folder_refused} if state.folder_refused is not None else {}),
    }


def _torch_report(torch: Any, fresh: bool) -> tuple[dict[str, dict[str, Any]], dict[str, bool] | None, Any]:
    """The devices' tensors and allocator stats, cuDNN's settings (None on a CPU-only torch: they do nothing
    there) and torch.compile's counters."""
    devices = _counted_tensors(torch, fresh)
    _hold_gradients(devices)
    _cuda_stats(torch, devices)
    backend = getattr(getattr(torch, "backends", None), "cudnn", None)
    cudnn = None
    if backend is not None and _cudnn_built(backend):
        cudnn = {"benchmark": bool(backend.benchmark), "deterministic": bool(backend.deterministic)}
    return devices, cudnn, _compile_counters()


def _rank_and_world() -> tuple[int | None, int | None]:
    """RANK and WORLD_SIZE from the environment, else from torch.distributed."""
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None:
        rank, dist_world = _dist_rank()
        world = dist_world if world is None else world
    return rank, world


def encode(doc: dict[str, Any]) -> bytes | None:
    """The file's bytes, within MAX_FILE_BYTES: drop the oldest epochs, then the other loaders, then the allocator
    settings, then cut the command, then the compile counters, then the memory_stats of the devices listed last, naming each in
    `truncated`; None when it still does not fit."""
    doc = dict(doc)
    dropped: list[str] = []
    while True:
        data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
        if len(data) <= MAX_FILE_BYTES:
            return data
        shed = _shed(doc)
        if shed is None:
            return None
        if shed not in dropped:
            dropped.append(shed)
        doc["truncated"] = dropped


def _shed(doc: dict[str, Any]) -> str | None:
    """Drop the next thing `encode` gives up (in its order) and name it; None when nothing is left to drop."""
    if len(doc["epochs"]) > 1:
        doc["epochs"] = doc["epochs"][1:]
        return "epochs"
    for key in ("loaders", "allocator_env"):
        if doc.get(key):
            doc[key] = {}
            return key
    if len(doc["cmd"]) > 64:
        doc["cmd"] = doc["cmd"][:64]
        return "cmd"
    if doc.get("compile"):
        doc["compile"] = None
        return "compile"
    with_stats = [n for n, d in doc["devices"].items() if "memory_stats" in d]
    if not with_stats:
        return None
    # A process on many GPUs (DataParallel): the allocator numbers of the devices listed last go first.
    last = dict(doc["devices"][with_stats[-1]])
    del last["memory_stats"]
    doc["devices"] = {**doc["devices"], with_stats[-1]: last}
    return "memory_stats"


def publish(fresh: bool = True) -> str | None:
    """Write this process's file once now; returns its path, or None (said once on stderr) when it cannot.
    Where the folder is refused (another user made it first), the report goes into a memfd the process holds
    instead, which dltop finds from the process (`/proc/PID/fd/N`, the path returned). `fresh`: count the
    watched tensors now (the publisher thread passes False: see report)."""
    path = probe_dir()
    if state.dir_fd is None and state.folder_refused is None:
        try:
            state.dir_fd = open_private_dir(path)
        except OSError as e:
            state.folder_refused = f"{path}: {e.strerror or e}"[:MAX_CMD]
            warn_once("folder", f"cannot publish in {state.folder_refused}; publishing to dltop through a "
                                 f"memfd ({MEMFD_NAME}) instead")
    try:
        data = encode(report(fresh))
        if data is None:
            warn_once("size", f"the report does not fit in {MAX_FILE_BYTES} bytes: not published")
            return None
        if state.dir_fd is not None:
            write_atomic(state.dir_fd, f"{os.getpid()}.json", data)
            return os.path.join(path, f"{os.getpid()}.json")
        state.memfd = publish_memfd(state.memfd, data)
    except (OSError, ValueError) as e:
        warn_once("write", f"cannot publish in {path}: {e}")
        return None
    return f"/proc/{os.getpid()}/fd/{state.memfd}"


def _remove_stale() -> None:
    """Remove files of processes that exited over KEEP_EXITED_S ago from our own directory. A newer one stays: it
    is the post-mortem dltop shows of a job that finished or was killed (docs/probe.md)."""
    fd = state.dir_fd
    if fd is None:
        return
    old = time.time() - KEEP_EXITED_S
    for name in os.listdir(fd):
        pid = name.removesuffix(".json").removesuffix(".signal")
        if pid.isdigit() and name.endswith((".json", ".signal")) and proc_start_ticks(pid) is None:
            with contextlib.suppress(OSError):
                if os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime < old:
                    os.unlink(name, dir_fd=fd)


def _hook_exceptions() -> None:
    """Wrap sys.excepthook (once) to keep the exception that ends the process for the exit record: a job that
    dies of torch.OutOfMemoryError says so after it is gone."""
    if state.hooked:
        return
    state.hooked = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        with contextlib.suppress(Exception):
            state.error = f"{kind.__name__}: {value}"[:MAX_ERROR]
        previous(kind, value, tb)

    sys.excepthook = hook


def _at_exit() -> None:
    """At interpreter exit: a process that was publishing writes its last report with an exit record (how it
    ended) and leaves the file for dltop to show; one that was not has nothing to leave."""
    with state.lock:
        thread, state.thread = state.thread, None
        state.stop.set()
    if thread is None:
        _remove_own_file()
        return
    thread.join(timeout=5)
    _unwatch_sigterm(remove=True)  # ending by itself: the exit record says how
    error = state.error
    state.exit = {"how": "exception" if error else "exit", "error": error, "exit_code": 1 if error else None,
                   "at": round(time.time(), 3)}
    with contextlib.suppress(Exception):
        if in_dataloader_worker() or publish(fresh=True) is None:
            _remove_own_file()


def _run(stop: threading.Event, interval_s: float) -> None:
    while not stop.is_set():
        if in_dataloader_worker():  # started before torch was imported (DLTOP_PROBE=1 in a spawned worker)
            _remove_own_file()
            return
        try:
            publish(fresh=False)
        except Exception as e:  # the probe must never take the training job down
            warn_once("report", f"report failed: {type(e).__name__}: {e}")
        stop.wait(interval_s)


def start(interval_s: float = 1.0) -> str | None:
    """Publish about every `interval_s` from a daemon thread (idempotent; nothing in a DataLoader worker).
    Returns the file's path, or None when nothing is published."""
    if in_dataloader_worker():
        return None
    with state.lock:
        if state.thread is not None and state.thread.is_alive():
            if state.memfd is not None:
                return f"/proc/{os.getpid()}/fd/{state.memfd}"
            return os.path.join(probe_dir(), f"{os.getpid()}.json")
        state.interval_s = interval_s
        state.started_at = round(time.time(), 3)
        path = publish()
        if path is None:
            return None
        _remove_stale()
        _hook_exceptions()
        _watch_sigterm()
        state.stop = threading.Event()
        state.thread = threading.Thread(target=_run, args=(state.stop, interval_s), name="dltop-probe",
                                         daemon=True)
        state.thread.start()
        return path


def _watch_sigterm() -> None:
    """Have SIGTERM, where it would end the process (its disposition is still the default), leave a trace: the
    stack of the thread it hit, written by faulthandler into `<pid>.signal` from the signal handler itself (C
    code: it works while the main thread is stuck in a collective), which then calls the default action: the
    process dies of SIGTERM as it would have. A program that handles SIGTERM itself, or ignores it, is left
    alone. Who sent the signal is not known: a handler told the sender would need the signal blocked in every
    thread (sigwaitinfo), which would change the program."""
    if state.dir_fd is None or state.sigterm_fd is not None:
        return
    name = signal_file(os.getpid())
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=state.dir_fd)  # a dead process's of the same pid
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=state.dir_fd)
    except OSError:
        return
    try:
        faulthandler.register(signal.SIGTERM, file=fd, all_threads=False, chain=True)
    except (OSError, RuntimeError, ValueError):
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=state.dir_fd)
        return
    state.sigterm_fd = fd


def _unwatch_sigterm(remove: bool) -> None:
    """Give SIGTERM back its disposition (the default); `remove`: and the empty trace file."""
    fd, state.sigterm_fd = state.sigterm_fd, None
    if fd is None:
        return
    with contextlib.suppress(Exception):
        faulthandler.unregister(signal.SIGTERM)
    with contextlib.suppress(OSError):
        os.close(fd)
    if remove and state.dir_fd is not None:
        with contextlib.suppress(OSError):
            os.unlink(signal_file(os.getpid()), dir_fd=state.dir_fd)


def _close_memfd() -> None:
    if state.memfd is not None:
        with contextlib.suppress(OSError):
            os.close(state.memfd)
        state.memfd = None


def _remove_own_file() -> None:
    _unwatch_sigterm(remove=True)
    _close_memfd()
    if state.dir_fd is not None:
        with contextlib.suppress(OSError):
            os.unlink(f"{os.getpid()}.json", dir_fd=state.dir_fd)


def stop() -> None:
    """Stop publishing and remove this process's file."""
    with state.lock:
        thread, state.thread = state.thread, None
        state.stop.set()
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=5)
    _remove_own_file()


def _after_fork_in_child() -> None:
    # The child has the parent's memory but not its thread: it starts fresh, and publishes only if it calls
    # start() itself. Its data and epochs are its own from here.
    state.lock = threading.Lock()
    state.thread = None
    _unwatch_sigterm(remove=False)  # the parent's trace file: a worker SIGTERM ends is not the parent's end
    _close_memfd()  # the parent's report: a child that publishes makes its own
    state.stop = threading.Event()
    state.data = _Data()
    state.main_loader = None
    state.loaders = {}
    state.epochs = []
    state.started_at = None
    state.tensors = None
    state.exit = state.error = None
    state.optimizer_steps = None
    state.grads_held, state.grads, state.grads_due = {}, {}, 0
    state.loss, state.losses, state.epoch_loss_sum, state.epoch_losses = None, 0, None, 0


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
