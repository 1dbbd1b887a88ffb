"""Write a small random-weight Llama that real engines load offline (``--load-format dummy``).

    python -m realengines.model OUT_DIR [--dims VOCAB,HIDDEN,LAYERS,HEADS,KV_HEADS,INTERMEDIATE]

OUT_DIR receives a Hugging Face Llama ``config.json`` (float32), ``generation_config.json``,
random weights in ``model.safetensors`` (HF parameter names) and a byte-level BPE tokenizer
trained in memory on synthetic text (``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``). No hub access. Deterministic for given dims (seed 0).

The default shape (vocab 1024, hidden 256, 4 layers, 4 heads / 2 KV heads, intermediate 512:
2.9 M parameters) makes the forward of a small batch cost about as much as the scheduler's own
CPU work on one core, which is the regime where the overlap question is interesting.

Runs in an engine's environment (needs numpy, tokenizers, safetensors).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_DIMS = (1024, 256, 4, 4, 2, 512)
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")
_WORDS = ("the a of to and in is it that for on with as was he she they we you this model token batch server "
          "request decode prefill cache scheduler overlap hello world").split()


def train_tokenizer(vocab_size: int, seed: int = 0):
    """A byte-level BPE tokenizer of at most ``vocab_size`` tokens (BOS prepended)."""
    import numpy as np
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = np.random.default_rng(seed)
    corpus = [" ".join(rng.choice(_WORDS, size=50)) + ". " + "".join(chr(c) for c in rng.integers(32, 127, size=40))
              for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, more than the vocab {vocab_size}")
    return tok


def llama_config(dims: tuple[int, ...], bos: int, eos: int) -> dict:
    vocab, hidden, layers, heads, kv_heads, inter = dims
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
            "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
            "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
            "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": None, "torch_dtype": "float32",
            "dtype": "float32", "initializer_range": 0.02, "use_cache": True}


def random_weights(dims: tuple[int, ...], seed: int = 0) -> dict:
    """float32 weights in Hugging Face Llama names (normal, std 0.02; norms 1)."""
    import numpy as np

    vocab, hidden, layers, heads, kv_heads, inter = dims
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def mat(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = mat(heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = mat(kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = mat(kv_heads * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = mat(hidden, heads * head_dim)
        w[p + "mlp.gate_proj.weight"] = mat(inter, hidden)
        w[p + "mlp.up_proj.weight"] = mat(inter, hidden)
        w[p + "mlp.down_proj.weight"] = mat(hidden, inter)
        w[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    w["model.norm.weight"] = np.ones(hidden, np.float32)
    w["lm_head.weight"] = mat(vocab, hidden)
    return w


def write_model(out_dir: str | Path, dims: tuple[int, ...] = DEFAULT_DIMS) -> dict:
    """Write the model folder; returns its config. Raises ValueError for inconsistent dims."""
    from safetensors.numpy import save_file

    vocab, hidden, layers, heads, kv_heads, inter = dims
    if min(dims) < 1 or hidden % heads or heads % kv_heads:
        raise ValueError(f"bad dims {dims}: all positive, hidden % heads == 0, heads % kv_heads == 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "</s>", "model_max_length": 4096, "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}"}, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    config = llama_config(dims, bos, eos)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}))
    weights = random_weights(dims)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["num_parameters"] = int(sum(x.size for x in weights.values()))
    return config


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--dims", default=",".join(map(str, DEFAULT_DIMS)),
                    help="VOCAB,HIDDEN,LAYERS,HEADS,KV_HEADS,INTERMEDIATE")
    args = ap.parse_args(argv)
    dims = tuple(int(x) for x in args.dims.split(","))
    if len(dims) != 6:
        ap.error("--dims: expected 6 comma-separated integers")
    config = write_model(args.out_dir, dims)
    print(json.dumps({"model_dir": str(args.out_dir), "num_parameters": config["num_parameters"]}))


if __name__ == "__main__":
    main()
