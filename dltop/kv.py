"""KV-cache size arithmetic from a Hugging Face model config (or from flags), and the pool a server has left for it.

Pure arithmetic: no GPU, no torch, no network. The formulas and each architecture's rule are in docs/kv.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
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
class LayerKv:
    """What one layer keeps for each token of a sequence: its KV heads, the length of its K and V vectors, and how
    many tokens it keeps at most."""

    kind: str  # "full", "sliding", "chunked", or "shared": it reuses an earlier layer's cache and keeps none
    window: int | None  # the tokens it keeps at most (window or chunk), None for all
    kv_heads: int  # 1 under MLA (one latent per token, shared by all heads); 0 for a shared layer
    k_dim: int  # MLA: kv_lora_rank + qk_rope_head_dim (the latent and the RoPE key)
    v_dim: int  # 0 under MLA (the latent is both) and for a shared layer
    heads: int | None = None  # query heads; None under MLA and for a shared layer

    @property
    def attention(self) -> str:
        if self.kind == "shared":
            return "shared"
        if self.heads is None:
            return "MLA"
        return "MHA" if self.kv_heads == self.heads else "MQA" if self.kv_heads == 1 else "GQA"

    def bytes_per_token(self, dtype: str) -> int:
        v = _vector_bytes(self.v_dim, dtype) if self.v_dim else 0
        return self.kv_heads * (_vector_bytes(self.k_dim, dtype) + v) if self.kv_heads else 0


@dataclass(frozen=True)
class KvShape:
    """What one token costs in each layer's KV cache, and how many tokens each layer keeps."""

    name: str
    attention: str  # "MHA", "GQA", "MQA" or "MLA"; "GQA+MQA" (say) where the layers differ
    layers: int
    heads: int | None
    kv_heads: int | None  # where every layer has the same (None under MLA, or where they differ: see per_layer)
    head_dim: int | None  # likewise
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    dtype: str
    dtype_bytes: float  # per element: 0.5 for int4, 0.5625 for nvfp4 (its block scales included)
    dtype_source: str
    per_layer: tuple[LayerKv, ...]
    notes: tuple[str, ...] = ()
    defaults: Resolution | None = None
    assumptions: tuple[str, ...] = ()
    max_positions: int | None = None  # the longest sequence the config says the model takes
    max_positions_source: str = ""  # the key it came from, or why there is none

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Per layer: the tokens it keeps at most, None for all (and for a shared layer, which keeps none)."""
        return tuple(layer.window for layer in self.per_layer)

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        return tuple(layer.kind for layer in self.per_layer)

    @property
    def bytes_per_token(self) -> int:
        """One token in every layer, as if every layer kept every token (no window)."""
        return sum(layer.bytes_per_token(self.dtype) for layer in self.per_layer)

    def sequence_bytes(self, tokens: int) -> int:
        """The cache of one sequence of `tokens`: a sliding layer keeps at most its window."""
        return sum(layer.bytes_per_token(self.dtype) * (tokens if layer.window is None else min(tokens, layer.window))
                   for layer in self.per_layer)

    @property
    def sliding_layers(self) -> int:
        """Layers that keep at most a window of a sequence: sliding-window and chunked (Llama 4) layers."""
        return sum(w is not None for w in self.windows)

    @property
    def chunked_layers(self) -> int:
        return self.layer_kinds.count("chunked")

    def groups(self) -> list[tuple[LayerKv, list[int]]]:
        """Each distinct layer shape (with its window) and the layers that have it, in the order of first layers."""
        found: dict[LayerKv, list[int]] = {}
        for i, layer in enumerate(self.per_layer):
            found.setdefault(layer, []).append(i)
        return list(found.items())


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
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not JSON (not UTF-8 text: byte {e.start:,})") from None
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
    window = _int(cfg, *_WINDOW_KEYS, minimum=0) or None  # transformers writes 0 for none (Qwen2-MoE)
    full: tuple[int | None, ...] = (None,) * layers
    types = _layer_types(cfg, layers)
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


_WINDOW_KEYS = ("sliding_window", "sliding_window_size")  # MiMo-V2 and Inkling say sliding_window_size


def _layer_types(cfg: dict[str, Any], layers: int) -> Any:
    """The config's layer_types, or MiMo-V2's hybrid_layer_pattern as layer_types (1 for a sliding-window layer, 0
    for full attention); None where it has neither."""
    pattern = cfg.get("hybrid_layer_pattern")
    if cfg.get("layer_types") is not None or pattern is None:
        return cfg.get("layer_types")
    if not isinstance(pattern, list) or len(pattern) != layers or any(
            type(p) is not int or p not in (0, 1) for p in pattern):
        raise ConfigError(f"hybrid_layer_pattern in the config must list 0 (full) or 1 (sliding) for each of the "
                          f"{layers} layers")
    return ["sliding_attention" if p else "full_attention" for p in pattern]


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
             "v_head_dim", "q_lora_rank", "vocab_size", "intermediate_size", "tie_word_embeddings", "per_layer_config",
             "num_kv_shared_layers", "global_head_dim")
_MLA_UNUSED = ("num_key_value_heads", "head_dim")  # transformers fills them for DeepSeek; MLA caches neither
# Model types whose every layer slides when sliding_window is set (their modelling code has no layer pattern).
_WINDOW_EVERYWHERE = ("mistral", "mixtral")
# A multimodal wrapper's type, and its text model's.
_TEXT_TYPES = {"gemma3": "gemma3_text", "gemma3n": "gemma3n_text", "gemma4": "gemma4_text", "llama4": "llama4_text"}


def _alternate(cfg: dict[str, Any], layers: int) -> list[str]:
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]


def _gemma3_types(cfg: dict[str, Any], layers: int) -> list[str]:
    pattern = _int(cfg, "sliding_window_pattern") or 6  # transformers' Gemma3TextConfig: a global layer every 6th
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]


def _gemma3n_types(cfg: dict[str, Any], layers: int) -> list[str]:
    return ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(layers)]  # Gemma3nTextConfig


def _gemma4_types(cfg: dict[str, Any], layers: int) -> list[str]:
    # Gemma4TextConfig: a full layer every 6th, and the last layer full.
    return ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention" for i in range(layers)]


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
    "gemma3n_text": ({"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "hidden_size": 2048,
                      "sliding_window": 512, "vocab_size": 262400, "intermediate_size": 16384,
                      "tie_word_embeddings": True, "num_kv_shared_layers": 15}, _gemma3n_types),
    "gemma4_text": ({**_GEMMA, "sliding_window": 512, "vocab_size": 262144, "num_kv_shared_layers": 0,
                     "global_head_dim": 512}, _gemma4_types),
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
    # transformers' config object of this config, for the cross-check; and which class it is, or why there is none.
    library: Any = field(default=None, compare=False, repr=False)
    library_source: str = "not asked (--defaults table)"


def resolve_config(cfg: dict[str, Any], defaults: str = "table") -> Resolution:
    """The text config as the library reads it: keys it lacks taken from its model type's defaults. `defaults`
    'auto': transformers' config class where transformers is importable, else dltop's table; 'transformers' or
    'table': only that one. A config error is a ConfigError; transformers refusing the config is a note."""
    text = text_config(cfg)
    model_type = text.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return Resolution(text, {}, "", (), None, "the config has no model_type")
    # transformers builds a list per layer: a layer count past any model's is refused before it sees one.
    layers = _int(text, "num_hidden_layers", maximum=MAX_LAYERS)
    notes: list[str] = []
    family = FAMILIES.get(_TEXT_TYPES.get(model_type, model_type))
    why = "not asked (--defaults table)"
    if defaults != "table":
        got = _transformers_defaults(text, model_type)
        if isinstance(got, tuple):
            return _filled(text, got[0], got[1], notes, got[2])
        why = got
        if defaults == "transformers":
            raise ConfigError(f"--defaults transformers: {got}")
        if not got.startswith("not importable"):
            notes.append(f"transformers could not fill the defaults ({got}): "
                         + ("dltop's table did" if family else "nor does dltop's table know this model type"))
    if family is None:
        return Resolution(text, {}, "", tuple(notes), None, why)
    table, rule = family
    values = dict(table)
    if rule is not None and layers is not None:
        values["layer_types"] = rule(text, layers)
    if rule is _qwen_types and not text.get("use_sliding_window"):
        del values["sliding_window"]  # Qwen2/3Config drop their window when use_sliding_window is off
    res = _filled(text, values, f"dltop's table ({printable(_TEXT_TYPES.get(model_type, model_type))})", notes)
    return dataclasses.replace(res, library_source=why)


def _filled(text: dict[str, Any], values: dict[str, Any], source: str, notes: list[str],
            library: Any = None) -> Resolution:
    filled = {k: values[k] for k in FILL_KEYS if k not in text and values.get(k) not in (None, {})}
    if "kv_lora_rank" in text or "kv_lora_rank" in filled:
        for k in _MLA_UNUSED:
            filled.pop(k, None)
    if "hybrid_layer_pattern" in text:
        filled.pop("layer_types", None)  # the config's own pattern, not its model type's default
    return Resolution({**text, **filled}, filled, source if filled else "", tuple(notes), library,
                      source if library is not None else "")


def _transformers_defaults(text: dict[str, Any], model_type: str) -> tuple[dict[str, Any], str, Any] | str:
    """The defaults transformers' config class for `model_type` gives this config, which class, and the config
    object it made; or why not."""
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
            obj = cls(**kwargs)
            values = obj.to_dict()
    except Exception as e:  # noqa: BLE001 - a config someone else wrote: transformers refusing it is a reason
        first = printable(str(e)).strip().splitlines()
        return f"{type(e).__name__}: {first[0][:120] if first else 'no message'}"
    finally:
        log.setLevel(level)
    if not isinstance(values, dict):
        return f"{cls.__name__}.to_dict() gave no mapping"
    return values, f"transformers {version} ({cls.__name__})", obj


def shape_from_config(cfg: dict[str, Any], kv_dtype: str = "auto", name: str = "", defaults: str = "table",
                      resolution: Resolution | None = None) -> KvShape:
    """The KV shape of a Hugging Face config.json (its text model), layer by layer; `kv_dtype` 'auto' is the model's
    dtype. What the config leaves to its model type is filled first (`defaults`, see resolve_config; or a
    `resolution` made)."""
    res = resolution or resolve_config(cfg, defaults)
    cfg = res.config
    layers = _layers(cfg)
    name = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")
    dtype, source = _kv_dtype(cfg, kv_dtype)
    windows, kinds, window_notes, assumed = _windows(cfg, layers, "layer_types" in res.filled)
    kinds = kinds or tuple("full" if w is None else "sliding" for w in windows)
    per_layer, layer_notes = _per_layer(cfg, kinds)
    notes = [*res.notes, *_dtype_notes(dtype, kv_dtype), *window_notes, *layer_notes, *_uncounted(cfg, dtype),
             *_not_understood(cfg, kinds)]
    attention, kv_heads, head_dim, rank, rope = _summary(cfg, per_layer)
    positions, positions_source = _max_positions(cfg)
    return KvShape(name, attention, layers, _int(cfg, "num_attention_heads", "n_head"), kv_heads, head_dim, rank,
                   rope, dtype, _element_bytes(dtype), source, per_layer, tuple(notes), res, tuple(assumed),
                   positions, positions_source)


def _dtype_notes(dtype: str, kv_dtype: str) -> list[str]:
    if dtype in ("float32", "float") and kv_dtype == "auto":
        return ["a float32 model: vLLM's --dtype auto serves it in float16, half this cache"]
    return []


def _summary(cfg: dict[str, Any], per_layer: tuple[LayerKv, ...]) -> tuple[
        str, int | None, int | None, int | None, int | None]:
    """The model's attention kind ("GQA+MQA" where its layers differ), and its KV heads and head dim where every
    layer that keeps a cache has the same (None under MLA), or its MLA ranks."""
    kept = [layer for layer in per_layer if layer.kind != "shared"]
    attention = "+".join(dict.fromkeys(layer.attention for layer in kept))
    if cfg.get("kv_lora_rank") is not None:
        return attention, None, None, _int(cfg, "kv_lora_rank"), _int(cfg, "qk_rope_head_dim") or 0
    one = len({(layer.kv_heads, layer.k_dim, layer.v_dim) for layer in kept}) == 1
    return attention, kept[0].kv_heads if one else None, kept[0].k_dim if one else None, None, None


# The keys of a config a layer may have its own value of: on sliding layers the swa_ keys (MiMo-V2, Inkling), on
# full layers Gemma 4's global ones; per_layer_config (transformers 5) gives any layer any of them.
_SWA_KEYS = {"swa_num_attention_heads": "num_attention_heads", "swa_num_key_value_heads": "num_key_value_heads",
             "swa_head_dim": "head_dim", "swa_v_head_dim": "v_head_dim"}
_LAYER_KEYS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "v_head_dim", "sliding_window",
                         "attention_chunk_size", "kv_lora_rank", "qk_rope_head_dim", "hidden_size"})


def _per_layer(cfg: dict[str, Any], kinds: tuple[str, ...]) -> tuple[tuple[LayerKv, ...], list[str]]:
    """Each layer's KV shape: the model's config with what differs on that layer (see _layer_overrides); layers from
    the first that reuses an earlier layer's cache (num_kv_shared_layers) keep none of their own."""
    overrides, notes = _layer_overrides(cfg, kinds)
    first_shared = _first_shared(cfg, len(kinds))
    made: dict[tuple[str, str], LayerKv] = {}  # layers of one kind with the same overrides have the same shape
    out = []
    for i, kind in enumerate(kinds):
        key = ("shared", "") if i >= first_shared else (kind, repr(sorted(overrides[i].items())))
        if key not in made:
            made[key] = LayerKv("shared", None, 0, 0, 0) if i >= first_shared else \
                _layer_kv({**cfg, **overrides[i]}, kind, i)
        out.append(made[key])
    return tuple(out), notes


