"""KV-cache size arithmetic from a Hugging Face model config (or from flags), and the pool a server has left for it.

Pure arithmetic: no GPU, no torch, no network. The formulas and each architecture's rule are in docs/kv.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dltop.errors import DltopError
from dltop.fmt import printable

# Bytes per element of each dtype name a user (or a config's torch_dtype) may give.
DTYPE_BYTES = {
    "fp32": 4, "float32": 4, "float": 4,
    "fp16": 2, "float16": 2, "half": 2,
    "bf16": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int8": 1,
}
# Bits per element of each KV-cache dtype. fp4 is NVIDIA's NVFP4 (E2M1 values, the only 4-bit float KV cache
# servers ship): 16 values share one fp8 (E4M3) scale, so a block of 16 takes 16 × 4 + 8 = 72 bits, 4.5 per element
# (_vector_bytes rounds each head's vector up to whole blocks). int4's scales and zero points are not counted.
KV_DTYPE_BITS: dict[str, float] = {**{k: 8.0 * v for k, v in DTYPE_BYTES.items()},
                                   "int4": 4.0, "fp4": 4.5, "nvfp4": 4.5}
BLOCK_SCALED = {"fp4": (16, 1), "nvfp4": (16, 1)}  # dtype: (elements per block, bytes of the block's scale)
KV_DTYPES = ("auto", "fp16", "bf16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "fp4", "nvfp4")
DEFAULTS = ("auto", "transformers", "table")  # who fills what a config leaves to its model type's defaults
WEIGHT_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8")
# A config with no torch_dtype (gpt-oss) is taken to be in this dtype, that of gpt-oss's unquantized tensors;
# the output says it was assumed.
ASSUMED_DTYPE = "bfloat16"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
MAX_CONFIG_BYTES = 4 << 20  # DeepSeek-V3's config.json is 1.7 KB; a bigger file is not a model config
MAX_LAYERS = 4096  # the deepest published models have ~130; each layer is a tuple entry and a loop turn here
MAX_SIZE = 1 << 40  # any other size (heads, dims, vocab, window): sums of products of these stay exact


class ConfigError(DltopError):
    """A config file that cannot be read or does not describe a model this planner can size (exit status 1)."""


@dataclass(frozen=True)
class KvShape:
    """What one token costs in each layer's KV cache, and how many tokens each layer keeps."""

    name: str
    attention: str  # "MHA", "GQA", "MQA" or "MLA"
    layers: int
    heads: int | None
    kv_heads: int | None  # None under MLA: one latent per token, not per head
    head_dim: int | None
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    elements_per_token_layer: int  # K and V together (GQA), or the latent plus the RoPE key (MLA)
    dtype: str
    dtype_bytes: float  # per element: 0.5 for int4, 0.5625 for nvfp4 (its block scales included)
    dtype_source: str
    windows: tuple[int | None, ...]  # per layer: the tokens it keeps at most (window or chunk), None for all
    notes: tuple[str, ...] = ()
    vector_dim: int = 0  # the length of one cached vector (head_dim; the latent plus RoPE key under MLA)
    kinds: tuple[str, ...] = ()  # per layer: "full", "sliding" or "chunked"; () when derived from windows
    defaults: Resolution | None = None
    assumptions: tuple[str, ...] = ()

    @property
    def bytes_per_token_layer(self) -> int:
        dim = self.vector_dim or self.elements_per_token_layer
        return self.elements_per_token_layer // dim * _vector_bytes(dim, self.dtype)

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        return self.kinds or tuple("full" if w is None else "sliding" for w in self.windows)

    @property
    def bytes_per_token(self) -> int:
        """One token in every layer, as if every layer kept every token (no window)."""
        return self.layers * self.bytes_per_token_layer

    def sequence_bytes(self, tokens: int) -> int:
        """The cache of one sequence of `tokens`: a sliding layer keeps at most its window."""
        return sum(self.bytes_per_token_layer * (tokens if w is None else min(tokens, w)) for w in self.windows)

    @property
    def sliding_layers(self) -> int:
        """Layers that keep at most a window of a sequence: sliding-window and chunked (Llama 4) layers."""
        return sum(w is not None for w in self.windows)

    @property
    def chunked_layers(self) -> int:
        return self.layer_kinds.count("chunked")


