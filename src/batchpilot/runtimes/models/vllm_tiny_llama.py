"""Write the tiny model the vLLM engine serves in the `runtimes` tier: a two-layer
Llama-architecture causal LM with random weights and a word-level tokenizer, both made
here (nothing is downloaded). It runs inside the engine's own environment, which has
`transformers` and `tokenizers` (never imported by BatchPilot itself):

    python vllm_tiny_llama.py FOLDER

The vocabulary holds the words the load generator's prompts are made of (the request's
position, then " hello" repeated: loadgen.streaming), so a prompt of P words is P tokens;
every other id the random weights may sample decodes to a word of its own, so every
generated token is one streamed piece of text. A head size of 64 is one the CPU
attention kernels support; float32 because bfloat16 needs AVX-512 there."""

from __future__ import annotations

import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # type: ignore[import-not-found]
from transformers import (  # type: ignore[import-not-found]
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    set_seed,
)

VOCAB_SIZE = 1024
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
# positions up to this many requests per run stay single tokens
POSITIONS = 512


def vocabulary() -> dict[str, int]:
    words = [*SPECIALS, "hello", *(str(i) for i in range(POSITIONS))]
    words += [f"w{i}" for i in range(VOCAB_SIZE - len(words))]
    return {word: i for i, word in enumerate(words)}


def write(folder: str) -> None:
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # joins the decoded words with spaces, so each streamed token is " word"
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    # chat completions need a template; the messages' text, nothing around it
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(folder)
    set_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(folder)


if __name__ == "__main__":
    write(sys.argv[1])
