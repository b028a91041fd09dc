"""`dltop doctor`: what runs fully on this node and what runs degraded, layer by layer, why, and the fix.

It reads every source once, as `dltop snapshot` does, and reads each layer's own word on itself (a part's
reason, the residency method a dataset got, the probe files it could not read), then what the exporter and the
recorder would get here (prometheus_client, the kernel log for the OOM killer's victim, the capabilities this
process holds). Exit status: 0 when every layer runs fully (a layer this machine does not have, such as GPUs on a
CPU node, counts as full: nothing is missing), 1 when any runs degraded, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import textwrap
from dataclasses import asdict, dataclass
from typing import Any

FULL, DEGRADED, NONE = "full", "degraded", "none"
# The capabilities a root dltop uses (deploy/systemd/*.service keep them): bit, name, what is lost without it.
CAPS = ((2, "CAP_DAC_READ_SEARCH", "other users' files and folders (datasets, caches, probe files) unreadable"),
        (3, "CAP_FOWNER", "cachestat of files it does not own refused: those files fall back to mincore"),
        (19, "CAP_SYS_PTRACE", "other processes' /proc/PID/ns, fd and environ unreadable (a pod's probe, caches)"),
        (34, "CAP_SYSLOG", "the kernel log closed where kernel.dmesg_restrict is 1: OOM victims from the last sample"))


@dataclass
class Layer:
    """One layer's verdict: `state` full, degraded or none (this machine does not have it), in a line, why
    where not full, and the fix."""

    layer: str
    state: str
    summary: str
    why: str = ""
    fix: str = ""


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop doctor`."""
    from dltop.commands.common import add_common_options

    p = sub.add_parser("doctor", help="say what runs fully here and what runs degraded, and the fix",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.add_argument("--dataset", dest="paths", action="append", metavar="PATH",
                   help="also check this dataset directory (repeatable; the config's are checked too)")
    p.add_argument("--timeout", type=float, default=20.0, metavar="SECONDS",
                   help="give up on a source after this long (default 20)")
    add_common_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check every layer; print the verdicts; 1 when any is degraded."""
    layers = check(args)
    bad = sum(1 for x in layers if x.state == DEGRADED)
    if args.json:
        print(json.dumps({"degraded": bad, "layers": [asdict(x) for x in layers]}, indent=1))
    else:
        print("\n".join(render(layers)))
    return 1 if bad else 0


def check(args: argparse.Namespace) -> list[Layer]:
    """The verdict of every layer, in the order an operator reads them."""
    from dltop.commands.snapshot import read_snapshot
    from dltop.config import Settings, settings_from_args
    from dltop.errors import DltopError

    out: list[Layer] = []
    try:
        settings = settings_from_args(args)
        out.append(Layer("config", FULL, "the config and the options read"))
    except DltopError as e:
        settings = Settings(datasets=tuple(os.path.abspath(p) for p in args.paths or ()))
        out.append(Layer("config", DEGRADED, "refused: the checks below ran with the defaults", str(e),
                         "fix the file it names, or move it away (dltop runs with the defaults)"))
    snap = read_snapshot(settings, args.timeout)
    root = os.geteuid() == 0
    out += [gpu_layer(snap, root), memory_layer(snap), cachestat_layer(snap), *dataset_layers(snap),
            caches_layer(snap), cpu_layer(snap), probe_layer(snap, root), exporter_layer(),
            recorder_layer(root), privileges_layer(root)]
    return out


def _reason(part: Any) -> str | None:
    from dltop.model import Unavailable

    return part.reason if isinstance(part, Unavailable) else None


def _unread(layer: str, summary: str, part: Any, fix: str = "see why") -> Layer:
    """A layer whose part of the Snapshot is not there: degraded, with the part's own reason."""
    return Layer(layer, DEGRADED, summary, _reason(part) or "no reading", fix)


def gpu_layer(snap: Any, root: bool) -> Layer:
    from dltop.model import Unavailable

    gpus = snap.gpus
    if isinstance(gpus, Unavailable):
        if gpus.absent:
            return Layer("GPU/NVML", NONE, "no GPU here", gpus.reason)
        return Layer("GPU/NVML", DEGRADED, "GPUs not read", gpus.reason,
                     "check the driver (nvidia-smi); in a container, run it with the GPUs (docker run --gpus all)")
    if not gpus:
        return Layer("GPU/NVML", NONE, "no GPU here")
    if not root:
        return Layer("GPU/NVML", DEGRADED, f"{len(gpus)} GPUs, their processes named only where this user may",
                     "not root: another user's GPU process shows without its command and user",
                     "run as root (sudo dltop ...), or the systemd units in deploy/systemd/")
    return Layer("GPU/NVML", FULL, f"{len(gpus)} GPUs, every process named")


def memory_layer(snap: Any) -> Layer:
    from dltop.model import MemoryPart

    mem = snap.memory
    if not isinstance(mem, MemoryPart):
        return _unread("page cache", "memory not read", mem,
                       "check /proc/meminfo is readable (a container with /proc masked?)")
    missing = [f"{k}: {v}" for k, v in (mem.unavailable or {}).items()]
    psi = _reason(mem.pressure_memory)
    if psi:
        return Layer("page cache", DEGRADED, "no memory pressure (PSI)", psi,
                     "boot a kernel with CONFIG_PSI=y, and psi=1 on its command line where it is off by default")
    cg = _reason(mem.cgroup)
    if missing or cg:
        return Layer("page cache", DEGRADED, "some memory numbers not read", "; ".join(missing + ([cg] if cg else [])),
                     "see why above; most are a /proc or /sys file a container hides")
    return Layer("page cache", FULL, "meminfo, vmstat, PSI, the memory cgroup")


def cachestat_layer(snap: Any) -> Layer:
    from dltop.kernel import have_cachestat

    if have_cachestat():
        return Layer("cachestat", FULL, "cachestat(2): residency with dirty, writeback and recently evicted pages")
    return Layer("cachestat", DEGRADED, "residency by mincore(2): no dirty, writeback or recently evicted counts",
                 f"cachestat(2) not answered: Linux {platform.release()} (it came in 6.5), or a seccomp filter "
                 "refuses it",
                 "a kernel 6.5 or newer; under systemd, a SystemCallFilter deny list (deploy/systemd does), not "
                 "@system-service on systemd < 255")


def dataset_layers(snap: Any) -> list[Layer]:
    from dltop.model import DatasetsPart

    part = snap.datasets
    if part is None:
        return [Layer("datasets", NONE, "none watched", "", "dltop doctor --dataset PATH, or datasets = [...] in "
                      "the config")]
    if not isinstance(part, DatasetsPart):
        return [Layer("datasets", DEGRADED, "not read", _reason(part) or "", "see why")]
    out = [_dataset_layer(d) for d in part.paths]
    if part.found:  # the folders training jobs read, found without a flag
        n = len(part.found)
        out.append(Layer("found datasets", FULL, f"{n} folder{'s' if n != 1 else ''} read by training jobs, found "
                         "without a flag" + (f"; {part.discovery}" if part.discovery else "")))
    return out or [Layer("datasets", NONE, "none watched, none found read by a training job")]


def _dataset_layer(d: Any) -> Layer:
    """One watched dataset's verdict: scanned with every page read, some pages unknown, or not scanned."""
    from dltop.model.datasets import DatasetUnavailable

    name = f"dataset {d.path}"
    if isinstance(d, DatasetUnavailable):
        return Layer(name, DEGRADED, "not scanned", d.unavailable,
                     "mount it, or give a path that is there (dltop export serves it as down until it is)")
    why = _dataset_problem(d)
    if why:
        return Layer(name, DEGRADED, f"by {d.method or '?'}: some pages unknown", why,
                     "run as root (or a unit with CAP_DAC_READ_SEARCH and CAP_FOWNER) to read every file")
    return Layer(name, FULL, f"every page read, by {d.method or '?'}")


def _dataset_problem(d: Any) -> str:
    problems = [str(p) for p in (getattr(d, "problems", None) or ())][:3]
    if getattr(d, "unknown_pages", 0):
        problems.insert(0, f"{d.unknown_pages} pages unknown ({getattr(d, 'unknown_reason', None) or 'unreadable'})")
    return "; ".join(problems)


def caches_layer(snap: Any) -> Layer:
    from dltop.model import CachesPart

    part = snap.caches
    if not isinstance(part, CachesPart):
        return _unread("caches", "not read", part)
    return Layer("caches", FULL, f"{len(part.caches)} compile and model caches of {part.environment}")


def cpu_layer(snap: Any) -> Layer:
    from dltop.model import CpuPart

    cpu = snap.cpu
    if not isinstance(cpu, CpuPart):
        return _unread("CPU topology", "not read", cpu, "check /sys/devices/system/cpu is there (a container may hide it)")
    if not cpu.caches:
        return Layer("CPU topology", DEGRADED, f"{len(cpu.cpus)} CPUs, no cache sizes",
                     "/sys/devices/system/cpu/cpu*/cache holds nothing here", "a VM may hide its caches: nothing to do")
    return Layer("CPU topology", FULL, f"{len(cpu.cpus)} CPUs, {len(cpu.caches)} caches: {cpu.arrangement or ''}")


def probe_layer(snap: Any, root: bool) -> Layer:
    from dltop.model import ProbesPart

    part = snap.probes
    if not isinstance(part, ProbesPart):
        return _unread("probe", "probes not read", part)
    found = f"{len(part.processes)} training processes with dltop.probe"
    if not root:
        return Layer("probe", DEGRADED, f"{found}, this user's only",
                     "not root: another user's probe files and memfds cannot be read",
                     "run as root, or the systemd units in deploy/systemd/")
    return Layer("probe", FULL, found + ", every user's")


def exporter_layer() -> Layer:
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        return Layer("exporter", DEGRADED, "dltop export cannot run: prometheus_client is not installed", "",
                     "pip install 'dltop[export]'")
    return Layer("exporter", FULL, "dltop export can serve (deploy/systemd/dltop-export.service)")


def recorder_layer(root: bool) -> Layer:
    from dltop.recorder.oom import kmsg_status

    why = kmsg_status()
    if why:
        return Layer("recorder", DEGRADED, "records; an OOM victim named from the last sample, not the kernel log",
                     why, "run it as root or as deploy/systemd/dltop-record.service (it keeps CAP_SYSLOG and "
                     "/dev/kmsg)")
    return Layer("recorder", FULL, "records; an OOM victim named from the kernel log")


def privileges_layer(root: bool) -> Layer:
    held = _effective_caps()
    who = f"uid {os.geteuid()}" + (" (root)" if root else "")
    unit = " under systemd" if os.environ.get("INVOCATION_ID") else ""
    if held is None:
        return Layer("privileges", DEGRADED if not root else FULL, f"{who}{unit}", "/proc/self/status unreadable")
    lost = [f"{name}: {what}" for bit, name, what in CAPS if not held >> bit & 1]
    if not lost:
        return Layer("privileges", FULL, f"{who}{unit}, every capability dltop uses")
    if not root:
        return Layer("privileges", DEGRADED, f"{who}: this user's processes and files only",
                     f"not root: none of {', '.join(name for _, name, _ in CAPS)}",
                     "sudo dltop ..., or the units in deploy/systemd/")
    return Layer("privileges", DEGRADED, f"{who}{unit}, some capabilities bounded away", "; ".join(lost),
                 "add them to the unit's CapabilityBoundingSet= (deploy/systemd/ keeps all four)")


def _effective_caps() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def render(layers: list[Layer], width: int = 80) -> list[str]:
    """The verdicts as plain text: a line per layer (a long name on a line of its own), why and the fix under
    each degraded one, wrapped at `width`; every text from outside (a path, a reason) escaped."""
    from dltop import __version__
    from dltop.fmt import printable

    bad = [x for x in layers if x.state == DEGRADED]
    out = [f"dltop doctor: dltop {__version__}, Linux {printable(platform.release())}, uid {os.geteuid()}",
           f"{len(layers) - len(bad)} layers full (or not on this machine), {len(bad)} degraded", ""]
    for x in layers:
        name = printable(x.layer)
        if len(name) > 13:
            out.append(name)
            name = ""
        out += textwrap.wrap(f"{x.state:<9} {printable(x.summary)}", width, initial_indent=f"{name:<14}",
                             subsequent_indent=" " * 24)
        for label, text in (("why", x.why), ("fix", x.fix)):
            if text and (x.state == DEGRADED or x.state == NONE and label == "why"):
                out += textwrap.wrap(printable(text), width, initial_indent=f"{'':<14}{label}: ",
                                     subsequent_indent=" " * 19)
    return out