def _vector_bytes(dim: int, dtype: str) -> int:
    """Bytes of one cached vector of `dim` elements: whole blocks with their scale for a block-scaled dtype."""
    if dtype in BLOCK_SCALED:
        block, scale = BLOCK_SCALED[dtype]
        return -(-dim // block) * (block * 4 // 8 + scale)
    return math.ceil(dim * KV_DTYPE_BITS[dtype] / 8)


@dataclass(frozen=True)
class ParamCount:
    """A parameter count computed from the config (an estimate: the checkpoint may hold more or less)."""

    total: int
    parts: dict[str, int]
    notes: tuple[str, ...] = ()


def load_config(path: str) -> dict[str, Any]:
    """Read a config.json; an unreadable, oversized or non-JSON file is a ConfigError naming it, in one line."""
    where = printable(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read config {where}: {e.strerror or e}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: over {MAX_CONFIG_BYTES:,} bytes: not a model config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not JSON (not UTF-8 text: byte {e.start:,})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise ConfigError(f"{where}: not a model config (nested deeper than Python's JSON reader goes)") from None
    except ValueError as e:  # an integer over Python's 4,300-digit limit for int()
        raise ConfigError(f"{where}: not a model config ({printable(str(e)).split(';')[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: not a model config (a JSON {type(data).__name__}, not an object)")
    return data


def _shown(v: Any) -> str:
    """A config value in an error message: as JSON, one line, at most 60 characters of it."""
    text = printable(json.dumps(v))
    return text if len(text) <= 60 else text[:57] + "..."


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The text model's fields: multimodal wrappers nest them under `text_config`; the outer torch_dtype applies
    where the inner one is missing."""
    inner = cfg.get("text_config")
    if not isinstance(inner, dict):
        return cfg
    merged = dict(inner)
    for key in ("torch_dtype", "dtype", "tie_word_embeddings", "model_type"):
        if key not in merged and key in cfg:
            merged[key] = cfg[key]
    return merged


def _int(cfg: dict[str, Any], *keys: str, required: str | None = None, minimum: int = 1,
         maximum: int = MAX_SIZE) -> int | None:
    """The first of `keys` the config has as a whole number from `minimum` to `maximum`; None if none (a
    ConfigError if `required`). A float (32.0), a bool, NaN or a number past any model's is refused."""
    for key in keys:
        v = cfg.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum:
            raise ConfigError(f"{key} in the config must be a whole number from {minimum} to {maximum:,}, "
                              f"not {_shown(v)}")
        return v
    if required:
        raise ConfigError(f"the config has no {required} ({' / '.join(keys)})")
    return None


def _layers(cfg: dict[str, Any]) -> int:
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers", required="layer count", maximum=MAX_LAYERS)
    assert layers is not None
    return layers


def model_dtype(cfg: dict[str, Any]) -> tuple[str, str]:
    """The model's dtype name and where it came from: torch_dtype (or the newer `dtype`), else the assumption."""
    for key in ("torch_dtype", "dtype"):
        v = cfg.get(key)
        if v is None:
            continue
        name = str(v).removeprefix("torch.")
        if name not in DTYPE_BYTES:
            raise ConfigError(f"{key} {_shown(v)} in the config is not a dtype this planner knows")
        return name, f"config {key}"
    return ASSUMED_DTYPE, "assumed: the config has no torch_dtype"


def _windows(cfg: dict[str, Any], layers: int, filled: bool = False
             ) -> tuple[tuple[int | None, ...], tuple[str, ...], list[str], list[str]]:
    """Each layer's window (None = full attention) and kind, by the rules of docs/kv.md, with notes on the choice
    and the assumptions made. `filled`: layer_types came from the model type's defaults, not the config."""
    window = _int(cfg, "sliding_window")
    full: tuple[int | None, ...] = (None,) * layers
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ConfigError(f"layer_types in the config must list one type for each of the {layers} layers")
        typed = [_layer_window(cfg, t, window) for t in types]
        out, kinds = [w for w, _ in typed], [k for _, k in typed]
        notes = []
        if filled and window is not None and "sliding" not in kinds and "use_sliding_window" in cfg:
            notes.append(f"sliding_window {window} does not apply: use_sliding_window is off")
        return tuple(out), tuple(kinds), notes, []
    if window is None:
        return full, (), [], []
    return _slide_pattern(cfg, layers, window)


def _slide_pattern(cfg: dict[str, Any], layers: int, window: int) -> tuple[
        tuple[int | None, ...], tuple[str, ...], list[str], list[str]]:
    """`_windows` for a config with a sliding_window and no layer_types: which layers slide, by its keys or its
    model type's known pattern (every layer, assumed and said, where neither tells)."""
    model_type = str(cfg.get("model_type", ""))
    if "use_sliding_window" in cfg or model_type.startswith(("qwen2", "qwen3")):
        if not cfg.get("use_sliding_window"):
            return (None,) * layers, (), [f"sliding_window {window} does not apply: use_sliding_window is off"], []
        first = _int(cfg, "max_window_layers", minimum=0) or 0
        return tuple(window if i >= first else None for i in range(layers)), (), [], []
    pattern = _int(cfg, "sliding_window_pattern")
    if pattern is None and model_type == "gemma2":
        pattern = 2  # Gemma 2 alternates in its modelling code, with no key in the config
    if pattern is not None:
        return tuple(window if (i + 1) % pattern else None for i in range(layers)), (), [], []
    assumed = []
    if model_type not in _WINDOW_EVERYWHERE:
        kind = f"model type {_shown(model_type)}" if model_type else "a config with no model_type"
        assumed.append(f"every layer slides (sliding_window {window}): {kind} is not one whose layer pattern dltop "
                       "knows, and the config has no layer_types or sliding_window_pattern; if some layers attend "
                       "to every token the cache is larger")
    return (window,) * layers, (), [], assumed


def _layer_window(cfg: dict[str, Any], t: Any, window: int | None) -> tuple[int | None, str]:
    """The window and kind of a layer of type `t` (layer_types)."""
    if t == "full_attention":
        return None, "full"
    if t == "sliding_attention":
        if window is None:
            raise ConfigError("layer_types has sliding_attention layers but the config has no sliding_window")
        return window, "sliding"
    if t == "chunked_attention":
        chunk = _int(cfg, "attention_chunk_size")
        if chunk is None:
            raise ConfigError("layer_types has chunked_attention layers but the config has no attention_chunk_size")
        return chunk, "chunked"  # a token sees only its own chunk: the cache keeps at most one chunk
    raise ConfigError(f"layer type {_shown(t)} is not one this planner can size "
                      "(it knows full_attention, sliding_attention and chunked_attention)")


# -- what a config leaves to its model type ---------------------------------------------------------------------

# The keys a model type's defaults may fill (only where the config lacks the key: an explicit null stays null).
FILL_KEYS = ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "sliding_window",
             "layer_types", "attention_chunk_size", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
             "v_head_dim", "q_lora_rank", "vocab_size", "intermediate_size", "tie_word_embeddings")
_MLA_UNUSED = ("num_key_value_heads", "head_dim")  # transformers fills them for DeepSeek; MLA caches neither
# Model types whose every layer slides when sliding_window is set (their modelling code has no layer pattern).
_WINDOW_EVERYWHERE = ("mistral", "mixtral")
# A multimodal wrapper's type, and its text model's.
_TEXT_TYPES = {"gemma3": "gemma3_text", "llama4": "llama4_text"}


def _alternate(cfg: dict[str, Any], layers: int) -> list[str]:
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]


