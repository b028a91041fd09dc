"""KV-cache size arithmetic from a Hugging Face model config (or from flags), and the pool a server has left for it.

Pure arithmetic: no GPU, no torch, no network. The formulas and each architecture's rule are in docs/kv.md.
"""

from __future__ import annotations

import json
import math
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
KV_DTYPES = ("auto", "fp16", "bf16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")
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
    dtype_bytes: int
    dtype_source: str
    windows: tuple[int | None, ...]  # per layer: the sliding window in tokens, None for full attention
    notes: tuple[str, ...] = ()

    @property
    def bytes_per_token_layer(self) -> int:
        return self.elements_per_token_layer * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """One token in every layer, as if every layer kept every token (no window)."""
        return self.layers * self.bytes_per_token_layer

    def sequence_bytes(self, tokens: int) -> int:
        """The cache of one sequence of `tokens`: a sliding layer keeps at most its window."""
        return sum(self.bytes_per_token_layer * (tokens if w is None else min(tokens, w)) for w in self.windows)

    @property
    def sliding_layers(self) -> int:
        return sum(w is not None for w in self.windows)


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


def _windows(cfg: dict[str, Any], layers: int) -> tuple[tuple[int | None, ...], list[str]]:
    """Each layer's sliding window (None = full attention), by the rules of docs/kv.md, and notes on the choice."""
    window = _int(cfg, "sliding_window")
    full: tuple[int | None, ...] = (None,) * layers
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ConfigError(f"layer_types in the config must list one type for each of the {layers} layers")
        out: list[int | None] = []
        for t in types:
            if t == "full_attention":
                out.append(None)
            elif t == "sliding_attention":
                if window is None:
                    raise ConfigError("layer_types has sliding_attention layers but the config has no sliding_window")
                out.append(window)
            else:
                raise ConfigError(f"layer type {_shown(t)} is not one this planner can size "
                                  "(it knows full_attention and sliding_attention)")
        return tuple(out), []
    if window is None:
        return full, []
    model_type = str(cfg.get("model_type", ""))
    if "use_sliding_window" in cfg or model_type.startswith(("qwen2", "qwen3")):
        if not cfg.get("use_sliding_window"):
            return full, [f"sliding_window {window} does not apply: use_sliding_window is off"]
        first = _int(cfg, "max_window_layers", minimum=0) or 0
        return tuple(window if i >= first else None for i in range(layers)), []
    pattern = _int(cfg, "sliding_window_pattern")
    if pattern is None and model_type == "gemma2":
        pattern = 2  # Gemma 2 alternates in its modelling code, with no key in the config
    if pattern is not None:
        return tuple(window if (i + 1) % pattern else None for i in range(layers)), []
    return (window,) * layers, []


def shape_from_config(cfg: dict[str, Any], kv_dtype: str = "auto", name: str = "") -> KvShape:
    """The KV shape of a Hugging Face config.json (its text model); `kv_dtype` 'auto' is the model's dtype."""
    cfg = text_config(cfg)
    notes: list[str] = []
    layers = _layers(cfg)
    name = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")
    heads = _int(cfg, "num_attention_heads", "n_head")
    dtype, source = _kv_dtype(cfg, kv_dtype)
    if dtype in ("float32", "float") and kv_dtype == "auto":
        notes.append("a float32 model: vLLM's --dtype auto serves it in float16, half this cache")
    windows, window_notes = _windows(cfg, layers)
    notes += window_notes
    mtp = _int(cfg, "num_nextn_predict_layers", minimum=0)
    if mtp:
        notes.append(f"the {mtp} multi-token-prediction layer(s) are not counted (they cache only when used "
                     "for speculative decoding)")
    rank = cfg.get("kv_lora_rank")
    if rank is not None:
        rank = _int(cfg, "kv_lora_rank")
        rope = _int(cfg, "qk_rope_head_dim") or 0
        assert rank is not None
        if cfg.get("num_key_value_heads") is not None:
            notes.append(f"num_key_value_heads {_shown(cfg['num_key_value_heads'])} does not apply under MLA: one latent "
                         "per token per layer, shared by all heads")
        return KvShape(name, "MLA", layers, heads, None, None, rank, rope, rank + rope, dtype, DTYPE_BYTES[dtype],
                       source, windows, tuple(notes))
    if heads is None:
        raise ConfigError("the config has no num_attention_heads (needed for the KV heads and head_dim)")
    kv_heads = _int(cfg, "num_key_value_heads") or heads
    head_dim = _int(cfg, "head_dim")
    if head_dim is None:
        hidden = _int(cfg, "hidden_size", "n_embd", required="head_dim nor hidden_size")
        assert hidden is not None
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}: "
                              "the config needs an explicit head_dim")
        head_dim = hidden // heads
    return _gqa(name, layers, heads, kv_heads, head_dim, dtype, source, windows, notes)


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
                   DTYPE_BYTES[dtype], source, windows, tuple(notes))


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


