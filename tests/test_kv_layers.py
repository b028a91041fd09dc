"""`dltop kv` layer by layer: models whose layers differ in KV heads, K and V head dims and window, from the config
forms they are published in (per_layer_config, swa_* keys, v_head_dim beside head_dim, Gemma 4's global_* keys with
attention_k_eq_v, hybrid_layer_pattern, num_kv_shared_layers), the notes on keys dltop does not read, the warning
past the model's positions, and transformers' reading beside dltop's.

The oracles: bytes worked out by hand here from the published sizes (not from dltop's code), and transformers' own
DynamicCache on tiny random models built from the same config forms (the per-layer K and V tensors it keeps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dltop import kv
from tests.conftest import SHARED_FIXTURES
from tests.test_cli import dltop

CONFIGS = SHARED_FIXTURES / "hf-configs"
needs_configs = pytest.mark.skipif(not CONFIGS.is_dir(), reason=f"HF config fixtures not found at {CONFIGS}")
SEQ = 32_768


def _every_6th_full(layers: int) -> list[str]:
    # Gemma 4's layer pattern (Gemma4TextConfig): five sliding layers, then a full one; the last layer is full.
    return ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention" for i in range(layers)]


# The text model of google/gemma-4-26B-A4B-it, the keys that shape its attention
# (https://huggingface.co/google/gemma-4-26B-A4B-it/blob/main/config.json, text_config; as quoted by public projects
# that load it: sliding layers 8 KV heads x 256, the five full layers 2 KV heads x 512 with attention_k_eq_v).
GEMMA4_26B = {"model_type": "gemma4", "text_config": {
    "model_type": "gemma4_text", "dtype": "bfloat16", "hidden_size": 2816, "num_hidden_layers": 30,
    "num_attention_heads": 16, "num_key_value_heads": 8, "num_global_key_value_heads": 2, "head_dim": 256,
    "global_head_dim": 512, "attention_k_eq_v": True, "sliding_window": 1024, "max_position_embeddings": 262144,
    "num_kv_shared_layers": 0, "layer_types": _every_6th_full(30), "vocab_size": 262144, "intermediate_size": 2112}}
# By hand: 25 sliding layers of 2 (K, V) x 8 heads x 256 x 2 B, 5 full layers of 2 x 2 x 512 x 2 B.
GEMMA4_26B_PER_TOKEN = 25 * 2 * 8 * 256 * 2 + 5 * 2 * 2 * 512 * 2
GEMMA4_26B_SEQ = 25 * 2 * 8 * 256 * 2 * 1024 + 5 * 2 * 2 * 512 * 2 * SEQ

# google/gemma-4-E2B-it (https://huggingface.co/google/gemma-4-E2B-it/blob/main/config.json, text_config): 35
# layers, a full one every 5th, one KV head of 256 (512 on full layers), and the last 20 layers reuse the caches
# of earlier ones (num_kv_shared_layers).
GEMMA4_E2B = {"model_type": "gemma4_text", "dtype": "bfloat16", "hidden_size": 1536, "num_hidden_layers": 35,
              "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
              "num_global_key_value_heads": None, "attention_k_eq_v": False, "sliding_window": 512,
              "num_kv_shared_layers": 20, "max_position_embeddings": 131072, "vocab_size": 262144,
              "layer_types": ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(35)]}
# By hand: layers 0-14 keep a cache, 3 of them full (4, 9, 14); layers 15-34 keep none.
GEMMA4_E2B_PER_TOKEN = 12 * 2 * 1 * 256 * 2 + 3 * 2 * 1 * 512 * 2
GEMMA4_E2B_SEQ = 12 * 2 * 256 * 2 * 512 + 3 * 2 * 512 * 2 * SEQ

# XiaomiMiMo/MiMo-V2-Flash (https://huggingface.co/XiaomiMiMo/MiMo-V2-Flash/blob/main/config.json; the keys as
# quoted by the public projects that load it): hybrid_layer_pattern (1 slides), full layers 4 KV heads, sliding
# layers their own 8 (swa_num_key_value_heads), K 192 and V 128 on both; 39 sliding + 9 full layers.
MIMO_FLASH = {
    "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash", "torch_dtype": "bfloat16",
    "hidden_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 4,
    "head_dim": 192, "v_head_dim": 128, "swa_num_attention_heads": 64, "swa_num_key_value_heads": 8,
    "swa_head_dim": 192, "swa_v_head_dim": 128, "sliding_window": 128, "sliding_window_size": 128,
    "attention_chunk_size": 128, "swa_rope_theta": 10000, "partial_rotary_factor": 0.334,
    "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False, "max_position_embeddings": 262144,
    "hybrid_layer_pattern": [0 if i == 0 or (i + 1) % 6 == 0 else 1 for i in range(48)], "vocab_size": 152576}
MIMO_PER_TOKEN = 9 * 4 * (192 + 128) * 2 + 39 * 8 * (192 + 128) * 2
MIMO_SEQ = 9 * 4 * (192 + 128) * 2 * SEQ + 39 * 8 * (192 + 128) * 2 * 128


def _groups(shape: kv.KvShape) -> list[tuple[str, int | None, int, int, int, int]]:
    return [(g.kind, g.window, g.kv_heads, g.k_dim, g.v_dim, len(layers)) for g, layers in shape.groups()]


@pytest.mark.parametrize("cfg, per_token, seq_bytes, groups", [
    (GEMMA4_26B, GEMMA4_26B_PER_TOKEN, GEMMA4_26B_SEQ,
     [("sliding", 1024, 8, 256, 256, 25), ("full", None, 2, 512, 512, 5)]),
    (GEMMA4_E2B, GEMMA4_E2B_PER_TOKEN, GEMMA4_E2B_SEQ,
     [("sliding", 512, 1, 256, 256, 12), ("full", None, 1, 512, 512, 3), ("shared", None, 0, 0, 0, 20)]),
    (MIMO_FLASH, MIMO_PER_TOKEN, MIMO_SEQ,
     [("full", None, 4, 192, 128, 9), ("sliding", 128, 8, 192, 128, 39)]),
], ids=["gemma-4-26B-A4B", "gemma-4-E2B", "MiMo-V2-Flash"])
def test_published_configs_layer_by_layer(cfg: dict[str, Any], per_token: int, seq_bytes: int,
                                          groups: list[tuple[str, int | None, int, int, int, int]]) -> None:
    shape = kv.shape_from_config(cfg)
    assert _groups(shape) == groups
    assert (shape.bytes_per_token, shape.sequence_bytes(SEQ)) == (per_token, seq_bytes)
    assert not shape.assumptions
    assert not [n for n in shape.notes if n.startswith("not understood")]


def test_gemma4_without_attention_k_eq_v_keeps_its_kv_heads_on_full_layers() -> None:
    # transformers' Gemma4TextConfig applies num_global_key_value_heads only with attention_k_eq_v; dltop says so.
    cfg = {**GEMMA4_26B["text_config"], "attention_k_eq_v": False}  # type: ignore[dict-item]
    shape = kv.shape_from_config(cfg)
    assert _groups(shape) == [("sliding", 1024, 8, 256, 256, 25), ("full", None, 8, 512, 512, 5)]
    assert any("num_global_key_value_heads 2 does not apply: attention_k_eq_v is off" in n for n in shape.notes)


def test_per_layer_config_as_transformers_writes_it() -> None:
    """The form a config saved by transformers 5 has (its Gemma4TextConfig.to_dict(), checked by the cross-check
    test below): head_dim and KV heads for every layer at the top, the full layers' own in per_layer_config, and no
    global_* keys. It sizes as the published form does, with no transformers involved."""
    text = {k: v for k, v in GEMMA4_26B["text_config"].items()  # type: ignore[attr-defined]
            if k not in ("global_head_dim", "num_global_key_value_heads")}
    text["per_layer_config"] = {f"{i:02d}": {"head_dim": 512, "num_key_value_heads": 2} for i in (5, 11, 17, 23, 29)}
    shape = kv.shape_from_config(text, defaults="table")
    assert (shape.bytes_per_token, shape.sequence_bytes(SEQ)) == (GEMMA4_26B_PER_TOKEN, GEMMA4_26B_SEQ)
    # A per-layer sliding window (NeoMME's long and short windows) and an override dltop does not read.
    text["per_layer_config"] = {"0": {"sliding_window": 4096}, "1": {"skip": ["mlp"]}}
    shape = kv.shape_from_config(text, defaults="table")
    assert shape.per_layer[0].window == 4096 and shape.per_layer[1].window == 1024
    assert any(n.startswith("not understood: per_layer_config gives skip to layer(s) 1") for n in shape.notes)


@pytest.mark.parametrize("bad, words", [
    ({"per_layer_config": {"x": {}}}, 'must map layer numbers (0 to 29) to overrides, not "x"'),
    ({"per_layer_config": {"30": {}}}, 'not "30"'),
    ({"per_layer_config": {"\u0661": {}}}, "must map layer numbers"),  # an Arabic-Indic digit: int() takes it
    ({"per_layer_config": {"3": 4}}, "must map layer numbers"),
    ({"per_layer_config": [1]}, "per_layer_config in the config must map layer numbers to overrides, not [1]"),
    ({"per_layer_config": {"3": {"head_dim": -1}}}, "head_dim in the config must be a whole number"),
    ({"hybrid_layer_pattern": [0, 1]}, "hybrid_layer_pattern in the config must list 0 (full) or 1 (sliding)"),
    ({"hybrid_layer_pattern": [True] * 30}, "hybrid_layer_pattern in the config must list"),
    ({"hybrid_layer_pattern": [1.0] * 30}, "hybrid_layer_pattern in the config must list"),
    ({"num_kv_shared_layers": 30}, "num_kv_shared_layers 30 leaves none of the 30 layers to keep a cache"),
    ({"swa_num_key_value_heads": 3}, "3 KV heads do not divide 16 attention heads"),
])
def test_bad_per_layer_keys_are_one_line_config_errors(bad: dict[str, Any], words: str) -> None:
    cfg = {k: v for k, v in GEMMA4_26B["text_config"].items() if k != "layer_types"}  # type: ignore[attr-defined]
    cfg = {**cfg, "layer_types": None, **bad} if "hybrid_layer_pattern" in bad else {**cfg, **bad}
    with pytest.raises(kv.ConfigError) as e:
        kv.shape_from_config(cfg | ({} if "layer_types" in cfg else {"layer_types": _every_6th_full(30)}))
    assert words in str(e.value) and "\n" not in str(e.value)


@needs_configs
def test_keys_dltop_does_not_read_are_named() -> None:
    # deepseek-ai/DeepSeek-V3.2-Exp is DeepSeek-V3's config with a sparse-attention indexer, which keeps its own
    # cache of index keys (https://huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp/blob/main/config.json).
    cfg = json.loads((CONFIGS / "DeepSeek-V3.config.json").read_text())
    cfg |= {"model_type": "deepseek_v32", "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}
    notes = kv.shape_from_config(cfg).notes
    assert any(n.startswith("not understood: index_head_dim, index_n_heads, index_topk: ") for n in notes), notes
    # The five real configs: every key that looks like it shapes attention is read or known not to matter.
    for f in sorted(CONFIGS.glob("*.config.json")):
        assert not [n for n in kv.shape_from_config(json.loads(f.read_text())).notes
                    if n.startswith("not understood")], f


@needs_configs
def test_seq_past_the_models_positions_is_a_warning() -> None:
    path = str(CONFIGS / "Llama-2-7b-hf.config.json")  # max_position_embeddings 4096
    r = dltop("kv", "--config", path, "--seq", "32768", "--defaults", "table")
    assert r.returncode == 0, r.stderr
    assert ("\nwarning      --seq 32,768 is past the model's 4,096 positions (config max_position_embeddings): "
            "it was not made for sequences this long") in r.stdout
    d = json.loads(dltop("kv", "--config", path, "--seq", "4096", "--defaults", "table", "--json").stdout)
    assert d["warnings"] == [] and d["max_positions"] == 4096
    d = json.loads(dltop("kv", "--config", path, "--seq", "4097", "--defaults", "table", "--json").stdout)
    assert len(d["warnings"]) == 1 and d["total_bytes"] == 4097 * 524288


def test_dltop_kv_shows_each_layer_group(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(MIMO_FLASH))
    args = ["kv", "--config", str(tmp_path / "config.json"), "--seq", str(SEQ), "--defaults", "table"]
    r = dltop(*args)
    assert r.returncode == 0, r.stderr
    assert f"\nper token    {MIMO_PER_TOKEN:,} B = the sum over 2 layer groups (without windows):\n" \
           "    9 full, all tokens: 4 KV heads × (K 192 + V 128) × 2 B = 2,560 B\n" \
           "      754,974,720 B of the sequence; layers 0, 5, 11, 17, 23, 29, 35, 41, 47\n" \
           "   39 sliding, each ≤ 128 tokens: 8 KV heads × (K 192 + V 128) × 2 B = 5,120 B\n" \
           "      25,559,040 B of the sequence; layers 1-4, 6-10, 12-16, 18-22, 24-28,\n" \
           "      30-34, 36-40, 42-46\n" in r.stdout, r.stdout
    assert "\nnote         attention_chunk_size 128 does not apply: no layer is a chunked_attention layer" in r.stdout
    assert "\ncheck        not cross-checked with transformers: not asked (--defaults table)" in r.stdout
    d = json.loads(dltop(*args, "--json").stdout)
    assert d["total_bytes"] == MIMO_SEQ and d["model"]["kv_heads"] is None and d["model"]["head_dim"] is None
    full, sliding = d["model"]["layer_groups"]
    assert full == {"layers": [0, 5, 11, 17, 23, 29, 35, 41, 47], "count": 9, "kind": "full", "window": None,
                    "attention": "GQA", "heads": 64, "kv_heads": 4, "k_head_dim": 192, "v_head_dim": 128,
                    "bytes_per_token_per_layer": 2560, "bytes_per_token": 9 * 2560,
                    "bytes_per_sequence": 9 * 2560 * SEQ}
    assert sliding["count"] == 39 and sliding["bytes_per_sequence"] == 39 * 5120 * 128
    assert sum(g["bytes_per_sequence"] for g in d["model"]["layer_groups"]) == d["bytes_per_sequence"]


# -- transformers beside dltop ------------------------------------------------------------------------------------

def test_cross_check_with_transformers_config_classes() -> None:
    pytest.importorskip("transformers")
    # Gemma 4 in both forms: transformers builds per_layer_config from the global_* keys and reads it as dltop does.
    shape = kv.shape_from_config(GEMMA4_26B, defaults="transformers")
    assert shape.defaults is not None and "per_layer_config" in shape.defaults.filled
    check = kv.cross_check(shape)
    assert isinstance(check, kv.CrossCheck) and "Gemma4TextConfig" in check.source and check.differences == ()
    e2b = kv.cross_check(kv.shape_from_config(GEMMA4_E2B, defaults="transformers"))  # its "dummy" (shared) layers
    assert isinstance(e2b, kv.CrossCheck) and e2b.differences == ()
    # MiMo-V2-Flash: transformers' config class reads neither hybrid_layer_pattern nor swa_num_key_value_heads (its
    # modelling code doubles num_key_value_heads on sliding layers) and widens the window by the query's own token.
    check = kv.cross_check(kv.shape_from_config(MIMO_FLASH, defaults="transformers"))
    assert isinstance(check, kv.CrossCheck)
    assert check.differences == ("layer(s) 1-4, 6-10, 12-16, 18-22, 24-28, 30-34, 36-40, 42-46: its config object "
                                 "reads window 129, KV heads 4 (dltop: window 128, KV heads 8)",)
    assert kv.cross_check(kv.shape_from_config(MIMO_FLASH, defaults="table")) == "not asked (--defaults table)"


@pytest.mark.slow
def test_per_layer_shapes_are_the_ones_transformers_caches() -> None:
    """The strongest oracle: tiny random models built by transformers from the same config forms (Gemma 4's
    global_* keys with attention_k_eq_v and shared layers; MiMo-V2's swa_* keys, v_head_dim and
    hybrid_layer_pattern), run over 20 tokens on the CPU; each layer's K and V tensors in its DynamicCache against
    dltop's shape of that layer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    gemma4 = {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_global_key_value_heads": 1, "head_dim": 16, "global_head_dim": 32,
              "sliding_window": 8, "attention_k_eq_v": True, "num_kv_shared_layers": 2, "vocab_size": 128,
              "intermediate_size": 64, "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 8,
              "layer_types": ["sliding_attention", "full_attention"] * 3}
    # transformers lays MiMo's layers out by its own rule (the first and every 6th full): the pattern here is that.
    mimo = {"model_type": "mimo_v2_flash", "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 24, "v_head_dim": 16, "swa_num_attention_heads": 8,
            "swa_num_key_value_heads": 4, "swa_head_dim": 24, "swa_v_head_dim": 16, "sliding_window": 8,
            "sliding_window_size": 8, "hybrid_layer_pattern": [0, 1, 1, 1, 1, 0], "vocab_size": 128,
            "intermediate_size": 64, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2}
    tokens = 20
    for cfg, uncounted in ((gemma4, 1), (mimo, 0)):
        shape = kv.shape_from_config(cfg, defaults="table")
        config = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items()
                                                                         if k != "model_type"})
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            cache = model(torch.randint(0, 128, (1, tokens)), use_cache=True).past_key_values
        for i, (ours, layer) in enumerate(zip(shape.per_layer, cache.layers, strict=True)):
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if ours.kind == "shared":
                assert keys is None or keys.numel() == 0, i
                continue
            kept = tokens if ours.window is None else ours.window - (uncounted if ours.kind == "sliding" else 0)
            # transformers keeps sliding_window - 1 tokens of Gemma's window (the query's own is not kept); MiMo's
            # window it widens by one first, so it keeps sliding_window_size, as dltop counts.
            assert tuple(keys.shape) == (1, ours.kv_heads, kept, ours.k_dim), i
            assert tuple(values.shape) == (1, ours.kv_heads, kept, ours.v_dim), i


