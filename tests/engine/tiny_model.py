"""A tiny Llama checkpoint made on the spot: ``config.json`` plus seeded random
``model.safetensors``, nothing from a hub.

Why not vLLM's dummy loader: it fills weights uniformly within +-1e-3, so the
model ignores its context and a pool that hands out the wrong cached block
changes no generated token. These weights are of ordinary scale (embedding
std 1, query/key projections std 0.35, so attention depends on what is in the
KV cache), which makes a wrong block change the output.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Two layers, head_dim 32 (vLLM's CPU attention wants >= 32), GQA 4:2.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# Standard deviation of each weight kind (norm weights are ones).
_STD = {"embed": 1.0, "q": 0.35, "k": 0.35, "v": 0.3, "o": 0.1, "mlp": 0.08, "head": 0.15}


def make_model(directory: Path | str, *, seed: int = 1234, layers: int | None = None,
               sliding_window: int | None = None) -> Path:
    """Write the checkpoint into ``directory`` (created) and return it.
    ``sliding_window``: every other layer becomes a sliding-window layer
    (a full + sliding-window model), where the model class supports it."""
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG)
    if layers is not None:
        config["num_hidden_layers"] = layers
    if sliding_window is not None:
        config["sliding_window"] = sliding_window
        config["layer_types"] = [
            "sliding_attention" if i % 2 else "full_attention"
            for i in range(config["num_hidden_layers"])
        ]
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    normal = _normal(seed)
    tensors = {"model.embed_tokens.weight": normal(_STD["embed"], vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        tensors.update(_layer(normal, config, f"model.layers.{i}.", qkv_in=hidden))
    tensors["model.norm.weight"] = torch.ones(hidden)
    tensors["lm_head.weight"] = normal(_STD["head"], vocab, hidden)
    _save(directory, tensors, config)
    return directory


#: The Llama 4 text model's sizes (``make_chunked_model``): those of
#: ``CONFIG``, no MoE layer, no QK norm (so that the query/key scale counts
#: as in the Llama). Its layer pattern is Llama 4's: rope layers attend in
#: chunks (``attention_chunk_size``), every 4th layer (no rope) to all tokens.
LLAMA4 = {
    **{k: CONFIG[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                              "num_key_value_heads", "head_dim", "vocab_size",
                              "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                              "bos_token_id", "eos_token_id")},
    "intermediate_size_mlp": CONFIG["intermediate_size"],
    "interleave_moe_layer_step": 0,
    "moe_layers": [],
    "num_local_experts": 1,
    "use_qk_norm": False,
}


def make_chunked_model(directory: Path | str, *, attention_chunk_size: int, layers: int = 4,
                       seed: int = 1234) -> Path:
    """A tiny Llama 4 text checkpoint (``Llama4ForCausalLM``) with chunked
    local attention: layers 0-2 of every 4 attend within chunks of
    ``attention_chunk_size`` tokens, layer 3 to all (transformers' own config
    and model classes, then every weight but the norms drawn again at the
    scales of ``_STD``: from_config's std 0.02 would make the model ignore
    its context)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(directory)
    config = AutoConfig.for_model("llama4_text", **LLAMA4, num_hidden_layers=layers,
                                  attention_chunk_size=attention_chunk_size, dtype="float32")
    model = AutoModelForCausalLM.from_config(config)
    normal = _normal(seed)
    kinds = {"embed_tokens": "embed", "q_proj": "q", "k_proj": "k", "v_proj": "v",
             "o_proj": "o", "feed_forward": "mlp", "lm_head": "head"}
    with torch.no_grad():
        for name, param in model.named_parameters():
            kind = next((v for k, v in kinds.items() if k in name), None)
            if kind is not None:
                param.copy_(normal(_STD[kind], *param.shape))
            else:
                assert "norm" in name, name
                param.fill_(1.0)
    model.save_pretrained(directory)
    return directory


#: The NemotronH model's sizes (``make_nemotronh_model``): those of
#: What every tiny hybrid takes of ``CONFIG``: attention, MLP, vocabulary.
_HYBRID_BASE = {k: CONFIG[k] for k in (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
    "bos_token_id", "eos_token_id")}

