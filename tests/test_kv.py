"""`dltop kv`: KV-cache bytes and the KV pool, checked against the classic LLaMA-7B numbers, the real configs in
../shared/fixtures/hf-configs (bytes per token computed here from each architecture's definition, and the
fixtures README's own table), published parameter counts, and one-line errors from a real `dltop` process."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dltop import kv
from dltop.fmt import parse_bytes
from tests.conftest import SHARED_FIXTURES
from tests.test_cli import dltop

CONFIGS = SHARED_FIXTURES / "hf-configs"
needs_configs = pytest.mark.skipif(not CONFIGS.is_dir(), reason=f"HF config fixtures not found at {CONFIGS}")
MODELS = ["Llama-2-7b-hf", "Meta-Llama-3.1-8B", "Qwen2.5-7B", "DeepSeek-V3", "gpt-oss-20b"]
# Published total parameter counts, to the digits the publisher gives (DeepSeek-V3: the 671 B main model, the
# 14 B multi-token-prediction module apart; gpt-oss-20b: OpenAI's model card, 20.91 B).
PUBLISHED_PARAMS = {"Llama-2-7b-hf": "6.74", "Meta-Llama-3.1-8B": "8.03", "Qwen2.5-7B": "7.62",
                    "DeepSeek-V3": "671", "gpt-oss-20b": "20.9"}
LLAMA_7B = ["--layers", "32", "--heads", "32", "--head-dim", "128", "--dtype", "fp16"]


def kv_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    # dltop's table fills a config's defaults here (transformers takes seconds to import on a busy node); the
    # tests below check that the table and transformers agree, and run the default path too.
    table = ["--defaults", "table"] if "--config" in args and "--defaults" not in args else []
    r = dltop("kv", "--json", *args, *table, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_classic_llama_7b_numbers() -> None:
    one = kv_json(*LLAMA_7B, "--seq", "2048")
    assert one["bytes_per_token"] == 2 * 32 * 32 * 128 * 2
    assert one["total_bytes"] == 1_073_741_824
    r = dltop("kv", *LLAMA_7B, "--seq", "2048", "--batch", "16")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^KV cache +17,179,869,184 B \(16\.00 GiB\) for 16 × 2,048 = 32,768 tokens$", r.stdout, re.M)
    assert kv_json(*LLAMA_7B, "--seq", "2048", "--batch", "16")["total_bytes"] == 17_179_869_184


def test_kv_dtype_and_gqa_flags() -> None:
    fp8 = kv_json(*LLAMA_7B, "--seq", "2048", "--kv-dtype", "fp8")
    assert fp8["total_bytes"] == 1_073_741_824 // 2 and fp8["model"]["kv_dtype_source"] == "--kv-dtype"
    gqa = kv_json(*LLAMA_7B, "--kv-heads", "8", "--seq", "1000", "--kv-dtype", "fp32")
    assert gqa["bytes_per_token"] == 2 * 32 * 8 * 128 * 4 and gqa["model"]["attention"] == "GQA"
    assert gqa["total_bytes"] == 1000 * gqa["bytes_per_token"]


def _definition_bytes_per_token(cfg: dict[str, Any]) -> int:
    """Bytes per token (every layer keeping it) from the architecture's definition, 2 bytes per element."""
    layers = cfg["num_hidden_layers"]
    if cfg.get("kv_lora_rank"):  # MLA: one latent of kv_lora_rank plus the shared RoPE key, per layer
        return layers * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * layers * (cfg.get("num_key_value_heads") or heads) * head_dim * 2


def _readme_table() -> dict[str, tuple[int, int]]:
    """The fixtures README's 'per token' and '2048 tokens, batch 1' columns."""
    out = {}
    for line in (CONFIGS / "README.md").read_text().splitlines():
        m = re.match(r"\|\s*([\w.-]+)[^|]*\|\s*([\d,]+)[^|]*\|\s*([\d,]+)", line)
        if m:
            out[m.group(1)] = (int(m.group(2).replace(",", "")), int(m.group(3).replace(",", "")))
    return out


@needs_configs
@pytest.mark.parametrize("model", MODELS)
def test_real_configs(model: str) -> None:
    path = CONFIGS / f"{model}.config.json"
    cfg = json.loads(path.read_text())
    d = kv_json("--config", str(path), "--seq", "2048")
    assert d["bytes_per_token"] == _definition_bytes_per_token(cfg)
    sliding = [t == "sliding_attention" for t in cfg.get("layer_types", [])]
    per_layer = d["bytes_per_token"] // cfg["num_hidden_layers"]
    window = cfg.get("sliding_window") or 0
    expected_seq = sum(per_layer * (min(2048, window) if s else 2048) for s in sliding) if sliding \
        else 2048 * d["bytes_per_token"]
    assert d["total_bytes"] == d["bytes_per_sequence"] == expected_seq
    assert _readme_table()[model] == (d["bytes_per_token"], d["total_bytes"])
    # The parameter count, against the published one to the digits published.
    published = PUBLISHED_PARAMS[model]
    digits = len(published.split(".")[1]) if "." in published else 0
    params = d["weights"]["parameters"]
    assert round(params / 1e9, digits) == float(published), params
    assert "estimate" in d["weights"]["source"] and d["weights"]["bytes"] == params * 2