def _gemma3_types(cfg: dict[str, Any], layers: int) -> list[str]:
    pattern = _int(cfg, "sliding_window_pattern") or 6  # transformers' Gemma3TextConfig: a global layer every 6th
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]


def _qwen_types(cfg: dict[str, Any], layers: int) -> list[str]:
    # Qwen2/3Config: the window applies only with use_sliding_window, to the layers from max_window_layers up.
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window") else None
    first = _int(cfg, "max_window_layers", minimum=0)
    first = 28 if first is None else first
    return ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(layers)]


def _llama4_types(cfg: dict[str, Any], layers: int) -> list[str]:
    # Llama4TextConfig: the RoPE layers attend in chunks, every no_rope_layer_interval-th layer (NoPE) to all.
    no_rope = cfg.get("no_rope_layers")
    if not no_rope:
        interval = _int(cfg, "no_rope_layer_interval") or 4
        no_rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(no_rope, list) or len(no_rope) != layers or any(v not in (0, 1) for v in no_rope):
        raise ConfigError(f"no_rope_layers in the config must list 0 or 1 for each of the {layers} layers")
    chunk = cfg.get("attention_chunk_size", 8192)
    return ["chunked_attention" if r and chunk is not None else "full_attention" for r in no_rope]


_Rule = Callable[[dict[str, Any], int], list[str]]
# dltop's own table of each family's defaults: transformers' config classes (5.x), for where it is not importable.
# tests/test_kv.py checks every family's numbers against transformers.
_GEMMA = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 2304,
          "sliding_window": 4096, "intermediate_size": 9216, "tie_word_embeddings": True}