#: ``CONFIG`` for attention and the MLP, a Mamba2 mixer of 4 heads of 32
#: (state 16, one group).
NEMOTRON_H = {
    **_HYBRID_BASE,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "n_groups": 1,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "pad_token_id": 0,
}

#: ``CONFIG`` for attention; a gated delta net with one key and two value
#: heads of 128 (the CPU kernel's head size), a mixture of 4 experts (2 a
#: token) with a shared expert.
QWEN3_NEXT = {
    **_HYBRID_BASE,
    "pad_token_id": 0,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1,
}


def _from_config(directory: Path | str, model_type: str, config: dict, scales: dict,
                 fan_in: tuple[str, ...], seed: int) -> Path:
    """A checkpoint of transformers' own model class for ``model_type``
    (``config``), its weights drawn again: those whose name contains a key
    of ``scales`` at that standard deviation, those whose name ends with one
    of ``fan_in`` at 1/sqrt(fan_in)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(directory)
    # (what is not drawn again -- a Mamba mixer's dt_bias, say -- is
    # transformers' own initialisation, from torch's global generator)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(model_type, **config, dtype="float32"))
    normal = _normal(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            std = next((v for k, v in scales.items() if k in name), None)
            if std is None and name.endswith(fan_in):
                std = param.shape[1] ** -0.5
            if std is not None:
                param.copy_(normal(std, *param.shape))
    model.save_pretrained(directory)
    return directory


def make_nemotronh_model(directory: Path | str, *, pattern: str = "M*-M-",
                         seed: int = 1234) -> Path:
    """A tiny NemotronH checkpoint (``NemotronHForCausalLM``, a Mamba2
    hybrid): its layers by ``pattern``, NemotronH's own notation (``M`` a
    Mamba2 mixer, ``*`` attention, ``-`` an MLP), made with transformers' own
    config and model classes; the projections then drawn again at the scales
    of ``_STD`` (the Mamba mixer's at 1/sqrt(fan_in), its convolution at
    0.5), so that what each layer reads -- the KV cache, the Mamba state --
    decides the tokens."""
    kinds = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
    config = {**NEMOTRON_H, "layers_block_type": [kinds[c] for c in pattern],
              "architectures": ["NemotronHForCausalLM"]}
    scales = {"embeddings": _STD["embed"], "q_proj": _STD["q"], "k_proj": _STD["k"],
              "v_proj": _STD["v"], "o_proj": _STD["o"], "up_proj": _STD["mlp"],
              "down_proj": _STD["mlp"], "lm_head": _STD["head"], "conv1d.weight": 0.5}
    return _from_config(directory, "nemotron_h", config, scales,
                        ("in_proj.weight", "out_proj.weight"), seed)


def make_qwen3next_model(directory: Path | str, *, pattern: str = "LLLA",
                         seed: int = 1234) -> Path:
    """A tiny Qwen3-Next checkpoint (``Qwen3NextForCausalLM``, a gated
    delta net hybrid): its layers by ``pattern`` (``L`` a gated-delta-net
    layer, ``A`` gated attention), each with a mixture of experts, made with
    transformers' own config and model classes; the projections then drawn
    again at the scales of ``_STD`` (the delta net's at 1/sqrt(fan_in), its
    convolution at 0.5), so that what each layer reads -- the KV cache, the
    recurrent state -- decides the tokens."""
    kinds = {"L": "linear_attention", "A": "full_attention"}
    config = {**QWEN3_NEXT, "num_hidden_layers": len(pattern),
              "layer_types": [kinds[c] for c in pattern],
              "architectures": ["Qwen3NextForCausalLM"]}
    scales = {"embed_tokens": _STD["embed"], "q_proj": _STD["q"], "k_proj": _STD["k"],
              "v_proj": _STD["v"], "o_proj": _STD["o"], "lm_head": _STD["head"],
              "conv1d.weight": 0.5, "gate_proj": _STD["mlp"], "up_proj": _STD["mlp"],
              "down_proj": _STD["mlp"], "experts.": _STD["mlp"]}
    return _from_config(directory, "qwen3_next", config, scales,
                        ("in_proj_qkvz.weight", "in_proj_ba.weight",
                         "linear_attn.out_proj.weight"), seed)


def _normal(seed: int):
    """``normal(std, *shape)``: seeded random tensors, one generator a model."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def normal(std: float, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    return normal