@needs_configs
def test_config_quirks_are_named() -> None:
    ds = kv_json("--config", str(CONFIGS / "DeepSeek-V3.config.json"), "--seq", "16")
    assert ds["model"]["attention"] == "MLA" and ds["model"]["kv_heads"] is None
    assert any("does not apply under MLA" in n for n in ds["notes"])
    assert any("quantized (fp8)" in n and "--weights-dtype" in n for n in ds["weights"]["notes"])
    oss = kv_json("--config", str(CONFIGS / "gpt-oss-20b.config.json"), "--seq", "16")
    assert oss["model"]["kv_dtype"] == "bfloat16" and "no torch_dtype" in oss["model"]["kv_dtype_source"]
    assert oss["model"]["sliding_layers"] == 12 and oss["model"]["sliding_window"] == 128
    assert any("mxfp4" in n for n in oss["weights"]["notes"])
    qwen = kv_json("--config", str(CONFIGS / "Qwen2.5-7B.config.json"), "--seq", "200000")
    assert qwen["model"]["sliding_layers"] == 0 and qwen["total_bytes"] == 200000 * qwen["bytes_per_token"]
    fp8 = kv_json("--config", str(CONFIGS / "DeepSeek-V3.config.json"), "--seq", "16", "--weights-dtype", "fp8")
    assert fp8["weights"]["bytes"] == fp8["weights"]["parameters"]


@needs_configs
def test_pool_plan(tmp_path: Path) -> None:
    path = str(CONFIGS / "Meta-Llama-3.1-8B.config.json")
    d = kv_json("--config", path, "--seq", "8192", "--gpu-mem", "80GiB", "--weights-bytes", "16GB",
                "--overhead-bytes", "2GiB", "--gpu-memory-utilization", "0.85")
    p = d["pool"]
    budget = math.floor(80 * 2**30 * 0.85)
    assert p["budget_bytes"] == budget and p["weights_bytes"] == 16 * 10**9 and p["overhead_bytes"] == 2 * 2**30
    assert p["pool_bytes"] == budget - 16 * 10**9 - 2 * 2**30 and p["upper_bound"] is False
    assert p["pool_tokens"] == p["pool_bytes"] // (2 * 32 * 8 * 128 * 2)
    assert p["max_sequences"] == p["pool_bytes"] // (8192 * 2 * 32 * 8 * 128 * 2)
    # The default: the weights estimated from the config, no overhead subtracted, and the pool says it is a bound.
    d = kv_json("--config", path, "--seq", "8192", "--gpu-mem", "85899345920")
    assert d["pool"]["weights_bytes"] == d["weights"]["bytes"] == 8_030_261_248 * 2
    assert d["pool"]["upper_bound"] is True and "not subtracted" in d["pool"]["overhead_source"]
    r = dltop("kv", "--config", path, "--seq", "8192", "--gpu-mem", "16GiB", "--defaults", "table")
    assert r.returncode == 0 and "KV pool      none: weights and overhead exceed the budget by" in r.stdout
    # A text config nested in a multimodal wrapper sizes the same as the bare one.
    wrapped = tmp_path / "config.json"
    inner = json.loads(Path(path).read_text())
    wrapped.write_text(json.dumps({"model_type": "llava", "text_config": inner, "vision_config": {"hidden_size": 1}}))
    assert kv_json("--config", str(wrapped), "--seq", "8192")["total_bytes"] == d["total_bytes"]


def _base(**extra: Any) -> dict[str, Any]:
    return {"num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 1024,
            "torch_dtype": "float16", **extra}