_QWEN = {"num_attention_heads": 32, "num_key_value_heads": 32, "hidden_size": 4096, "sliding_window": 4096,
         "vocab_size": 151936, "intermediate_size": 22016}
_MLA = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
FAMILIES: dict[str, tuple[dict[str, Any], _Rule | None]] = {
    "gemma2": ({**_GEMMA, "vocab_size": 256000}, _alternate),
    "gemma3_text": ({**_GEMMA, "vocab_size": 262208}, _gemma3_types),
    "mistral": ({"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": 4096,
                 "vocab_size": 32000, "intermediate_size": 14336}, None),
    "mixtral": ({"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "vocab_size": 32000,
                 "intermediate_size": 14336}, None),
    "qwen2": (_QWEN, _qwen_types),
    "qwen3": ({**_QWEN, "head_dim": 128}, _qwen_types),
    "llama4_text": ({"num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120,
                     "attention_chunk_size": 8192, "vocab_size": 202048, "intermediate_size": 8192}, _llama4_types),
    "gpt_oss": ({"num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880,
                 "sliding_window": 128, "vocab_size": 201088, "intermediate_size": 2880}, _alternate),
    "deepseek_v2": ({**_MLA, "num_attention_heads": 32, "hidden_size": 4096, "vocab_size": 102400,
                     "intermediate_size": 11008}, None),
    "deepseek_v3": ({**_MLA, "num_attention_heads": 128, "hidden_size": 7168, "vocab_size": 129280,
                     "intermediate_size": 18432}, None),
}

for _values, _rule in FAMILIES.values():
    _values.setdefault("tie_word_embeddings", False)  # only Gemma ties lm_head to the embeddings by default


@dataclass(frozen=True)
class Resolution:
    """A text config with what it leaves to its model type filled in, who filled it, and notes on that."""

    config: dict[str, Any]
    filled: dict[str, Any]  # key: the default put in its place
    source: str  # "transformers 5.2.0 (Gemma3TextConfig)", "dltop's table (gemma3_text)" or "" (none applied)
    notes: tuple[str, ...] = ()


def resolve_config(cfg: dict[str, Any], defaults: str = "table") -> Resolution:
    """The text config as the library reads it: keys it lacks taken from its model type's defaults. `defaults`
    'auto': transformers' config class where transformers is importable, else dltop's table; 'transformers' or
    'table': only that one. A config error is a ConfigError; transformers refusing the config is a note."""
    text = text_config(cfg)
    model_type = text.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return Resolution(text, {}, "")
    # transformers builds a list per layer: a layer count past any model's is refused before it sees one.
    layers = _int(text, "num_hidden_layers", maximum=MAX_LAYERS)
    notes: list[str] = []
    family = FAMILIES.get(_TEXT_TYPES.get(model_type, model_type))
    if defaults != "table":
        got = _transformers_defaults(text, model_type)
        if isinstance(got, tuple):
            return _filled(text, got[0], got[1], notes)
        if defaults == "transformers":
            raise ConfigError(f"--defaults transformers: {got}")
        if not got.startswith("not importable"):
            notes.append(f"transformers could not fill the defaults ({got}): "
                         + ("dltop's table did" if family else "nor does dltop's table know this model type"))
    if family is None:
        return Resolution(text, {}, "", tuple(notes))
    table, rule = family
    values = dict(table)
    if rule is not None and layers is not None:
        values["layer_types"] = rule(text, layers)
    if rule is _qwen_types and not text.get("use_sliding_window"):
        del values["sliding_window"]  # Qwen2/3Config drop their window when use_sliding_window is off
    return _filled(text, values, f"dltop's table ({printable(_TEXT_TYPES.get(model_type, model_type))})", notes)