def _save(directory: Path, tensors: dict, config: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def _layer(normal, config: dict, prefix: str, *, qkv_in: int, input_norm: bool = True) -> dict:
    """One Llama decoder layer's weights under ``prefix``, drawn in one fixed
    order (q/k/v read ``qkv_in`` features: EAGLE-3 feeds them the embedding
    and hidden state; an EAGLE-1 draft's layer has no input norm)."""
    import torch

    hidden, inter, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim
    tensors = {
        prefix + "self_attn.q_proj.weight": normal(_STD["q"], q_out, qkv_in),
        prefix + "self_attn.k_proj.weight": normal(_STD["k"], kv_out, qkv_in),
        prefix + "self_attn.v_proj.weight": normal(_STD["v"], kv_out, qkv_in),
        prefix + "self_attn.o_proj.weight": normal(_STD["o"], hidden, q_out),
        prefix + "mlp.gate_proj.weight": normal(_STD["mlp"], inter, hidden),
        prefix + "mlp.up_proj.weight": normal(_STD["mlp"], inter, hidden),
        prefix + "mlp.down_proj.weight": normal(_STD["mlp"], hidden, inter),
    }
    if input_norm:
        tensors[prefix + "input_layernorm.weight"] = torch.ones(hidden)
    tensors[prefix + "post_attention_layernorm.weight"] = torch.ones(hidden)
    return tensors


def make_eagle_draft(directory: Path | str, *, eagle3: bool = False, seed: int = 4321) -> Path:
    """A one-layer EAGLE draft for ``make_model``'s target (its config's
    sizes), seeded random: EAGLE-1 (vLLM maps the Llama config to
    ``EagleLlamaForCausalLM``: ``layers.0.*`` without an input norm, and
    ``fc`` over the embedding and the target's hidden state) or, with
    ``eagle3``, EAGLE-3 (``LlamaForCausalLMEagle3``: q/k/v over both, ``fc``
    over the hidden states of the target's two layers, its own norm and
    head)."""
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG, num_hidden_layers=1)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    normal = _normal(seed)
    if eagle3:
        config.update(
            architectures=["LlamaForCausalLMEagle3"],
            draft_vocab_size=vocab,
            # (the target's two layers: two hidden states for fc)
            eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1],
                          "use_aux_hidden_state": True},
        )
        tensors = _layer(normal, config, "midlayer.", qkv_in=2 * hidden)
        tensors["midlayer.hidden_norm.weight"] = torch.ones(hidden)
        tensors["fc.weight"] = normal(0.1, hidden, 2 * hidden)
        tensors["norm.weight"] = torch.ones(hidden)
        tensors["lm_head.weight"] = normal(_STD["head"], vocab, hidden)
    else:
        tensors = _layer(normal, config, "layers.0.", qkv_in=hidden, input_norm=False)
        tensors["fc.weight"] = normal(0.1, hidden, 2 * hidden)
    _save(directory, tensors, config)
    return directory


