"""Build the ``tiny_gpt`` and ``tiny_embed`` demo models offline: a tokenizer and a tiny GPT-2.

Nothing is downloaded. A byte-level BPE tokenizer is trained with
``tokenizers`` on text shipped in this repository (README.md and
docs/architecture.md), and a GPT-2 of two layers (about 0.2 M parameters) is
trained briefly on the same text with ``transformers`` and torch, seeded.
It writes, under ``appliance/demos/llm``::

    tiny_gpt/1/config.json, model.safetensors   the causal language model
    tiny_gpt/tokenizer/                         tokenizer.json, tokenizer_config.json
                                                (with a chat template)
    tiny_embed/1/ and tiny_embed/tokenizer/     the same weights and tokenizer, which
                                                tiny_embed's model.py mean-pools

Every output is committed, so serving and the tests need no training. Run it
at the repository root with the appliance's venv (``make install``)::

    .venv/bin/python tools/make_tiny_gpt.py [--steps 400]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = [ROOT / "README.md", ROOT / "docs" / "architecture.md"]
DEMOS = ROOT / "appliance" / "demos" / "llm"
VOCAB = 512
CONTEXT = 128
EOS = "<|endoftext|>"
# ChatML-like turns, which a completion of "<|assistant|>" continues.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(args.seed)
    text = "\n\n".join(path.read_text() for path in CORPUS)

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS, "<|system|>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator([text], trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=EOS, bos_token=EOS, unk_token=EOS
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=CONTEXT,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = GPT2LMHeadModel(config)
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(ids) - CONTEXT - 1, (16,))
        batch = torch.stack([ids[s : s + CONTEXT] for s in starts])
        loss = model(batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.3f}")
    model.eval()

    for name in ("tiny_gpt", "tiny_embed"):
        weights = DEMOS / name / "1"
        model.save_pretrained(weights, safe_serialization=True)
        for extra in weights.glob("generation_config.json"):
            extra.unlink()
        tokenizer_dir = DEMOS / name / "tokenizer"
        shutil.rmtree(tokenizer_dir, ignore_errors=True)
        tokenizer.save_pretrained(tokenizer_dir)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"wrote tiny_gpt and tiny_embed under {DEMOS} ({parameters} parameters)")


if __name__ == "__main__":
    main()