def _filled(text: dict[str, Any], values: dict[str, Any], source: str, notes: list[str]) -> Resolution:
    filled = {k: values[k] for k in FILL_KEYS if k not in text and values.get(k) is not None}
    if "kv_lora_rank" in text or "kv_lora_rank" in filled:
        for k in _MLA_UNUSED:
            filled.pop(k, None)
    return Resolution({**text, **filled}, filled, source if filled else "", tuple(notes))


def _transformers_defaults(text: dict[str, Any], model_type: str) -> tuple[dict[str, Any], str] | str:
    """The defaults transformers' config class for `model_type` gives this config, and which class; or why not."""
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING, AutoConfig
    except Exception as e:  # noqa: BLE001 - absent, or broken in this environment: the table stands in
        return f"not importable: {printable(str(e)).splitlines()[0] if str(e) else type(e).__name__}"
    version = printable(str(getattr(transformers, "__version__", "?")))
    if model_type not in CONFIG_MAPPING:
        return f"transformers {version} does not know model type {_shown(model_type)}"
    cls = CONFIG_MAPPING[model_type]
    sub = (getattr(cls, "sub_configs", None) or {}).get("text_config")
    if isinstance(sub, type) and sub is not AutoConfig:
        cls = sub  # a multimodal wrapper's type: its text model's class
    kwargs = {k: v for k, v in text.items() if k != "model_type"}
    log = logging.getLogger("transformers")
    level = log.level
    try:
        log.setLevel(logging.ERROR)  # its warnings about the config are not dltop's output
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = cls(**kwargs).to_dict()
    except Exception as e:  # noqa: BLE001 - a config someone else wrote: transformers refusing it is a reason
        first = printable(str(e)).strip().splitlines()
        return f"{type(e).__name__}: {first[0][:120] if first else 'no message'}"
    finally:
        log.setLevel(level)
    if not isinstance(values, dict):
        return f"{cls.__name__}.to_dict() gave no mapping"
    return values, f"transformers {version} ({cls.__name__})"


def shape_from_config(cfg: dict[str, Any], kv_dtype: str = "auto", name: str = "", defaults: str = "table",
                      resolution: Resolution | None = None) -> KvShape:
    """The KV shape of a Hugging Face config.json (its text model); `kv_dtype` 'auto' is the model's dtype. What the
    config leaves to its model type is filled first (`defaults`, see resolve_config; or a `resolution` made)."""
    res = resolution or resolve_config(cfg, defaults)
    cfg = res.config
    notes: list[str] = list(res.notes)
    layers = _layers(cfg)
    name = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")
    heads = _int(cfg, "num_attention_heads", "n_head")
    dtype, source = _kv_dtype(cfg, kv_dtype)
    if dtype in ("float32", "float") and kv_dtype == "auto":
        notes.append("a float32 model: vLLM's --dtype auto serves it in float16, half this cache")
    windows, kinds, window_notes, assumed = _windows(cfg, layers, "layer_types" in res.filled)
    notes += window_notes
    notes += _uncounted(cfg, dtype)
    rank = cfg.get("kv_lora_rank")
    if rank is not None:
        rank = _int(cfg, "kv_lora_rank")
        rope = _int(cfg, "qk_rope_head_dim") or 0
        assert rank is not None
        if cfg.get("num_key_value_heads") is not None:
            notes.append(f"num_key_value_heads {_shown(cfg['num_key_value_heads'])} does not apply under MLA: one latent "
                         "per token per layer, shared by all heads")
        return KvShape(name, "MLA", layers, heads, None, None, rank, rope, rank + rope, dtype, _element_bytes(dtype),
                       source, windows, tuple(notes), rank + rope, kinds, res, tuple(assumed))
    if heads is None:
        raise ConfigError("the config has no num_attention_heads (needed for the KV heads and head_dim)")
    kv_heads = _int(cfg, "num_key_value_heads") or heads
    head_dim = _head_dim(cfg, heads)
    shape = _gqa(name, layers, heads, kv_heads, head_dim, dtype, source, windows, notes)
    return dataclasses.replace(shape, kinds=kinds, defaults=res, assumptions=tuple(assumed))