def _layer_overrides(cfg: dict[str, Any], kinds: tuple[str, ...]) -> tuple[list[dict[str, Any]], list[str]]:
    """What each layer has of its own: the swa_ keys on sliding layers; then per_layer_config's entry for it, or
    where there is no per_layer_config Gemma 4's global keys on full layers (see _global_overrides)."""
    swa = {own: cfg[key] for key, own in _SWA_KEYS.items() if cfg.get(key) is not None}
    full, notes = _global_overrides(cfg)
    if "per_layer_config" in cfg:
        full = {}
    given, unread = _per_layer_config(cfg, len(kinds))
    by_kind = {"sliding": swa, "full": full}
    return [{**by_kind.get(kind, {}), **given.get(i, {})} for i, kind in enumerate(kinds)], notes + unread


def _global_overrides(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Gemma 4's full layers as published: global_head_dim, and num_global_key_value_heads with attention_k_eq_v
    (transformers' Gemma4TextConfig turns them into per_layer_config, and reads them only where it has none)."""
    full: dict[str, Any] = {}
    if cfg.get("global_head_dim") is not None:
        full["head_dim"] = cfg["global_head_dim"]
    if cfg.get("num_global_key_value_heads") is None:
        return full, []
    if not cfg.get("attention_k_eq_v"):
        return full, [f"num_global_key_value_heads {_shown(cfg['num_global_key_value_heads'])} does not apply: "
                      "attention_k_eq_v is off (transformers' Gemma4TextConfig rule)"]
    return {**full, "num_key_value_heads": cfg["num_global_key_value_heads"]}, []


def _per_layer_config(cfg: dict[str, Any], layers: int) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """transformers' per_layer_config: layer number (as text, maybe zero-padded) to the keys that layer overrides,
    and a note naming the overrides dltop does not read that may shape attention (a `skip` among them). A key that
    is not a layer number, or a layer past the last, is a ConfigError."""
    given = cfg.get("per_layer_config")
    if given is None:
        return {}, []
    if not isinstance(given, dict):
        raise ConfigError(f"per_layer_config in the config must map layer numbers to overrides, not {_shown(given)}")
    out: dict[int, dict[str, Any]] = {}
    unread: dict[str, list[int]] = {}
    for key, over in given.items():
        i = _layer_number(key, over, layers)
        for k in over:
            if k not in _LAYER_KEYS and (k == "skip" or _shapes_attention(k, over[k])):
                unread.setdefault(printable(k)[:60], []).append(i)
        out[i] = {k: over[k] for k in _LAYER_KEYS.intersection(over)}
    return out, [f"not understood: per_layer_config gives {k} to layer(s) {layer_ranges(v)}, which dltop does not "
                 "read; if it changes what those layers cache, this size is wrong" for k, v in unread.items()]


def _layer_number(key: str, over: Any, layers: int) -> int:
    """The layer a per_layer_config entry is for; a ConfigError unless the key is a layer number and the value a
    mapping."""
    if not (key.isascii() and key.isdigit() and int(key) < layers) or not isinstance(over, dict):
        raise ConfigError(f"per_layer_config in the config must map layer numbers (0 to {layers - 1}) to "
                          f"overrides, not {_shown(key)}: {_shown(over)}")
    return int(key)


def layer_ranges(layers: list[int]) -> str:
    """Layer numbers as ranges: [0, 1, 2, 5] is "0-2, 5"."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _first_shared(cfg: dict[str, Any], layers: int) -> int:
    """The first layer that reuses an earlier layer's KV cache (Gemma 3n and 4's num_kv_shared_layers: the last
    layers), or `layers` where none does."""
    shared = _int(cfg, "num_kv_shared_layers", minimum=0, maximum=MAX_LAYERS) or 0
    if shared >= layers:
        raise ConfigError(f"num_kv_shared_layers {shared} leaves none of the {layers} layers to keep a cache")
    return layers - shared


def _layer_kv(lc: dict[str, Any], kind: str, i: int) -> LayerKv:
    """Layer i's shape from its own config `lc`: its window, then the MLA latent, or its KV heads and the K and V
    head dims (v_head_dim where V differs from K)."""
    window = _kept(lc, kind, i)
    if lc.get("kv_lora_rank") is not None:
        rank = _int(lc, "kv_lora_rank")
        assert rank is not None
        return LayerKv(kind, window, 1, rank + (_int(lc, "qk_rope_head_dim") or 0), 0)
    heads = _int(lc, "num_attention_heads", "n_head")
    if heads is None:
        raise ConfigError("the config has no num_attention_heads (needed for the KV heads and head_dim)")
    kv_heads = _int(lc, "num_key_value_heads") or heads
    if kv_heads > heads or heads % kv_heads:
        raise ConfigError(f"{kv_heads} KV heads do not divide {heads} attention heads")
    head_dim = _head_dim(lc, heads)
    return LayerKv(kind, window, kv_heads, head_dim, _int(lc, "v_head_dim") or head_dim, heads)


def _kept(lc: dict[str, Any], kind: str, i: int) -> int | None:
    """The tokens layer i of this kind keeps at most: its sliding window or attention chunk; None for all."""
    if kind not in ("sliding", "chunked"):
        return None
    keys = _WINDOW_KEYS if kind == "sliding" else ("attention_chunk_size",)
    window = _int(lc, *keys, minimum=0) or None
    if window is None:
        raise ConfigError(f"layer {i} is a {kind}_attention layer but has no {keys[0]}")
    return window


# What a key of a config must look like to shape attention (and so, maybe, the KV cache).
_SHAPING = re.compile(r"kv|key_value|head_dim|window|layer_types|_pattern|chunk|lora_rank|shared_layers|global_|swa_|"
                      r"attn_layer|attention_layer|attention_type|attn_type|linear_attn|full_attention|local_layer|block_type|"
                      r"mamba|ssm|state_size|nope|interval|compress|index_")
# Keys of that look that dltop reads, or that do not change what the cache holds (rotary, scales, biases, sinks,
# query-only sizes, norms).
_KNOWN = frozenset({
    *FILL_KEYS, *_SWA_KEYS, *_WINDOW_KEYS, "num_global_key_value_heads", "global_head_dim", "attention_k_eq_v",
    "per_layer_config", "hybrid_layer_pattern", "num_kv_shared_layers", "use_sliding_window", "max_window_layers",
    "sliding_window_pattern", "no_rope_layers", "no_rope_layer_interval", "qk_nope_head_dim",
    "swa_rope_theta", "add_swa_attention_sink_bias", "add_full_attention_sink_bias", "swa_attention_sink_bias",
    "global_rope_theta", "rope_local_base_freq", "use_bidirectional_attention", "query_pre_attn_scalar",
    "interleave_moe_layer_step", "decoder_sparse_step", "moe_layer_freq", "first_k_dense_replace",
    "qk_layernorm", "use_qk_norm", "kv_lora_rank", "num_nextn_predict_layers", "mlp_layer_types",
    "_sliding_window_pattern", "qk_head_dim", "activation_sparsity_pattern",
})


def _shapes_attention(key: str, value: Any) -> bool:
    """Whether a config key looks like it shapes attention and dltop does not read it. An unset one (null, false,
    0, empty) shapes nothing."""
    return (key not in _KNOWN and not key.endswith("bias") and value not in (None, False, 0, "", [], {})
            and bool(_SHAPING.search(key)))


def _not_understood(cfg: dict[str, Any], kinds: tuple[str, ...]) -> list[str]:
    """Notes on keys of the config that do not apply (MLA's KV heads, a chunk size with no chunked layer), and one
    naming the keys that look like they shape attention and that dltop does not read."""
    notes = []
    if cfg.get("kv_lora_rank") is not None and cfg.get("num_key_value_heads") is not None:
        notes.append(f"num_key_value_heads {_shown(cfg['num_key_value_heads'])} does not apply under MLA: one "
                     "latent per token per layer, shared by all heads")
    chunk = cfg.get("attention_chunk_size")
    if chunk and "chunked" not in kinds:
        notes.append(f"attention_chunk_size {_shown(chunk)} does not apply: no layer is a chunked_attention layer")
    keys = [k for k, v in cfg.items() if _shapes_attention(k, v)]
    if keys:
        shown = ", ".join(printable(k)[:60] for k in keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
        notes.append(f"not understood: {shown}: these keys look like they shape attention, and dltop does not read "
                     "them; if they change what a layer caches, this size is wrong")
    return notes


# Where a config says the longest sequence its model takes, in the order looked at.
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _max_positions(cfg: dict[str, Any]) -> tuple[int | None, str]:
    """The longest sequence the config gives its model, and the key it came from; None and why where it has none
    (a value that is not a whole number is not one)."""
    for key in _POSITION_KEYS:
        v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_SIZE:
            return v, f"config {key}"
        if v is not None:
            return None, f"config {key} is {_shown(v)}, not a whole number of tokens"
    return None, f"the config has no {' / '.join(_POSITION_KEYS)}"


# -- transformers' own reading, beside dltop's -------------------------------------------------------------------

# transformers' cache layer types (cache_utils.get_layer_types_and_kwargs) as dltop's kinds; "dummy" is its layer
# that keeps nothing (a layer that reuses another's cache).
_LIBRARY_KINDS = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked",
                  "dummy": "shared"}


@dataclass(frozen=True)
class CrossCheck:
    """Where transformers' config class reads a config's layers otherwise than dltop: one line per set of layers."""

    source: str  # "transformers 5.25.0 (Gemma4TextConfig)"
    differences: tuple[str, ...]
    notes: tuple[str, ...] = ()


def cross_check(shape: KvShape) -> CrossCheck | str:
    """transformers' reading of the config this shape came from, layer by layer, beside dltop's: the layer types and
    windows its cache is built with (cache_utils.get_layer_types_and_kwargs), the KV heads and head dims of
    configuration_utils.get_head_shapes, each layer config's v_head_dim. Why there is none, where there is none (no
    config object: transformers not importable or not asked; transformers failing to read its own object)."""
    res = shape.defaults
    if res is None:
        return "no config (the model's numbers were given)"
    if res.library is None:
        return res.library_source or "transformers did not read this config"
    return _compare(shape, res)


def _compare(shape: KvShape, res: Resolution) -> CrossCheck | str:
    try:
        theirs = _library_layers(res.library)
    except Exception as e:  # noqa: BLE001 - transformers' code on a config someone else wrote
        first = printable(str(e)).strip().splitlines()
        return f"{res.library_source} could not give its layers: {type(e).__name__}: {first[0][:120] if first else ''}"
    if len(theirs) != len(shape.per_layer):
        return f"{res.library_source} has {len(theirs)} layers, dltop {len(shape.per_layer)}"
    found: dict[str, list[int]] = {}
    for i, (ours, t) in enumerate(zip(shape.per_layer, theirs, strict=True)):
        found.setdefault(_layer_diff(ours, t), []).append(i)
    found.pop("", None)
    mla = any(layer.attention == "MLA" for layer in shape.per_layer)
    return CrossCheck(res.library_source, tuple(f"layer(s) {layer_ranges(v)}: {k}" for k, v in found.items()),
                      _MLA_NOT_COMPARED if mla else ())


_MLA_NOT_COMPARED = ("MLA layers: their KV heads and head dims are not compared (transformers' cache keeps each "
                     "head's K and V; vLLM and SGLang keep the latent, which is what dltop sizes)",)


def _library_layers(obj: Any) -> list[tuple[str, int | None, int, int, int]]:
    """(kind, window, KV heads, K head dim, V head dim) of each layer of a transformers config object, as
    transformers' own functions give them."""
    from transformers.cache_utils import get_layer_types_and_kwargs
    from transformers.configuration_utils import get_head_shapes

    types, kwargs = get_layer_types_and_kwargs(obj)
    heads, dims = get_head_shapes(obj)
    n = len(types)
    heads = heads if isinstance(heads, list) else [heads] * n
    dims = dims if isinstance(dims, list) else [dims] * n
    layer_configs = obj.per_layer_config
    out = []
    for i, t in enumerate(types):
        v = getattr(layer_configs[i], "v_head_dim", None) or dims[i]
        out.append((_LIBRARY_KINDS.get(t, printable(str(t))), kwargs[i].get("sliding_window"), heads[i], dims[i], v))
    return out


def _layer_diff(ours: LayerKv, theirs: tuple[str, int | None, int, int, int]) -> str:
    """How transformers' reading of a layer differs from dltop's, in words ("" where it does not)."""
    kind, window, kv_heads, k_dim, v_dim = theirs
    if kind != ours.kind:
        return f"its config object reads a {kind} layer (dltop: {ours.kind})"
    pairs = [("window", window, ours.window)]
    if ours.kind != "shared" and ours.attention != "MLA":
        pairs += [("KV heads", kv_heads, ours.kv_heads), ("K head dim", k_dim, ours.k_dim),
                  ("V head dim", v_dim, ours.v_dim)]
    differ = [(what, t, o) for what, t, o in pairs if t != o]
    if not differ:
        return ""
    return (f"its config object reads {', '.join(f'{what} {t}' for what, t, _ in differ)} "
            f"(dltop: {', '.join(f'{what} {o}' for what, _, o in differ)})")


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


def shape_from_flags(layers: int, heads: int, kv_heads: int | None, head_dim: int, dtype: str,
                     source: str) -> KvShape:
    """The KV shape of a model given by its numbers (`dltop kv --layers ... --dtype ...`)."""
    layer = _layer_kv({"num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim}, "full", 0)
    return KvShape("flags", layer.attention, layers, heads, layer.kv_heads, head_dim, None, None, dtype,
                   _element_bytes(dtype), source, (layer,) * layers, max_positions_source="not given (flags)")


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


def shape_dict(shape: KvShape, seq: int | None = None) -> dict[str, Any]:
    """The shape as JSON data; with `seq`, each layer group's bytes of a sequence of that many tokens."""
    kinds = shape.layer_kinds
    window = next((w for w, k in zip(shape.windows, kinds, strict=True) if k == "sliding"), None)
    chunk = next((w for w, k in zip(shape.windows, kinds, strict=True) if k == "chunked"), None)
    groups = shape.groups()
    return {
        "name": shape.name, "attention": shape.attention, "layers": shape.layers, "heads": shape.heads,
        "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "kv_lora_rank": shape.kv_lora_rank,
        "qk_rope_head_dim": shape.qk_rope_head_dim,
        "elements_per_token_layer": _elements(groups),
        "kv_dtype": shape.dtype, "kv_dtype_bytes": shape.dtype_bytes, "kv_dtype_source": shape.dtype_source,
        "sliding_layers": shape.sliding_layers, "sliding_window": window,
        "chunked_layers": shape.chunked_layers, "attention_chunk_size": chunk,
        "shared_layers": kinds.count("shared"),
        "kv_dtype_bits": KV_DTYPE_BITS[shape.dtype],
        "defaults": None if shape.defaults is None or not shape.defaults.source else {
            "source": shape.defaults.source, "filled": shape.defaults.filled},
        "assumptions": list(shape.assumptions),
        "layer_groups": [_group_dict(shape, g, layers, seq) for g, layers in groups],
    }


def _elements(groups: list[tuple[LayerKv, list[int]]]) -> int | None:
    """Elements one token takes in a layer, where every layer that keeps a cache takes the same (else None)."""
    sizes = {g.kv_heads * (g.k_dim + g.v_dim) for g, _ in groups if g.kind != "shared"}
    return sizes.pop() if len(sizes) == 1 else None


def _group_dict(shape: KvShape, g: LayerKv, layers: list[int], seq: int | None) -> dict[str, Any]:
    """One group of layers with the same shape and window, as JSON data (bytes for all of its layers)."""
    per_layer = g.bytes_per_token(shape.dtype)
    d: dict[str, Any] = {
        "layers": layers, "count": len(layers), "kind": g.kind, "window": g.window, "attention": g.attention,
        "heads": g.heads, "kv_heads": g.kv_heads, "k_head_dim": g.k_dim, "v_head_dim": g.v_dim,
        "bytes_per_token_per_layer": per_layer, "bytes_per_token": len(layers) * per_layer,
    }
    if seq is not None:
        d["bytes_per_sequence"] = len(layers) * per_layer * (seq if g.window is None else min(seq, g.window))
    return d


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