def make_mtp_model(directory: Path | str, *, seed: int = 2468) -> Path:
    """A tiny MiMo checkpoint (``MiMoForCausalLM``: Qwen2 layers, q/k/v with
    biases) with one multi-token-prediction layer (``model.mtp_layers.0``),
    seeded random: vLLM's ``{"method": "mtp"}`` drafts with that layer."""
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG, architectures=["MiMoForCausalLM"], model_type="qwen2",
                  num_nextn_predict_layers=1)
    config.pop("head_dim")  # Qwen2: hidden / heads (32)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    normal = _normal(seed)

    layer_config = dict(config, head_dim=CONFIG["head_dim"])
    kv_out = config["num_key_value_heads"] * CONFIG["head_dim"]
    q_out = config["num_attention_heads"] * CONFIG["head_dim"]

    def layer(prefix: str) -> dict:
        tensors = _layer(normal, layer_config, prefix, qkv_in=hidden)
        tensors[prefix + "self_attn.q_proj.bias"] = normal(0.1, q_out)
        tensors[prefix + "self_attn.k_proj.bias"] = normal(0.1, kv_out)
        tensors[prefix + "self_attn.v_proj.bias"] = normal(0.1, kv_out)
        return tensors

    tensors = {"model.embed_tokens.weight": normal(_STD["embed"], vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        tensors.update(layer(f"model.layers.{i}."))
    mtp = "model.mtp_layers.0."
    tensors.update(layer(mtp))
    tensors[mtp + "token_layernorm.weight"] = torch.ones(hidden)
    tensors[mtp + "hidden_layernorm.weight"] = torch.ones(hidden)
    tensors[mtp + "final_layernorm.weight"] = torch.ones(hidden)
    tensors[mtp + "input_proj.weight"] = normal(0.1, hidden, 2 * hidden)
    tensors["model.norm.weight"] = torch.ones(hidden)
    tensors["lm_head.weight"] = normal(_STD["head"], vocab, hidden)
    _save(directory, tensors, config)
    return directory


#: Whisper's decoder prompt: <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>.
WHISPER_DECODER_PROMPT = [50258, 50259, 50359, 50363]


def make_whisper_model(directory: Path | str, *, seed: int = 1234, chunk_seconds: int = 4) -> Path:
    """A tiny Whisper checkpoint (transformers' ``WhisperForConditionalGeneration``:
    1 encoder layer, 2 decoder layers, d_model 64, head_dim 32) with its
    processor: a feature extractor whose audio window is ``chunk_seconds``
    (4 s: 400 mel frames, 200 encoder tokens, the encoder's positions), and a
    made-up tokenizer of Whisper's 51,865 ids whose special tokens sit at
    Whisper's ids (``WHISPER_DECODER_PROMPT``). Every weight but the norms'
    and biases is drawn again at an ordinary scale, so that the decoder's
    cross-attention reads the encoder's output: a wrong cross-attention
    block changes the tokens."""
    import torch
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    frames = chunk_seconds * 100
    config = WhisperConfig(
        vocab_size=51865, num_mel_bins=80, encoder_layers=1, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
        decoder_ffn_dim=128, d_model=64, max_source_positions=frames // 2,
        max_target_positions=448, decoder_start_token_id=WHISPER_DECODER_PROMPT[0],
    )
    model = WhisperForConditionalGeneration(config)
    normal = _normal(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                param.zero_()
            elif name.endswith("embed_positions.weight"):
                param.copy_(normal(0.3, *param.shape))
            elif name.endswith("embed_tokens.weight"):
                param.copy_(normal(1.0, *param.shape))
            else:  # projections and convolutions: std 3/sqrt(fan_in) (at 1.5, 29
                # of 32 clips gave one and the same token throughout)
                fan_in = param[0].numel()
                param.copy_(normal(3.0 / fan_in ** 0.5, *param.shape))
    model.save_pretrained(directory)
    # The tokenizer: byte-level symbols, filler tokens, then Whisper's
    # special tokens and timestamps at their ids (no merges: ids only).
    symbols = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + [
        chr(c) for c in range(174, 256)] + [chr(256 + i) for i in range(68)]
    vocab = {s: i for i, s in enumerate(symbols)}
    while len(vocab) < 50257:
        vocab[f"t{len(vocab)}"] = len(vocab)
    specials = (["<|endoftext|>", "<|startoftranscript|>", "<|en|>"]
                + [f"<|lang{i}|>" for i in range(98)]
                + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
                   "<|nocaptions|>", "<|notimestamps|>"])
    for s in specials:
        vocab[s] = len(vocab)
    while len(vocab) < config.vocab_size:
        vocab[f"<|{(len(vocab) - 50364) * 0.02:.2f}|>"] = len(vocab)
    assert [vocab[s] for s in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                               "<|notimestamps|>")] == WHISPER_DECODER_PROMPT
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = WhisperTokenizer(str(directory / "vocab.json"), str(directory / "merges.txt"))
    extractor = WhisperFeatureExtractor(feature_size=80, chunk_length=chunk_seconds)
    WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(directory)
    return directory