def _uncounted(cfg: dict[str, Any], dtype: str) -> list[str]:
    """What the KV shape leaves out: multi-token-prediction layers, an int4 cache's scales."""
    notes = []
    mtp = _int(cfg, "num_nextn_predict_layers", minimum=0)
    if mtp:
        notes.append(f"the {mtp} multi-token-prediction layer(s) are not counted (they cache only when used "
                     "for speculative decoding)")
    if dtype in ("int4",):
        notes.append("int4: 4 bits per element; the scales and zero points an int4 cache keeps beside it are "
                     "not counted")
    return notes


def _head_dim(cfg: dict[str, Any], heads: int) -> int:
    """head_dim, else hidden_size over the heads."""
    head_dim = _int(cfg, "head_dim")
    if head_dim is not None:
        return head_dim
    hidden = _int(cfg, "hidden_size", "n_embd", required="head_dim nor hidden_size")
    assert hidden is not None
    if hidden % heads:
        raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}: "
                          "the config needs an explicit head_dim")
    return hidden // heads


def _element_bytes(dtype: str) -> float:
    """Bytes per element, a whole number where it is one (0.5625 for nvfp4, with its block scales)."""
    b = KV_DTYPE_BITS[dtype] / 8
    return int(b) if b == int(b) else b


def _kv_dtype(cfg: dict[str, Any], kv_dtype: str) -> tuple[str, str]:
    if kv_dtype != "auto":
        return kv_dtype, "--kv-dtype"
    dtype, source = model_dtype(cfg)
    return dtype, f"auto: {source}"


def _gqa(name: str, layers: int, heads: int, kv_heads: int, head_dim: int, dtype: str, source: str,
         windows: tuple[int | None, ...], notes: list[str]) -> KvShape:
    if kv_heads > heads or heads % kv_heads:
        raise ConfigError(f"{kv_heads} KV heads do not divide {heads} attention heads")
    kind = "MHA" if kv_heads == heads else "MQA" if kv_heads == 1 else "GQA"
    return KvShape(name, kind, layers, heads, kv_heads, head_dim, None, None, 2 * kv_heads * head_dim, dtype,
                   _element_bytes(dtype), source, windows, tuple(notes), head_dim)


def shape_from_flags(layers: int, heads: int, kv_heads: int | None, head_dim: int, dtype: str,
                     source: str) -> KvShape:
    """The KV shape of a model given by its numbers (`dltop kv --layers ... --dtype ...`)."""
    return _gqa("flags", layers, heads, kv_heads or heads, head_dim, dtype, source, (None,) * layers, [])


def _moe_layer(cfg: dict[str, Any], i: int) -> bool:
    """Whether layer i's MLP is a mixture of experts (DeepSeek's first_k_dense_replace / moe_layer_freq, Qwen's
    mlp_only_layers / decoder_sparse_step; otherwise every layer)."""
    if i < (_int(cfg, "first_k_dense_replace", minimum=0) or 0):
        return False
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list):
        raise ConfigError(f"mlp_only_layers in the config must be a list of layer numbers, not {_shown(dense)}")
    if i in dense or i % (_int(cfg, "moe_layer_freq") or 1):
        return False
    return (i + 1) % (_int(cfg, "decoder_sparse_step") or 1) == 0


def parameter_count(cfg: dict[str, Any], defaults: str = "table", resolution: Resolution | None = None) -> ParamCount:
    """The parameters of a standard decoder-only model from its config: embeddings, attention (MHA/GQA/MLA), MLP
    (dense, or MoE with routed and shared experts), norms, and lm_head unless tied. A ConfigError if a size is
    missing. Defaults are filled as for shape_from_config."""
    cfg = (resolution or resolve_config(cfg, defaults)).config
    notes: list[str] = []
    model_type = str(cfg.get("model_type", ""))
    layers = _layers(cfg)
    hidden = _int(cfg, "hidden_size", "n_embd", required="hidden_size")
    vocab = _int(cfg, "vocab_size", required="vocab_size")
    heads = _int(cfg, "num_attention_heads", "n_head", required="num_attention_heads")
    assert layers is not None and hidden is not None and vocab is not None and heads is not None
    attn = _attention_params(cfg, hidden, heads, model_type)
    mlp = _mlp_params(cfg, layers, hidden, model_type)
    embed = vocab * hidden
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        notes.append("tie_word_embeddings is not in the config: lm_head counted apart from the embeddings")
    parts = {
        "embeddings": embed,
        "attention": layers * attn,
        "mlp": mlp,
        "norms": layers * 2 * hidden + hidden,
        "lm_head": 0 if tied else embed,
    }
    return ParamCount(sum(parts.values()), parts, tuple(notes))


