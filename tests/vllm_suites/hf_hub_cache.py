"""Write a Hugging Face hub cache holding the model configurations that vLLM's
scheduler tests build their ``ModelConfig`` from, for runs that are offline
(``HF_HUB_OFFLINE=1``, ``HF_HOME=DIR``).

usage: python hf_hub_cache.py DIR

``tests/v1/core/utils.py``'s ``create_scheduler`` (and the tests that call
it, in ``test_scheduler.py`` and in the pool files) defaults to
``facebook/opt-125m``. Offline, vLLM's ``ModelConfig`` reads only that
repository's ``config.json`` from the cache (and looks for
``hf_quant_config.json``, ``modules.json`` and ``sentence_*_config.json``,
which the published repository does not have either); no tokenizer, no
weights: the tests build schedulers, not models. The file below is the
published one, field for field. The snapshot's revision is not the hub's
commit (offline, ``refs/main`` only has to name the snapshot): it is the
SHA-1 of the files written, so a changed file is a new snapshot.

``test_priority_preemption_bug.py`` builds its scheduler from
``facebook/opt-350m``; its ``config.json`` is here too.

Not here: ``Qwen/Qwen2.5-VL-3B-Instruct`` (``test_priority_scheduler_random.py``):
with its configuration in the cache its tests still fail stock ("Model
architectures ['Qwen2_5_VLForConditionalGeneration'] failed to be
inspected", vLLM 0.32.0, 2026-12-06), for the reason below. Nor
``llava-hf/llava-1.5-7b-hf`` (test_scheduler's multimodal tests):
vLLM inspects its architecture by importing the Llava model module, which
needs ``torchvision`` (not in the test environment: the builds on this
machine's disk are CUDA builds, which break vLLM's import), and its
processor's tokenizer files for the encoder budget. Those tests fail
stock, offline, and are counted as wanting a hub (``compare.py``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

# facebook/opt-125m's config.json as published (last saved by transformers
# 4.21: no enable_bias, layer_norm_elementwise_affine or
# _remove_final_layer_norm, whose defaults OPTConfig supplies).
OPT_125M = {
    "_name_or_path": "facebook/opt-125m",
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "dropout": 0.1,
    "eos_token_id": 2,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "init_std": 0.02,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}

# facebook/opt-350m's config.json as published (test_priority_preemption_bug.py
# builds its scheduler from it): the one OPT whose decoder projects its
# 1,024-wide hidden state to 512-wide embeddings and norms after each layer.
OPT_350M = {
    "_name_or_path": "facebook/opt-350m",
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": False,
    "dropout": 0.1,
    "eos_token_id": 2,
    "ffn_dim": 4096,
    "hidden_size": 1024,
    "init_std": 0.02,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.20.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 512,
}

#: repository -> {file name: JSON content}
REPOSITORIES = {"facebook/opt-125m": {"config.json": OPT_125M},
                "facebook/opt-350m": {"config.json": OPT_350M}}


def write(home: Path) -> list[Path]:
    """Lay out ``home/hub`` as huggingface_hub's cache does; the snapshot
    directories written."""
    snapshots = []
    for repo, files in REPOSITORIES.items():
        texts = {name: json.dumps(content, indent=2) + "\n" for name, content in files.items()}
        revision = hashlib.sha1(json.dumps(texts, sort_keys=True).encode()).hexdigest()
        root = home / "hub" / ("models--" + repo.replace("/", "--"))
        snapshot = root / "snapshots" / revision
        snapshot.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (snapshot / name).write_text(text)
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / "main").write_text(revision)
        snapshots.append(snapshot)
    return snapshots


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    for path in write(Path(sys.argv[1])):
        print(path)