# transformers' own defaults of model types dltop sizes (none of their keys is left unread), and of hybrid ones whose
# Mamba or linear-attention layers keep no per-token KV (never sized silently: a note names the keys, or the layer
# types are refused).
SIZED = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3",
         "deepseek_v3", "gpt_oss", "llama4_text", "hunyuan_v1_moe", "olmo2", "cohere2", "mimo_v2_flash",
         "gemma4_text", "gemma3n_text"]
HYBRID = ["falcon_h1", "jamba", "nemotron_h", "bamba", "qwen3_next", "minimax"]


def test_library_defaults_leave_no_key_unread_and_hybrids_are_never_silent() -> None:
    pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for model_type in SIZED + HYBRID:
        if model_type not in CONFIG_MAPPING:
            continue
        cfg = CONFIG_MAPPING[model_type]().to_dict()
        try:
            notes = [n for n in kv.shape_from_config(cfg, defaults="table").notes if n.startswith("not understood")]
        except kv.ConfigError as e:
            assert model_type in HYBRID, (model_type, str(e))
            continue
        assert bool(notes) == (model_type in HYBRID), (model_type, notes)


# Gemma 3n and Gemma 4 as configs that leave (nearly) everything to their model type: dltop's table gives what
# transformers' config classes give, layer by layer (google/gemma-3n-E4B is Gemma3nTextConfig's own checkpoint).
GEMMA_DEFAULTS = [
    {"model_type": "gemma3n_text", "num_hidden_layers": 35},
    {"model_type": "gemma3n", "text_config": {"model_type": "gemma3n_text", "num_hidden_layers": 30,
                                              "num_kv_shared_layers": 10}},
    {"model_type": "gemma4_text", "num_hidden_layers": 30},
    {"model_type": "gemma4", "text_config": {"model_type": "gemma4_text", "num_hidden_layers": 12,
                                             "attention_k_eq_v": True, "num_global_key_value_heads": 1}},
    {"model_type": "gemma4_text", "num_hidden_layers": 35, "num_key_value_heads": 1, "num_kv_shared_layers": 20},
    # a saved config whose full layers have the sliding layers' head dim: an empty per_layer_config, no 512
    {"model_type": "gemma4_text", "num_hidden_layers": 12, "per_layer_config": {}},
]