def _attention_params(cfg: dict[str, Any], hidden: int, heads: int, model_type: str) -> int:
    """The attention parameters of one layer: MLA's low-rank projections, else MHA/GQA's (with their biases)."""
    if cfg.get("kv_lora_rank") is not None:
        rank = _int(cfg, "kv_lora_rank") or 0
        rope = _int(cfg, "qk_rope_head_dim") or 0
        nope = _int(cfg, "qk_nope_head_dim") or 0
        v_dim = _int(cfg, "v_head_dim", required="v_head_dim (MLA)") or 0
        q_rank = _int(cfg, "q_lora_rank")
        q_out = heads * (nope + rope)
        q = hidden * q_rank + q_rank + q_rank * q_out if q_rank else hidden * q_out  # + q_a_layernorm
        return q + hidden * (rank + rope) + rank + rank * heads * (nope + v_dim) + heads * v_dim * hidden
    kv_heads = _int(cfg, "num_key_value_heads") or heads
    head_dim = _int(cfg, "head_dim") or hidden // heads
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    attn = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    if cfg.get("attention_bias"):
        attn += q_out + 2 * kv_out + hidden
    elif model_type.startswith("qwen2"):
        attn += q_out + 2 * kv_out  # Qwen2 has biases on q, k and v (not o), with no key in the config
    if model_type == "gpt_oss":
        attn += heads  # one attention sink per head
    return attn


def _mlp_params(cfg: dict[str, Any], layers: int, hidden: int, model_type: str) -> int:
    """The MLP parameters of every layer: dense, or MoE on the layers that route."""
    experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts")
    inter = _int(cfg, "intermediate_size")
    mlp_bias = bool(cfg.get("mlp_bias"))
    dense = 3 * hidden * inter + (2 * inter + hidden if mlp_bias else 0) if inter else None
    moe = _moe_params(cfg, hidden, experts, inter, model_type) if experts else None
    mlp = 0
    for i in range(layers):
        if moe is not None and _moe_layer(cfg, i):
            mlp += moe
        elif dense is not None:
            mlp += dense
        else:
            raise ConfigError("the config has no intermediate_size for its dense layers")
    return mlp


def _moe_params(cfg: dict[str, Any], hidden: int, experts: int, inter: int | None, model_type: str) -> int:
    """One MoE layer's parameters: the routed experts, the router, the shared experts."""
    e_inter = _int(cfg, "moe_intermediate_size") or inter
    if e_inter is None:
        raise ConfigError("the config has no moe_intermediate_size / intermediate_size")
    per_expert = 3 * hidden * e_inter
    router = hidden * experts
    if model_type == "gpt_oss":
        per_expert += 2 * e_inter + hidden  # gate_up and down biases
        router += experts
    if cfg.get("topk_method") == "noaux_tc":
        router += experts  # DeepSeek-V3's e_score_correction_bias
    moe = experts * per_expert + router
    shared = _int(cfg, "n_shared_experts", minimum=0) or 0
    moe += shared * 3 * hidden * e_inter
    s_inter = _int(cfg, "shared_expert_intermediate_size")
    if s_inter:
        moe += 3 * hidden * s_inter + hidden  # Qwen-MoE's shared expert and its gate
    return moe


@dataclass(frozen=True)
class Weights:
    """The bytes the weights take, and where that number came from."""

    bytes: int
    source: str
    parameters: int | None = None
    dtype: str | None = None
    notes: tuple[str, ...] = ()


def estimate_weights(cfg: dict[str, Any], weights_dtype: str | None, defaults: str = "table",
                     resolution: Resolution | None = None) -> Weights:
    """Parameter count × dtype bytes, with notes that say what the estimate assumes."""
    count = parameter_count(cfg, defaults, resolution)
    inner = text_config(cfg)
    notes = list(count.notes)
    if weights_dtype:
        dtype, source = weights_dtype, "--weights-dtype"
    else:
        dtype, source = model_dtype(inner)
        quant = cfg.get("quantization_config") or inner.get("quantization_config")
        if isinstance(quant, dict) and quant.get("quant_method"):
            notes.append(f"the checkpoint is quantized ({quant['quant_method']}): this estimate assumes {dtype} "
                         "for every weight; give --weights-dtype or --weights-bytes for the real size")
        else:
            notes.append("give --weights-dtype or --weights-bytes to override")
    size = count.total * DTYPE_BYTES[dtype]
    return Weights(size, f"estimate: {count.total:,} parameters from the config × {DTYPE_BYTES[dtype]} B "
                         f"({dtype}, {source})", count.total, dtype, tuple(notes))


