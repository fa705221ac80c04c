"""The tiny local model the live vLLM tests load: a random Llama saved with transformers'
``save_pretrained`` and a BPE tokenizer trained here with ``tokenizers`` (no hub, no download).

    python -m fastpath_vllm_fixture.make_model OUT_DIR [--architecture NAME]

Deterministic (fixed seeds): the same directory every time. The architecture written into
config.json picks the vLLM model class: ``FastpathTinyLlamaForCausalLM`` (this fixture's plugin
model, with its switchable "fast path"; the default) or vLLM's own ``LlamaForCausalLM``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PLUGIN_ARCH = "FastpathTinyLlamaForCausalLM"
VOCAB = 512
# head_dim 64: a size every vLLM CPU attention backend supports.
SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=64, max_position_embeddings=1024)
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def _corpus() -> list[str]:
    # The suites' own prompt words plus JSON / digits, so structured outputs have short tokens.
    from fastpath.suite_helpers import prompt_text

    lines = [prompt_text(seed, 400) for seed in range(200)]
    lines += ['{"name": "ab", "age": 12, "ok": true, "tags": ["x", "y"]}', "0123456789 -+.,:;[]{}\"'"]
    return lines


def train_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_model(out: str | Path, architecture: str = PLUGIN_ARCH) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out)
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
                      tie_word_embeddings=False, torch_dtype="float32", **SHAPE)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger logits than the default init: sampling tests see a peaked softmax
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained writes the class's own name; vLLM picks its model class by this field
    cfg_path = out / "config.json"
    written = json.loads(cfg_path.read_text())
    written["architectures"] = [architecture]
    cfg_path.write_text(json.dumps(written, indent=2) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--architecture", default=PLUGIN_ARCH)
    a = ap.parse_args()
    print(make_model(a.out, a.architecture))


if __name__ == "__main__":
    main()