def parameter_count(cfg: dict[str, Any]) -> ParamCount:
    """The parameters of a standard decoder-only model from its config: embeddings, attention (MHA/GQA/MLA), MLP
    (dense, or MoE with routed and shared experts), norms, and lm_head unless tied. A ConfigError if a size is
    missing."""
    cfg = text_config(cfg)
    notes: list[str] = []
    model_type = str(cfg.get("model_type", ""))
    layers = _layers(cfg)
    hidden = _int(cfg, "hidden_size", "n_embd", required="hidden_size")
    vocab = _int(cfg, "vocab_size", required="vocab_size")
    heads = _int(cfg, "num_attention_heads", "n_head", required="num_attention_heads")
    assert layers is not None and hidden is not None and vocab is not None and heads is not None
    # Attention, per layer.
    if cfg.get("kv_lora_rank") is not None:
        rank = _int(cfg, "kv_lora_rank") or 0
        rope = _int(cfg, "qk_rope_head_dim") or 0
        nope = _int(cfg, "qk_nope_head_dim") or 0
        v_dim = _int(cfg, "v_head_dim", required="v_head_dim (MLA)") or 0
        q_rank = _int(cfg, "q_lora_rank")
        q_out = heads * (nope + rope)
        q = hidden * q_rank + q_rank + q_rank * q_out if q_rank else hidden * q_out  # + q_a_layernorm
        attn = q + hidden * (rank + rope) + rank + rank * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
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
    # MLP, per layer kind.
    experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts")
    inter = _int(cfg, "intermediate_size")
    mlp_bias = bool(cfg.get("mlp_bias"))
    dense = 3 * hidden * inter + (2 * inter + hidden if mlp_bias else 0) if inter else None
    moe = None
    if experts:
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
    mlp = 0
    for i in range(layers):
        if moe is not None and _moe_layer(cfg, i):
            mlp += moe
        elif dense is not None:
            mlp += dense
        else:
            raise ConfigError("the config has no intermediate_size for its dense layers")
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


@dataclass(frozen=True)
class Weights:
    """The bytes the weights take, and where that number came from."""

    bytes: int
    source: str
    parameters: int | None = None
    dtype: str | None = None
    notes: tuple[str, ...] = ()


def estimate_weights(cfg: dict[str, Any], weights_dtype: str | None) -> Weights:
    """Parameter count × dtype bytes, with notes that say what the estimate assumes."""
    count = parameter_count(cfg)
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
    window = next((w for w in shape.windows if w is not None), None)
    return {
        "name": shape.name, "attention": shape.attention, "layers": shape.layers, "heads": shape.heads,
        "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "kv_lora_rank": shape.kv_lora_rank,
        "qk_rope_head_dim": shape.qk_rope_head_dim, "elements_per_token_layer": shape.elements_per_token_layer,
        "kv_dtype": shape.dtype, "kv_dtype_bytes": shape.dtype_bytes, "kv_dtype_source": shape.dtype_source,
        "sliding_layers": shape.sliding_layers, "sliding_window": window,
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
