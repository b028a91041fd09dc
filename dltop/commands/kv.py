"""`dltop kv`: the KV cache of a model for a batch of sequences, and how many fit in a GPU's KV pool.

The model comes from a Hugging Face config.json (--config) or from its numbers (--layers --heads --kv-heads
--head-dim --dtype). The formulas are in docs/kv.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Callable
from typing import Any

from dltop import kv
from dltop.commands.common import above_zero, non_negative_int, positive_int
from dltop.errors import DltopError, UsageError
from dltop.fmt import parse_bytes, printable
from dltop.model import Unavailable
from dltop.model.gpu import GpuDevice, GpuPart, MigDevice

_SHAPE_FLAGS = ("layers", "heads", "kv_heads", "head_dim", "dtype")


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_size(text: str) -> int:
    return above_zero(_size(text), text, "bytes")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 1: {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop kv`."""
    p = sub.add_parser("kv", help="KV-cache size of a model, and how many sequences fit on a GPU",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="a Hugging Face config.json (text_config is read too)")
    p.add_argument("--layers", type=positive_int, metavar="N", help="layers (without --config)")
    p.add_argument("--heads", type=positive_int, metavar="N", help="attention heads (without --config)")
    p.add_argument("--kv-heads", type=positive_int, metavar="N", help="KV heads (default: --heads)")
    p.add_argument("--head-dim", type=positive_int, metavar="N", help="head dimension (without --config)")
    p.add_argument("--dtype", choices=[d for d in kv.KV_DTYPES if d != "auto"],
                   help="the model's dtype (without --config)")
    p.add_argument("--kv-dtype", choices=kv.KV_DTYPES, default="auto",
                   help="KV-cache dtype (default auto: the model's torch_dtype, or --dtype)")
    p.add_argument("--defaults", choices=kv.DEFAULTS, default="auto",
                   help="who fills what the config leaves to its model type: transformers' config class, dltop's "
                        "table, or auto (transformers where importable, else the table; the default)")
    p.add_argument("--batch", type=positive_int, default=1, metavar="N", help="sequences (default 1)")
    p.add_argument("--seq", type=positive_int, required=True, metavar="TOKENS", help="tokens per sequence")
    p.add_argument("--gpu-mem", type=_positive_size, metavar="SIZE",
                   help="GPU memory, e.g. 80GiB or 85899345920: plan the KV pool (default: the memory total of "
                        "the one GPU NVML sees)")
    p.add_argument("--gpu", type=non_negative_int, metavar="N",
                   help="plan the KV pool of GPU N as NVML sees it (its memory total)")
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=kv.DEFAULT_GPU_MEMORY_UTILIZATION,
                   metavar="F", help="vLLM's fraction of the GPU the instance may use (default 0.9)")
    p.add_argument("--weights-bytes", type=_size, metavar="SIZE",
                   help="the weights' size (default: estimated from the config's parameter count)")
    p.add_argument("--weights-dtype", choices=kv.WEIGHT_DTYPES,
                   help="dtype for the weights estimate (default: the config's torch_dtype)")
    p.add_argument("--overhead-bytes", type=_size, metavar="SIZE",
                   help="activations, CUDA graphs, CUDA context to subtract from the pool (default 0: upper bound)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _shape_and_config(args: argparse.Namespace) -> tuple[kv.KvShape, dict[str, Any] | None]:
    given = [f"--{f.replace('_', '-')}" for f in _SHAPE_FLAGS if getattr(args, f) is not None]
    if args.config:
        if given:
            raise UsageError(f"kv: {', '.join(given)} cannot be combined with --config (the config gives them)")
        cfg = kv.load_config(args.config)
        name = os.path.basename(args.config).removesuffix(".json").removesuffix(".config")
        if name == "config":
            name = ""
        return kv.shape_from_config(cfg, args.kv_dtype, name, args.defaults), cfg
    missing = [f"--{f.replace('_', '-')}" for f in ("layers", "heads", "head_dim") if getattr(args, f) is None]
    if missing:
        raise UsageError(f"kv: give --config FILE, or the model's numbers (missing {', '.join(missing)})")
    if args.kv_dtype != "auto":
        dtype, source = args.kv_dtype, "--kv-dtype"
    elif args.dtype:
        dtype, source = args.dtype, "auto: --dtype"
    else:
        raise UsageError("kv: give --dtype (or --kv-dtype) with the model's numbers")
    return kv.shape_from_flags(args.layers, args.heads, args.kv_heads, args.head_dim, dtype, source), None


def run(args: argparse.Namespace) -> int:
    """Print the KV cache size (and the pool plan with --gpu-mem) as text or JSON."""
    shape, cfg = _shape_and_config(args)
    weights = _weights(args, shape, cfg)
    if args.gpu is not None and args.gpu_mem is not None:
        raise UsageError("kv: give --gpu N or --gpu-mem SIZE, not both")
    gpu: tuple[int, str] | str = (args.gpu_mem, "--gpu-mem") if args.gpu_mem is not None else _gpu_memory(args.gpu)
    pool: kv.Pool | str
    if isinstance(gpu, str):
        pool = gpu
    elif isinstance(weights, str):
        pool = weights
    else:
        pool = kv.plan(shape, args.seq, gpu[0], args.gpu_memory_utilization, weights, args.overhead_bytes, gpu[1])
    data = _result(shape, args, weights, pool)
    sys.stdout.write(json.dumps(data, indent=2) + "\n" if args.json else _text(shape, data, pool))
    sys.stdout.flush()
    return 0


def _weights(args: argparse.Namespace, shape: kv.KvShape, cfg: dict[str, Any] | None) -> kv.Weights | str:
    """The weights' bytes: --weights-bytes, else estimated from the config; or why not."""
    if args.weights_dtype and args.weights_bytes is not None:
        raise UsageError("kv: give --weights-bytes or --weights-dtype, not both")
    if args.weights_bytes is not None:
        return kv.Weights(args.weights_bytes, "--weights-bytes")
    if cfg is None:
        return "no config to count parameters from: give --weights-bytes"
    try:
        return kv.estimate_weights(cfg, args.weights_dtype, resolution=shape.defaults)
    except kv.ConfigError as e:
        return f"cannot count the parameters: {e}; give --weights-bytes"


def _gpu_memory(index: int | None) -> tuple[int, str] | str:
    """(bytes, where from) of GPU `index` from NVML, or with no index of the one GPU NVML sees (or the MIG instance
    CUDA_VISIBLE_DEVICES names); why not, for the pool's place, when no index was asked for. With an index, what
    stands in the way is an error. A GPU in MIG mode is planned against the instance this process sees."""
    from dltop.sources.gpu import GpuReader, make_backend

    reader = GpuReader(make_backend)
    try:
        part = reader.read()
    finally:
        reader.close()
    visible = _visible_mig()
    g = _the_gpu(part, index, visible)
    if isinstance(g, str):
        return g
    label = f"GPU {g.index} ({printable(g.name or 'name unknown')}, {printable(g.uuid or 'UUID unknown')})"

    def refuse(why: str) -> str:
        if index is None:
            return f"no --gpu-mem given, and {why}"
        raise DltopError(f"kv: --gpu {index}: {why}; pass --gpu-mem SIZE instead")

    if g.mig_mode:
        return _mig_memory(g, label, visible, refuse)
    if g.memory_total_bytes is None:
        return refuse(f"{label} has no memory total: {g.why('memory_total_bytes')}")
    if g.memory_pool == "system":
        return g.memory_total_bytes, f"{label}: system memory total ({g.memory_pool_note})"
    return g.memory_total_bytes, f"{label}: NVML's memory total"


def _the_gpu(part: GpuPart | Unavailable, index: int | None, visible: str) -> GpuDevice | str:
    """GPU `index` of NVML's; with no index, the one GPU it sees (or the MIG instance CUDA_VISIBLE_DEVICES
    names), else why there is none to take."""
    if index is None:
        return _only_gpu(part, visible)
    if isinstance(part, Unavailable):
        raise DltopError(f"kv: --gpu {index}: NVML cannot be used: {part.reason}; pass --gpu-mem SIZE instead")
    if index >= len(part):
        raise UsageError(f"kv: --gpu {index}: NVML sees {len(part)} GPU{'s' if len(part) != 1 else ''} "
                         f"(0 to {len(part) - 1})")
    return part[index]


def _only_gpu(part: GpuPart | Unavailable, visible: str) -> GpuDevice | str:
    """The one GPU NVML sees (or the one with the MIG instance CUDA_VISIBLE_DEVICES names), else why none."""
    if isinstance(part, Unavailable):
        return f"no --gpu-mem given, and no GPU to read it from: {part.reason}"
    named = [g for g in part if visible and _mig_named(g, visible)]
    if len(part) != 1 and not named:
        return f"no --gpu-mem given, and NVML sees {len(part)} GPUs: pick one with --gpu N"
    return named[0] if named else part[0]


def _visible_mig() -> str:
    """The MIG instance CUDA_VISIBLE_DEVICES names first ('' for none): CUDA runs a process on one instance only."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first if first.startswith("MIG-") else ""


def _mig_named(g: GpuDevice, visible: str) -> MigDevice | None:
    """The instance of `g` that `visible` names: by its UUID, or the older MIG-GPU-<uuid>/<gi>/<ci> form."""
    for m in g.mig_devices:
        if m.uuid and m.uuid == visible:
            return m
        if g.uuid and visible == f"MIG-{g.uuid}/{m.gpu_instance_id}/{m.compute_instance_id}":
            return m
    return None


def _mig_memory(g: GpuDevice, label: str, visible: str, refuse: Callable[[str], str]) -> tuple[int, str] | str:
    """The memory of the MIG instance of `g` this process sees: the one CUDA_VISIBLE_DEVICES names, or the only
    one; otherwise a refusal (the whole GPU's total is more than any process on it can have)."""
    got = _mig_instance(g, label, visible)
    if isinstance(got, str):
        return refuse(got)
    chosen, how = got
    what = f"MIG {printable(chosen.name or 'instance')} ({printable(chosen.uuid or 'UUID unknown')}) of {label}, {how}"
    if chosen.memory_total_bytes is None:
        why = chosen.unavailable.get("memory_total_bytes") or next(iter(chosen.unavailable.values()), "not read")
        return refuse(f"{what} has no memory total: {why}")
    return chosen.memory_total_bytes, f"{what}: NVML's memory total"


def _mig_instance(g: GpuDevice, label: str, visible: str) -> tuple[MigDevice, str] | str:
    """(the MIG instance of `g` this process sees, how it was chosen), or why there is no one instance."""
    if visible:
        chosen = _mig_named(g, visible)
        if chosen is None:
            return f"CUDA_VISIBLE_DEVICES names {printable(visible)}, which is not a MIG instance of {label}"
        return chosen, "the instance CUDA_VISIBLE_DEVICES names"
    if len(g.mig_devices) != 1:
        names = ", ".join(printable(m.name or m.uuid or f"instance {m.mig_index}") for m in g.mig_devices)
        return (f"{label} is in MIG mode with {len(g.mig_devices)} instances ({names or 'none'}): a process gets "
                "one instance's memory, not the GPU's; set CUDA_VISIBLE_DEVICES=MIG-<uuid> to plan against one")
    return g.mig_devices[0], "its only instance"


def _result(shape: kv.KvShape, args: argparse.Namespace, weights: kv.Weights | str,
            pool: kv.Pool | str) -> dict[str, Any]:
    seq_bytes = shape.sequence_bytes(args.seq)
    check = kv.cross_check(shape)
    return {
        "model": kv.shape_dict(shape, args.seq),
        "batch": args.batch,
        "seq": args.seq,
        "tokens": args.batch * args.seq,
        "bytes_per_token": shape.bytes_per_token,
        "bytes_per_sequence": seq_bytes,
        "total_bytes": args.batch * seq_bytes,
        "max_positions": shape.max_positions,
        "max_positions_source": shape.max_positions_source,
        "weights": {"unavailable": weights} if isinstance(weights, str) else {
            "bytes": weights.bytes, "source": weights.source, "parameters": weights.parameters,
            "dtype": weights.dtype, "notes": list(weights.notes)},
        "pool": {"unavailable": pool} if isinstance(pool, str) else kv.pool_dict(pool),
        "cross_check": {"unavailable": check} if isinstance(check, str) else {
            "source": check.source, "agrees": not check.differences, "differences": list(check.differences),
            "notes": list(check.notes)},
        "warnings": _warnings(shape, args.seq),
        "notes": list(shape.notes),
    }


def _warnings(shape: kv.KvShape, seq: int) -> list[str]:
    """What makes the size a size of something the model was not made for: a sequence past its positions."""
    if shape.max_positions is None or seq <= shape.max_positions:
        return []
    return [f"--seq {seq:,} is past the model's {shape.max_positions:,} positions ({shape.max_positions_source}): "
            "it was not made for sequences this long; the size is what such a cache would take"]


def _b(n: int) -> str:
    return f"{n:,} B ({n / (1 << 30):.2f} GiB)"


def _formula(shape: kv.KvShape, g: kv.LayerKv) -> str:
    """One token in one layer of shape `g`, as a product of its sizes."""
    b = shape.dtype_bytes
    if g.kind == "shared":
        return "none of its own (reuses an earlier layer's cache)"
    if g.attention == "MLA":
        return f"(kv_lora_rank {shape.kv_lora_rank} + qk_rope_head_dim {shape.qk_rope_head_dim}) × {b} B"
    if g.k_dim == g.v_dim:
        return f"2 (K, V) × {g.kv_heads} KV heads × {g.k_dim} × {b} B"
    return f"{g.kv_heads} KV heads × (K {g.k_dim} + V {g.v_dim}) × {b} B"


def _shape_lines(shape: kv.KvShape, d: dict[str, Any]) -> list[str]:
    """The per-token cost: one formula where every layer has the same shape, else one line per layer group."""
    groups = d["model"]["layer_groups"]
    shapes = {(g.kv_heads, g.k_dim, g.v_dim) for g, _ in shape.groups()}
    if len(shapes) == 1:
        first = shape.per_layer[0]
        return [f"per token    {d['bytes_per_token']:,} B = {shape.layers} layers × {_formula(shape, first)}"]
    lines = [f"per token    {d['bytes_per_token']:,} B = the sum over {len(groups)} layer groups (without windows):"]
    for (g, _), gd in zip(shape.groups(), groups, strict=True):
        keeps = "" if g.kind == "shared" else ", all tokens" if g.window is None else f", each ≤ {g.window:,} tokens"
        lines.append(f"  {gd['count']:>3} {g.kind}{keeps}: {_formula(shape, g)} = {gd['bytes_per_token_per_layer']:,} B")
        lines += textwrap.wrap(f"{gd['bytes_per_sequence']:,} B of the sequence; layers "
                               f"{kv.layer_ranges(gd['layers'])}", 80, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return lines


def _text(shape: kv.KvShape, d: dict[str, Any], pool: kv.Pool | str) -> str:
    m = d["model"]
    lines = [f"model        {printable(m['name'])}: {shape.attention}, KV cache in {shape.dtype} ({shape.dtype_source})",
             *_shape_lines(shape, d)]
    if shape.dtype in kv.BLOCK_SCALED:
        block, scale = kv.BLOCK_SCALED[shape.dtype]
        lines.append(f"{shape.dtype:<12} 4-bit values and a {scale}-byte fp8 scale per {block}: "
                     f"{kv.KV_DTYPE_BITS[shape.dtype]} bits each")
    res = shape.defaults
    if res is not None and res.source:
        lines.append(f"defaults     {printable(res.source)} filled {_filled(res.filled)}")
    lines += [f"assumed      {printable(a)}" for a in m["assumptions"]]
    lines += _window_lines(shape, m)
    lines += [
        f"sequence     {d['bytes_per_sequence']:,} B for {d['seq']:,} tokens",
        f"KV cache     {_b(d['total_bytes'])} for {d['batch']:,} × {d['seq']:,} = {d['tokens']:,} tokens",
    ]
    lines += [f"warning      {printable(w)}" for w in d["warnings"]]
    w = d["weights"]
    if "unavailable" not in w:
        lines.append(f"weights      {_b(w['bytes'])}: {w['source']}")
    if isinstance(pool, str):
        lines.append(f"KV pool      unavailable: {printable(pool)}")
    else:
        lines += _pool_lines(d["pool"], d["seq"])
    lines += _check_lines(d["cross_check"])
    notes = [*d["notes"], *([] if "unavailable" in w else w["notes"])]
    lines += [f"note         {printable(n)}" for n in notes]
    return "\n".join(lines) + "\n"


def _window_lines(shape: kv.KvShape, m: dict[str, Any]) -> list[str]:
    sliding = shape.sliding_layers - shape.chunked_layers
    windows = sorted({w for w, k in zip(shape.windows, shape.layer_kinds, strict=True) if k == "sliding" and w})
    lines = []
    if sliding:
        keeps = " or ".join(f"{w:,}" for w in windows)
        lines.append(f"window       {sliding} of {shape.layers} layers slide: each keeps at most {keeps} tokens of a "
                     "sequence")
    if shape.chunked_layers:
        lines.append(f"chunks       {shape.chunked_layers} of {shape.layers} layers attend within chunks: each keeps "
                     f"at most {m['attention_chunk_size']:,} tokens of a sequence")
    if m["shared_layers"]:
        lines.append(f"shared       {m['shared_layers']} of {shape.layers} layers reuse an earlier layer's cache "
                     "(num_kv_shared_layers): they keep none of their own")
    return lines


def _check_lines(c: dict[str, Any]) -> list[str]:
    """transformers' reading of the config beside dltop's."""
    if "unavailable" in c:
        return [f"check        not cross-checked with transformers: {printable(c['unavailable'])}"]
    if c["agrees"]:
        lines = [f"check        {printable(c['source'])} agrees on every layer"]
    else:
        lines = [f"check        {printable(c['source'])} differs on {printable(d)}" for d in c["differences"]]
    return lines + [f"check        {printable(n)}" for n in c["notes"]]


def _pool_lines(p: dict[str, Any], seq: int) -> list[str]:
    """How the KV pool is worked out from the GPU's memory, and what it holds."""
    bound = " (upper bound)" if p["upper_bound"] else ""
    lines = [
        f"GPU memory   {_b(p['gpu_mem_bytes'])}: {p['gpu_mem_source']}",
        f"budget       {_b(p['budget_bytes'])} = {p['gpu_mem_bytes']:,} B × gpu_memory_utilization "
        f"{p['gpu_memory_utilization']}",
        f"overhead     {p['overhead_bytes']:,} B: {p['overhead_source']}",
    ]
    if p["pool_bytes"] < 0:
        lines.append(f"KV pool      none: weights and overhead exceed the budget by {-p['pool_bytes']:,} B")
    else:
        lines.append(f"KV pool      {_b(p['pool_bytes'])} = budget − weights − overhead{bound}")
    return [*lines, f"holds        {p['pool_tokens']:,} tokens, if every layer keeps every token{bound}",
            f"fits         {p['max_sequences']:,} sequences of {seq:,} tokens at once{bound}"]


def _filled(filled: dict[str, Any]) -> str:
    """The keys a model type's defaults filled, one list: layer_types as counts of each type."""
    parts = []
    for k, v in filled.items():
        if k == "per_layer_config" and isinstance(v, dict):
            v = f"({len(v)} layers)"
        elif k == "layer_types" and isinstance(v, list):
            counts = {t: v.count(t) for t in dict.fromkeys(v)}
            v = "(" + ", ".join(f"{n} {printable(str(t)).removesuffix('_attention')}" for t, n in counts.items()) + ")"
        parts.append(f"{k} {printable(str(v))}")
    return ", ".join(parts)