@dataclass(frozen=True)
class Pool:
    """What a server (vLLM's arithmetic) has left for the KV cache, and what it holds."""

    gpu_mem_bytes: int
    gpu_memory_utilization: float
    weights: Weights
    overhead_bytes: int
    overhead_source: str
    seq: int
    sequence_bytes: int
    bytes_per_token: int
    gpu_mem_source: str = "--gpu-mem"
    budget_bytes: int = field(init=False)
    pool_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        budget = math.floor(self.gpu_mem_bytes * self.gpu_memory_utilization)
        object.__setattr__(self, "budget_bytes", budget)
        object.__setattr__(self, "pool_bytes", budget - self.weights.bytes - self.overhead_bytes)

    @property
    def pool_tokens(self) -> int:
        """Tokens the pool holds if every layer keeps every token."""
        return max(0, self.pool_bytes) // self.bytes_per_token

    @property
    def max_sequences(self) -> int:
        """Sequences of `seq` tokens that fit at once (sliding layers capped at their window)."""
        return max(0, self.pool_bytes) // self.sequence_bytes


def plan(shape: KvShape, seq: int, gpu_mem_bytes: int, utilization: float, weights: Weights,
         overhead_bytes: int | None, gpu_mem_source: str = "--gpu-mem") -> Pool:
    """The KV pool of a GPU of `gpu_mem_bytes` at vLLM's `gpu_memory_utilization`, after weights and overhead;
    `gpu_mem_source` says where the GPU's size came from."""
    if overhead_bytes is None:
        overhead, source = 0, ("not subtracted (the default): vLLM measures peak activation, CUDA-graph and "
                               "non-torch memory when it starts, so the pool is an upper bound; set --overhead-bytes")
    else:
        overhead, source = overhead_bytes, "--overhead-bytes"
    return Pool(gpu_mem_bytes, utilization, weights, overhead, source, seq, shape.sequence_bytes(seq),
                shape.bytes_per_token, gpu_mem_source)


def shape_dict(shape: KvShape) -> dict[str, Any]:
    """The shape as JSON data."""
    kinds = shape.layer_kinds
    window = next((w for w, k in zip(shape.windows, kinds, strict=True) if k == "sliding"), None)
    chunk = next((w for w, k in zip(shape.windows, kinds, strict=True) if k == "chunked"), None)
    return {
        "name": shape.name, "attention": shape.attention, "layers": shape.layers, "heads": shape.heads,
        "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "kv_lora_rank": shape.kv_lora_rank,
        "qk_rope_head_dim": shape.qk_rope_head_dim, "elements_per_token_layer": shape.elements_per_token_layer,
        "kv_dtype": shape.dtype, "kv_dtype_bytes": shape.dtype_bytes, "kv_dtype_source": shape.dtype_source,
        "sliding_layers": shape.sliding_layers, "sliding_window": window,
        "chunked_layers": shape.chunked_layers, "attention_chunk_size": chunk,
        "kv_dtype_bits": KV_DTYPE_BITS[shape.dtype],
        "defaults": None if shape.defaults is None or not shape.defaults.source else {
            "source": shape.defaults.source, "filled": shape.defaults.filled},
        "assumptions": list(shape.assumptions),
    }


def pool_dict(pool: Pool) -> dict[str, Any]:
    """The pool as JSON data."""
    return {
        "gpu_mem_bytes": pool.gpu_mem_bytes, "gpu_mem_source": pool.gpu_mem_source,
        "gpu_memory_utilization": pool.gpu_memory_utilization,
        "budget_bytes": pool.budget_bytes, "weights_bytes": pool.weights.bytes,
        "weights_source": pool.weights.source, "overhead_bytes": pool.overhead_bytes,
        "overhead_source": pool.overhead_source, "upper_bound": pool.overhead_source != "--overhead-bytes",
        "pool_bytes": pool.pool_bytes, "pool_tokens": pool.pool_tokens, "max_sequences": pool.max_sequences,
    }