@pytest.mark.parametrize("extra, sliding", [
    ({"sliding_window": 64}, list(range(12))),  # Mistral: every layer
    ({"sliding_window": 64, "use_sliding_window": False}, []),
    ({"sliding_window": 64, "model_type": "qwen2"}, []),  # Qwen2 defaults to off
    ({"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 8}, [8, 9, 10, 11]),
    ({"sliding_window": 64, "sliding_window_pattern": 6}, [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]),  # Gemma 3
    ({"sliding_window": 64, "model_type": "gemma2", "head_dim": 128}, [0, 2, 4, 6, 8, 10]),
    ({"sliding_window": 64, "layer_types": ["full_attention"] * 11 + ["sliding_attention"]}, [11]),
    ({"sliding_window": None}, []),
])
def test_sliding_window_rules(extra: dict[str, Any], sliding: list[int]) -> None:
    shape = kv.shape_from_config(_base(**extra))
    assert [i for i, w in enumerate(shape.windows) if w is not None] == sliding
    per_layer = 2 * 2 * 128 * 2
    assert shape.sequence_bytes(1000) == per_layer * (1000 * (12 - len(sliding)) + 64 * len(sliding))


@pytest.mark.parametrize("args, code, pattern", [
    (["--config", "/nonexistent/config.json"], 1, r"^dltop: cannot read config /nonexistent/config.json: "),
    (["--config", "{notjson}"], 1, r"^dltop: .*: not JSON \("),
    (["--config", "{list}"], 1, r"^dltop: .*: not a model config \(a JSON list"),
    (["--config", "{nolayers}"], 1, r"^dltop: the config has no layer count \(num_hidden_layers"),
    ([*LLAMA_7B, "--batch", "0"], 2, r"^dltop kv: error: argument --batch: must be 1 or more: '0'"),
    ([*LLAMA_7B, "--batch", "-3"], 2, r"^dltop kv: error: argument --batch: must be 1 or more: '-3'"),
    ([*LLAMA_7B, "--kv-dtype", "fp2"], 2, r"^dltop kv: error: argument --kv-dtype: invalid choice: 'fp2'"),
    ([*LLAMA_7B, "--gpu-mem", "80G"], 2, r"^dltop kv: error: argument --gpu-mem: ambiguous size '80G'"),
    (["--layers", "32", "--heads", "32", "--head-dim", "128"], 2, r"^dltop: kv: give --dtype"),
    (["--layers", "32"], 2, r"^dltop: kv: give --config FILE, or the model's numbers \(missing --heads, --head-dim\)"),
    (["--config", "{nolayers}", "--layers", "3"], 2, r"^dltop: kv: --layers cannot be combined with --config"),
])
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], code: int, pattern: str) -> None:
    files = {"{notjson}": "{\"num_hidden_layers\": 3,", "{list}": "[1, 2]", "{nolayers}": '{"hidden_size": 64}'}
    real = []
    for a in args:
        if a in files:
            (tmp_path / "c.json").write_text(files[a])
            a = str(tmp_path / "c.json")
        real.append(a)
    seq = [] if "--seq" in real else ["--seq", "10"]
    r = dltop("kv", *real, *seq)
    assert r.returncode == code, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert re.search(pattern, r.stderr), r.stderr


def test_parse_bytes_examples() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30 and parse_bytes("80 GB") == 80 * 10**9
    assert parse_bytes("1.5MiB") == 1536 * 1024 and parse_bytes("4_096") == 4096 and parse_bytes("7b") == 7
    for bad in ("80G", "GiB", "-1GiB", "1e999GiB", "nan", "12 parsecs"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


@given(st.integers(min_value=0, max_value=2**62), st.sampled_from(["", "B", "KiB", "MiB", "GiB", "TiB", "KB", "GB"]))
def test_parse_bytes_round_trip(n: int, unit: str) -> None:
    scale = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "KB": 1000, "GB": 10**9}
    assert parse_bytes(f"{n}{unit}") == n * scale[unit]
    assert parse_bytes(f"{n:,} {unit.lower()}") == n * scale[unit]


@given(st.text(max_size=30))
def test_parse_bytes_never_crashes(text: str) -> None:
    with contextlib.suppress(ValueError):
        assert parse_bytes(text) >= 0


def _one_line(text: str) -> bool:
    return "\n" not in text.strip() and not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text.strip())


KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "vocab_size",
        "intermediate_size", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
        "sliding_window", "layer_types", "use_sliding_window", "max_window_layers", "sliding_window_pattern",
        "torch_dtype", "n_routed_experts", "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
        "mlp_only_layers", "decoder_sparse_step", "n_shared_experts", "model_type", "text_config",
        "tie_word_embeddings", "attention_bias", "quantization_config", "attention_chunk_size", "no_rope_layers",
        "no_rope_layer_interval", "per_layer_config", "hybrid_layer_pattern", "swa_num_key_value_heads",
        "swa_head_dim", "swa_v_head_dim", "swa_num_attention_heads", "global_head_dim", "num_global_key_value_heads",
        "attention_k_eq_v", "num_kv_shared_layers", "sliding_window_size", "max_position_embeddings", "0", "1"]
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 300) | st.integers() | st.floats() | st.text(max_size=8)
                    | st.sampled_from(["float16", "bfloat16", "sliding_attention", "full_attention", "chunked_attention",
                                     "gemma2", "gemma3_text", "gemma3", "mistral", "qwen2", "qwen3", "llama4_text",
                                     "llama4", "gpt_oss", "deepseek_v3", "gemma4_text", "mimo_v2_flash"]),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner),
                    max_leaves=12)


def test_any_config_gives_a_size_or_a_config_error() -> None:
    # A config is text someone else wrote: whatever it holds, the answer is a size or a ConfigError, never a crash.
    tried: list[int] = []

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.dictionaries(st.sampled_from(KEYS), JSON))
    def one(cfg: dict[str, Any]) -> None:
        tried.append(1)
        for defaults in ("table", "auto"):  # auto: through transformers' config classes where importable
            try:
                shape = kv.shape_from_config(cfg, defaults=defaults)
                assert shape.bytes_per_token > 0 and shape.sequence_bytes(100) <= 100 * shape.bytes_per_token
                assert all(_one_line(n) for n in (*shape.notes, *shape.assumptions))
                check = kv.cross_check(shape)  # transformers' reading of what someone else wrote, beside dltop's
                lines = [check] if isinstance(check, str) else [check.source, *check.differences, *check.notes]
                assert all(_one_line(n) for n in lines), lines
            except kv.ConfigError as e:
                assert _one_line(str(e)) and len(str(e)) < 400, str(e)
            with contextlib.suppress(kv.ConfigError):
                assert kv.parameter_count(cfg, defaults).total > 0

    one()
    print(f"kv: {len(tried)} generated configs read, each with dltop's table and with transformers")
    assert len(tried) >= 200