@pytest.mark.parametrize("cfg", GEMMA_DEFAULTS)
def test_gemma_defaults_from_the_table_are_transformers(cfg: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    table, lib = kv.shape_from_config(cfg, defaults="table"), kv.shape_from_config(cfg, defaults="transformers")
    assert table.defaults is not None and table.defaults.source.startswith("dltop's table (gemma")
    assert kv.shape_dict(table, SEQ) | {"defaults": None} == kv.shape_dict(lib, SEQ) | {"defaults": None}
    check = kv.cross_check(lib)
    assert isinstance(check, kv.CrossCheck) and check.differences == ()


def test_gemma3n_e4b_by_hand() -> None:
    # Gemma3nTextConfig's defaults (google/gemma-3n-E4B): 35 layers, a full one every 5th, 2 KV heads x 256, window
    # 512, and the last 15 layers reuse earlier caches: layers 0-19 keep one, 4 of them full (4, 9, 14, 19).
    shape = kv.shape_from_config({"model_type": "gemma3n_text", "num_hidden_layers": 35, "torch_dtype": "bfloat16"})
    assert shape.bytes_per_token == 16 * 2 * 2 * 256 * 2 + 4 * 2 * 2 * 256 * 2
    assert shape.sequence_bytes(SEQ) == 16 * 2 * 2 * 256 * 2 * 512 + 4 * 2 * 2 * 256 * 2 * SEQ