SCENARIOS = Path(__file__).parent / "data" / "gpu-scenarios"


def _on(name: str) -> dict[str, str]:
    return {"DLTOP_FAKE_NVML": str(SCENARIOS / f"{name}.json")}


def test_pool_of_a_gpu_dltop_sees() -> None:
    """--gpu N, or no --gpu-mem on a machine with one GPU, takes the GPU's memory total from the GPU source."""
    h100 = json.loads((SCENARIOS / "h100-2proc.json").read_text())["gpus"][0]
    args = [*LLAMA_7B, "--seq", "2048", "--weights-bytes", "14GB", "--json"]
    for extra in ([], ["--gpu", "0"]):
        r = dltop("kv", *args, *extra, env=_on("h100-2proc"))
        assert r.returncode == 0, r.stderr
        p = json.loads(r.stdout)["pool"]
        assert p["gpu_mem_bytes"] == h100["memory"]["total"]
        assert p["gpu_mem_source"] == f"GPU 0 ({h100['name']}, {h100['uuid']}): NVML's memory total"
        assert p["budget_bytes"] == math.floor(h100["memory"]["total"] * 0.9)
    two = json.loads((SCENARIOS / "two-gpus.json").read_text())["gpus"]
    r = dltop("kv", *args, "--gpu", "1", env=_on("two-gpus"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pool"]["gpu_mem_bytes"] == two[1]["memory"]["total"]
    # Two GPUs and no choice: no pool, and the reason says what to do (the size itself still prints).
    r = dltop("kv", *args, env=_on("two-gpus"))
    d = json.loads(r.stdout)
    assert r.returncode == 0 and d["pool"] == {"unavailable": "no --gpu-mem given, and NVML sees 2 GPUs: pick one "
                                                              "with --gpu N"}
    assert d["total_bytes"] == 1_073_741_824
    # Text output names the GPU; --gpu-mem still wins when given, and names itself.
    r = dltop("kv", *LLAMA_7B, "--seq", "2048", "--weights-bytes", "14GB", "--gpu", "0", env=_on("h100-2proc"))
    assert re.search(rf"^GPU memory +{h100['memory']['total']:,} B \(79\.65 GiB\): GPU 0 \(NVIDIA H100", r.stdout, re.M)
    assert kv_json(*LLAMA_7B, "--seq", "2048", "--gpu-mem", "80GiB", "--weights-bytes", "1GB")["pool"]["gpu_mem_source"] == "--gpu-mem"


def test_pool_of_a_unified_memory_gpu_is_system_memory_and_says_so() -> None:
    r = dltop("kv", *LLAMA_7B, "--seq", "2048", "--weights-bytes", "14GB", "--gpu", "0", "--json",
              env=_on("gb10-unified"))
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["pool"]
    with open("/proc/meminfo") as f:
        total = int(next(line.split()[1] for line in f if line.startswith("MemTotal:"))) * 1024
    assert p["gpu_mem_bytes"] == total and "system memory total (unified memory" in p["gpu_mem_source"]


@pytest.mark.parametrize("scenario, args, code, pattern", [
    ("library-not-found", ["--gpu", "0"], 1,
     r"^dltop: kv: --gpu 0: NVML cannot be used: NVML library \(libnvidia-ml\.so\.1\) not found: .*"
     r"\(NVML_ERROR_LIBRARY_NOT_FOUND\); pass --gpu-mem SIZE instead$"),
    ("driver-not-loaded", ["--gpu", "0"], 1, r"NVML_ERROR_DRIVER_NOT_LOADED\); pass --gpu-mem SIZE instead$"),
    ("no-gpus", ["--gpu", "0"], 1, r"^dltop: kv: --gpu 0: NVML cannot be used: no GPUs: .*pass --gpu-mem"),
    ("two-gpus", ["--gpu", "2"], 2, r"^dltop: kv: --gpu 2: NVML sees 2 GPUs \(0 to 1\)$"),
    ("gpu-lost", ["--gpu", "1"], 1, r"^dltop: kv: --gpu 1: GPU 1 .* has no memory total: GPU is lost.*"
                                    r"NVML_ERROR_GPU_IS_LOST\); pass --gpu-mem SIZE instead$"),
    ("h100-2proc", ["--gpu", "0", "--gpu-mem", "80GiB"], 2, r"^dltop: kv: give --gpu N or --gpu-mem SIZE, not both$"),
    ("h100-2proc", ["--gpu", "-1"], 2, r"^dltop kv: error: argument --gpu: must be 0 or more: '-1'"),
])
def test_gpu_that_cannot_be_read_is_one_line(scenario: str, args: list[str], code: int, pattern: str) -> None:
    r = dltop("kv", *LLAMA_7B, "--seq", "2048", "--weights-bytes", "14GB", *args, env=_on(scenario))
    assert r.returncode == code, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert re.search(pattern, r.stderr.strip()), r.stderr


# -- a config.json from elsewhere: never a traceback ------------------------------------------------------------------

LLAMA = '{"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "torch_dtype": "float16"}'


@pytest.mark.parametrize("text, words", [
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested deeper than"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
    (LLAMA.replace("32,", "1" + "0" * 5000 + ",", 1), "Exceeds the limit (4300 digits)"),
    (LLAMA.replace("32,", "NaN,", 1), "num_hidden_layers in the config must be a whole number from 1 to 4,096, not NaN"),
    (LLAMA.replace("32,", "Infinity,", 1), "not Infinity"),
    (LLAMA.replace("32,", "32.0,", 1), "not 32.0"),
    (LLAMA.replace("32,", "-32,", 1), "not -32"),
    (LLAMA.replace("32,", "true,", 1), "not true"),
    (LLAMA.replace("32,", "1000000000000,", 1), "not 1000000000000"),
    (LLAMA.replace("4096", "1" + "0" * 100), "hidden_size in the config must be a whole number"),
    (LLAMA.replace('"float16"', '"\\u001b[2J' + "x" * 500 + '"'), "\\u001b[2Jxxx"),
    (LLAMA.replace('"float16"', "[" * 50 + "]" * 50), "torch_dtype [[[[[[[[["),
    (LLAMA[:-1] + ', "sliding_window": 1e400}', "sliding_window in the config must be a whole number"),
    (LLAMA[:-1] + ', "num_key_value_heads": 1.5}', "not 1.5"),
], ids=["deep-object", "deep-list", "5000-digits", "nan", "infinity", "float", "negative", "bool", "many-layers",
        "huge-hidden", "controls", "nested-dtype", "1e400", "half-head"])
def test_a_hostile_config_is_a_config_error_in_one_line(tmp_path: Path, text: str, words: str) -> None:
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(kv.ConfigError) as e:
        cfg = kv.load_config(str(tmp_path / "config.json"))
        kv.shape_from_config(cfg)
    assert words in str(e.value) and _one_line(str(e.value)) and len(str(e.value)) < 300, str(e.value)


def test_a_config_that_is_not_utf8_or_too_big_is_refused(tmp_path: Path) -> None:
    data = LLAMA.replace("float16", "fl\xf6at16").encode("latin-1")
    (tmp_path / "config.json").write_bytes(data)
    with pytest.raises(kv.ConfigError, match=rf"not UTF-8 text: byte {data.index(0xF6)}\)$"):
        kv.load_config(str(tmp_path / "config.json"))
    (tmp_path / "config.json").write_bytes(b" " * kv.MAX_CONFIG_BYTES + LLAMA.encode())
    with pytest.raises(kv.ConfigError, match=f"over {kv.MAX_CONFIG_BYTES:,} bytes"):
        kv.load_config(str(tmp_path / "config.json"))


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,
    LLAMA.replace("32,", "1" + "0" * 5000 + ",", 1),
    LLAMA.replace("32,", "10000000000000000,", 1),
    LLAMA.replace('"float16"', "NaN"),
], ids=["deep", "huge-int", "many-layers", "nan-dtype"])
def test_dltop_kv_exits_1_with_one_line(tmp_path: Path, text: str) -> None:
    (tmp_path / "config.json").write_text(text)
    r = dltop("kv", "--config", str(tmp_path / "config.json"), "--seq", "10")
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr.startswith("dltop: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_text_from_the_config_is_shown_escaped(tmp_path: Path) -> None:
    cfg = json.loads(LLAMA) | {"_name_or_path": "evil\x1b]0;owned\x07\u202e", "quantization_config":
                               {"quant_method": "q\x1b[31m"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = dltop("kv", "--config", str(tmp_path / "config.json"), "--seq", "10")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout and "evil\\x1b]0;owned\\x07\\u202e" in r.stdout
    j = kv_json("--config", str(tmp_path / "config.json"), "--seq", "10")
    assert j["model"]["name"] == cfg["_name_or_path"]  # JSON keeps it exact


def _check_config(tmp: Path, data: bytes) -> None:
    (tmp / "config.json").write_bytes(data)
    try:
        cfg = kv.load_config(str(tmp / "config.json"))
    except kv.ConfigError as e:
        assert _one_line(str(e)) and len(str(e)) < 400, str(e)
        return
    for defaults in ("table", "auto"):  # auto: through transformers' config classes where importable
        try:
            shape = kv.shape_from_config(cfg, defaults=defaults)
            assert shape.bytes_per_token > 0
            kv.estimate_weights(cfg, None, defaults)
        except kv.ConfigError as e:
            assert _one_line(str(e)) and len(str(e)) < 400, str(e)


HOSTILE = [b"NaN", b"Infinity", b"-Infinity", b"-1", b"0", b"1.5", b"32.0", b"true", b"null", b'"x"', b"[]", b"{}",
           b"1" + b"0" * 5000, b"1" + b"0" * 30, b"1e400", b"[" * 3000 + b"]" * 3000, b'"\\ud800"']


@needs_configs
def test_fuzz_mutated_real_configs_never_raise(tmp_path: Path) -> None:
    real = [(CONFIGS / f"{m}.config.json").read_bytes() for m in MODELS]
    tried: list[int] = []

    @settings(max_examples=400, deadline=None, derandomize=True, database=None)
    @given(st.sampled_from(range(len(real))), st.sampled_from(["truncate", "flip", "value", "insert"]),
           st.floats(0, 1, exclude_max=True), st.one_of(st.sampled_from(HOSTILE), st.binary(max_size=12)))
    def one(which: int, how: str, at: float, extra: bytes) -> None:
        tried.append(1)
        data = real[which]
        i = int(at * len(data))
        if how == "truncate":
            data = data[:i]
        elif how == "flip":
            data = data[:i] + bytes([data[i] ^ (1 << (i % 8))]) + data[i + 1:]
        elif how == "insert":
            data = data[:i] + extra + data[i:]
        else:  # the value of one key (a number, a string, a list) swapped for a hostile one
            values = list(re.finditer(rb'(?<=": )(-?[0-9.eE+]+|"[^"]*"|true|false|null)', data))
            if values:
                m = values[int(at * len(values))]
                data = data[:m.start()] + extra + data[m.end():]
        _check_config(tmp_path, data)

    one()
    print(f"kv: {len(tried)} mutated real configs read, each with dltop's table and with transformers")
    assert len(tried) >= 300


# -- what a config leaves to its model type: transformers' config classes are the oracle -------------------------

# The text models of two published Gemma 3 configs (google/gemma-3-27b-it, google/gemma-3-4b-it), as the Hub has them:
# the 27B has sliding_window but no sliding_window_pattern or layer_types; the 4B has no heads nor head_dim.
GEMMA3_27B = {"model_type": "gemma3", "torch_dtype": "bfloat16", "text_config": {
    "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27}}
GEMMA3_4B = {"model_type": "gemma3", "torch_dtype": "bfloat16", "text_config": {
    "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27}}
# Each family of dltop's table, as a config that leaves (nearly) everything to its defaults, and as one that sets
# the keys its layer rule reads.
FAMILY_CONFIGS = {
    "gemma2": [{"num_hidden_layers": 26}, {"num_hidden_layers": 10, "sliding_window": 512, "head_dim": 128}],
    "gemma3_text": [{"num_hidden_layers": 34}, {"num_hidden_layers": 12, "sliding_window_pattern": 3}],
    "gemma3": [GEMMA3_27B, GEMMA3_4B],
    "mistral": [{"num_hidden_layers": 32}, {"num_hidden_layers": 8, "sliding_window": None, "hidden_size": 2048}],
    "mixtral": [{"num_hidden_layers": 32}, {"num_hidden_layers": 4, "sliding_window": 4096}],
    "qwen2": [{"num_hidden_layers": 32}, {"num_hidden_layers": 12, "use_sliding_window": True, "max_window_layers": 8,
                                          "sliding_window": 64}, {"num_hidden_layers": 30, "use_sliding_window": True}],
    "qwen3": [{"num_hidden_layers": 36}, {"num_hidden_layers": 40, "use_sliding_window": True,
                                          "num_attention_heads": 16, "num_key_value_heads": 8}],
    "llama4_text": [{"num_hidden_layers": 48}, {"num_hidden_layers": 10, "no_rope_layer_interval": 5},
                    {"num_hidden_layers": 4, "attention_chunk_size": None}],
    "llama4": [{"text_config": {"model_type": "llama4_text", "num_hidden_layers": 48}}],
    "gpt_oss": [{"num_hidden_layers": 24}, {"num_hidden_layers": 36, "sliding_window": 256}],
    "deepseek_v2": [{"num_hidden_layers": 27, "q_lora_rank": None}],
    "deepseek_v3": [{"num_hidden_layers": 61}],
}
FAMILY_CASES = [(f, i) for f, cases in FAMILY_CONFIGS.items() for i in range(len(cases))]


def _family_config(family: str, i: int) -> dict[str, Any]:
    cfg = dict(FAMILY_CONFIGS[family][i])
    return cfg if "model_type" in cfg else {"model_type": family, "torch_dtype": "bfloat16", **cfg}


def _oracle(cfg: dict[str, Any], seq: int) -> tuple[int, int]:
    """(bytes per token, bytes of a sequence of `seq` tokens) from transformers' own config object, 2 B per element."""
    transformers = pytest.importorskip("transformers")
    inner = cfg.get("text_config", cfg)
    text = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    text = text.get_text_config() if "text_config" in cfg else text
    assert text.model_type == inner.get("model_type", text.model_type)
    layers = text.num_hidden_layers
    if getattr(text, "kv_lora_rank", None):
        per_layer = (text.kv_lora_rank + text.qk_rope_head_dim) * 2
    else:
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        per_layer = 2 * text.num_key_value_heads * head_dim * 2
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None) or ["sliding_attention" if window else "full_attention"] * layers
    keep = {"full_attention": seq, "sliding_attention": min(seq, window or seq),
            "chunked_attention": min(seq, getattr(text, "attention_chunk_size", None) or seq)}
    return layers * per_layer, sum(per_layer * keep[t] for t in types)


@pytest.fixture
def no_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers hidden: `import transformers` fails, as where it is not installed."""
    monkeypatch.setitem(sys.modules, "transformers", None)


@pytest.mark.parametrize("family, i", FAMILY_CASES)
def test_each_family_as_transformers_resolves_it(family: str, i: int) -> None:
    pytest.importorskip("transformers")
    cfg = _family_config(family, i)
    per_token, seq_bytes = _oracle(cfg, 20_000)
    shape = kv.shape_from_config(cfg, defaults="transformers")
    assert shape.defaults is not None and shape.defaults.source.startswith("transformers ")
    assert (shape.bytes_per_token, shape.sequence_bytes(20_000)) == (per_token, seq_bytes)
    assert not shape.assumptions


@pytest.mark.parametrize("family, i", FAMILY_CASES)
def test_dltop_table_gives_transformers_numbers(family: str, i: int, no_transformers: None) -> None:
    cfg = _family_config(family, i)
    table = kv.shape_from_config(cfg, defaults="auto")  # transformers hidden: the table stands in
    assert table.defaults is not None and table.defaults.source.startswith("dltop's table")
    with pytest.raises(kv.ConfigError, match="^--defaults transformers: not importable"):
        kv.shape_from_config(cfg, defaults="transformers")
    sys.modules.pop("transformers")  # transformers back, for the oracle
    assert (table.bytes_per_token, table.sequence_bytes(20_000)) == _oracle(cfg, 20_000)
    lib = kv.shape_from_config(cfg, defaults="transformers")
    assert kv.shape_dict(table) | {"defaults": None} == kv.shape_dict(lib) | {"defaults": None}
    assert kv.parameter_count(cfg, "table").total == kv.parameter_count(cfg, "transformers").total


@needs_configs
@pytest.mark.parametrize("model", MODELS)
def test_fixtures_size_the_same_with_transformers_or_the_table(model: str) -> None:
    pytest.importorskip("transformers")
    cfg = json.loads((CONFIGS / f"{model}.config.json").read_text())
    lib, table = kv.shape_from_config(cfg, defaults="transformers"), kv.shape_from_config(cfg, defaults="table")
    assert (lib.bytes_per_token, lib.sequence_bytes(5000)) == (table.bytes_per_token, table.sequence_bytes(5000)) \
        == _oracle(cfg, 5000)
    assert kv.shape_dict(lib) | {"defaults": None} == kv.shape_dict(table) | {"defaults": None}
    assert kv.parameter_count(cfg, "transformers") == kv.parameter_count(cfg, "table")


def test_dltop_kv_fills_gemma3_defaults_and_says_who(tmp_path: Path) -> None:
    """The issue's two Gemma 3 configs through `dltop kv` as a user runs it (transformers importable): the 27B has
    a global layer every 6th (not 62 sliding of 62), the 4B is sized (not refused for no num_attention_heads)."""
    pytest.importorskip("transformers")
    for cfg, sliding in ((GEMMA3_27B, 52), (GEMMA3_4B, 29)):
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        r = dltop("kv", "--config", str(tmp_path / "config.json"), "--seq", "32768", "--json", timeout=120)
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert (d["bytes_per_token"], d["bytes_per_sequence"]) == _oracle(cfg, 32768)
        assert d["model"]["sliding_layers"] == sliding and d["model"]["assumptions"] == []
        assert d["model"]["defaults"]["source"].startswith("transformers ") and "Gemma3TextConfig" in \
            d["model"]["defaults"]["source"]
    assert d["model"]["defaults"]["filled"]["num_attention_heads"] == 8
    text = dltop("kv", "--config", str(tmp_path / "config.json"), "--seq", "32768", timeout=120).stdout
    assert re.search(r"^defaults +transformers \S+ \(Gemma3TextConfig\) filled num_attention_heads 8, "
                     r"num_key_value_heads 4, head_dim 256, layer_types \(29 sliding, 5 full\)", text, re.M), text


def test_without_transformers_dltop_kv_uses_its_table(tmp_path: Path) -> None:
    # A transformers that cannot be imported, first on the path: the table fills the same numbers and says so.
    (tmp_path / "hide" / "transformers").mkdir(parents=True)
    (tmp_path / "hide" / "transformers" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_4B))
    env = {"PYTHONPATH": f"{tmp_path / 'hide'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = ["--config", str(tmp_path / "config.json"), "--seq", "32768"]
    d = kv_json(*args, "--defaults", "auto", env=env)
    assert d["model"]["defaults"]["source"] == "dltop's table (gemma3_text)"
    assert d["total_bytes"] == kv_json(*args)["total_bytes"]
    r = dltop("kv", *args, "--defaults", "transformers", env=env)
    assert r.returncode == 1 and r.stderr.strip() == ("dltop: --defaults transformers: not importable: hidden by "
                                                      "the test"), r.stderr


@pytest.mark.parametrize("defaults", ["table", "transformers"])
def test_an_unknown_model_type_window_is_an_assumption(defaults: str) -> None:
    if defaults == "transformers":
        pytest.importorskip("transformers")
    cfg = _base(model_type="not-a-model", sliding_window=64)
    shape = kv.shape_from_config(cfg, defaults="auto" if defaults == "transformers" else "table")
    assert shape.sliding_layers == 12 and len(shape.assumptions) == 1
    assert "every layer slides (sliding_window 64): model type \"not-a-model\" is not one" in shape.assumptions[0]
    if defaults == "transformers":
        assert any("does not know model type" in n for n in shape.notes)
    # Mistral's every layer slides by its library's rule: no assumption there.
    assert not kv.shape_from_config(_base(model_type="mistral", sliding_window=64)).assumptions


def test_dltop_kv_prints_the_assumption(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_base(model_type="x\x1b[2J", sliding_window=64)))
    d = kv_json("--config", str(tmp_path / "config.json"), "--seq", "100")
    assert len(d["model"]["assumptions"]) == 1 and '"x\\u001b[2J"' in d["model"]["assumptions"][0]
    r = dltop("kv", "--config", str(tmp_path / "config.json"), "--seq", "100", "--defaults", "table")
    assert '\nassumed      every layer slides (sliding_window 64): model type "x\\u001b[2J"' in r.stdout, r.stdout
    assert "\x1b" not in r.stdout


# -- KV dtypes ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, per_head_vector", [
    ("fp8", 128), ("int8", 128), ("int4", 64),
    ("nvfp4", 128 // 16 * (8 + 1)), ("fp4", 128 // 16 * (8 + 1)),  # 16 fp4 values (8 B) share one fp8 scale (1 B)
])
def test_kv_dtypes(dtype: str, per_head_vector: int) -> None:
    d = kv_json(*LLAMA_7B, "--kv-heads", "8", "--seq", "4096", "--kv-dtype", dtype)
    assert d["bytes_per_token"] == 2 * 32 * 8 * per_head_vector
    assert d["total_bytes"] == 4096 * d["bytes_per_token"]
    assert d["model"]["kv_dtype_bits"] == {"fp8": 8, "int8": 8, "int4": 4, "nvfp4": 4.5, "fp4": 4.5}[dtype]
    assert d["model"]["kv_dtype_bytes"] == d["model"]["kv_dtype_bits"] / 8


@needs_configs
def test_nvfp4_of_an_mla_latent() -> None:
    d = kv_json("--config", str(CONFIGS / "DeepSeek-V3.config.json"), "--seq", "10", "--kv-dtype", "nvfp4")
    assert d["bytes_per_token"] == 61 * (512 + 64) // 16 * 9


# -- MIG: the instance this process sees, not the whole GPU --------------------------------------------------------

def test_mig_plans_against_the_visible_instance() -> None:
    gpu = json.loads((SCENARIOS / "a100-mig.json").read_text())["gpus"][0]
    g3 = gpu["mig_devices"][0]
    args = [*LLAMA_7B, "--seq", "2048", "--weights-bytes", "14GB"]
    env = _on("a100-mig") | {"CUDA_VISIBLE_DEVICES": g3["uuid"]}
    for extra in ([], ["--gpu", "0"]):
        p = kv_json(*args, *extra, env=env)["pool"]
        assert p["gpu_mem_bytes"] == g3["memory"]["total"] < gpu["memory"]["total"]
        assert g3["uuid"] in p["gpu_mem_source"] and "CUDA_VISIBLE_DEVICES" in p["gpu_mem_source"]
    old_form = f"MIG-{gpu['uuid']}/{gpu['mig_devices'][1]['instance_ids']['gpu']}/0,1"
    p = kv_json(*args, env=_on("a100-mig") | {"CUDA_VISIBLE_DEVICES": old_form})["pool"]
    assert p["gpu_mem_bytes"] == gpu["mig_devices"][1]["memory"]["total"]


@pytest.mark.parametrize("visible, words", [
    ("", "is in MIG mode with 3 instances (NVIDIA A100-SXM4-40GB MIG 3g.20gb, "),
    ("0", "is in MIG mode with 3 instances"),
    ("MIG-00000000-0000-0000-0000-000000000000", "CUDA_VISIBLE_DEVICES names MIG-00000000-0000-0000-0000-000000000000, "
                                                 "which is not a MIG instance of GPU 0"),
])
def test_mig_without_a_visible_instance_is_refused(visible: str, words: str) -> None:
    env = _on("a100-mig") | {"CUDA_VISIBLE_DEVICES": visible}
    args = [*LLAMA_7B, "--seq", "2048", "--weights-bytes", "14GB"]
    pool = kv_json(*args, env=env)["pool"]
    assert list(pool) == ["unavailable"] and words in pool["unavailable"] and "--gpu-mem" in pool["unavailable"]
    r = dltop("kv", *args, "--gpu", "0", env=env)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert words in r.stderr and r.stderr.strip().endswith("; pass --gpu-mem SIZE instead"), r.stderr
