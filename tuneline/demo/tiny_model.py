"""An offline tiny Llama and byte-level BPE tokenizer for tests and the demo: `tuneline tiny-model OUT_DIR`.

No machine here reaches a model hub, so tests and the demo build their own model. Same arguments, same bytes."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_CORPUS_DIR = Path(__file__).resolve().parents[1] / "data"

# Keyword sets for build_tiny_model: "test" keeps the suite fast, "demo" is big enough to learn the demo tasks.
TINY_PRESETS: dict[str, dict[str, int]] = {
    "test": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
    "demo": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
    # About half a billion parameters (all in the layers: the vocabulary stays the tiny one), for the GPU check
    # (benchmarks/gpu_check.py): large enough that a step's matmuls, not its overheads, set the GPU's pace.
    "half-b": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 21, "num_attention_heads": 20,
               "num_key_value_heads": 4, "max_position_embeddings": 2048},
}

PAD_TOKEN, BOS_TOKEN, IM_START, IM_END = "<|pad|>", "<|bos|>", "<|im_start|>", "<|im_end|>"
# Order fixes their ids: pad 0, bos 1, im_start 2, im_end 3. im_end doubles as eos so generation stops
# at the end of an assistant turn, as in ChatML models.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, IM_START, IM_END)

# ChatML-like: system (plus tool schemas), user, assistant (with tool calls), tool/observation turns. The
# {% generation %} markers let `return_assistant_tokens_mask` find the tokens an SFT loss should train on.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}{%- set ns.system = messages[0]['content'] -%}"
    "{%- endif -%}"
    "{%- if tools -%}{%- set ns.system = (ns.system ~ '\\n\\n' if ns.system else '') ~ 'Tools: ' ~ "
    "(tools | tojson) -%}{%- endif -%}"
    "{%- if ns.system -%}{{- '<|im_start|>system\\n' ~ ns.system ~ '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = message['role'] -%}"
    "{%- if role == 'system' and loop.first -%}"
    "{%- elif role == 'assistant' or role == 'function_call' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{%- if role == 'function_call' -%}{{- '<tool_call>' ~ message['content'] ~ '</tool_call>' -}}"
    "{%- else -%}{{- message['content'] or '' -}}{%- endif -%}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{{- '<tool_call>' ~ ((call['function'] if 'function' in call else call) | tojson) ~ '</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- elif role == 'tool' or role == 'observation' -%}"
    "{{- '<|im_start|>tool\\n' ~ message['content'] ~ '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' ~ role ~ '\\n' ~ message['content'] ~ '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Role names and markup the chat template writes, so the tokenizer learns merges for them too.
_TEMPLATE_TEXT = ["system\n", "user\n", "assistant\n", "tool\n", "<tool_call>", "</tool_call>", "Tools: "]


def train_tokenizer(texts: list[str], vocab_size: int, max_length: int, extra_tokens: tuple[str, ...] = (),
                    named_tokens: dict[str, str] | None = None, eos_token: str = IM_END,
                    chat_template: str = CHAT_TEMPLATE):
    """Byte-level BPE over `texts` (digits split one by one so numbers stay compositional), wrapped for HF.

    `extra_tokens` are special tokens after the four of every tiny model (a vision family's image markers);
    `named_tokens` makes some of them tokenizer attributes (`tokenizer.image_token`), which processors read."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[*SPECIAL_TOKENS, *extra_tokens], min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts + _TEMPLATE_TEXT * 8, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS_TOKEN, eos_token=eos_token, pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, *extra_tokens], model_max_length=max_length, padding_side="right",
        **({"model_specific_special_tokens": named_tokens} if named_tokens else {}),
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def _build_model(tokenizer, vocab_size: int, seed: int, **sizes):
    """Seeded random Llama whose special-token ids match the tokenizer's."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=False, **ids, **sizes)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    return model


def build_tiny_model(
    out_dir: str | Path, *, hidden_size: int = 64, intermediate_size: int = 128, num_hidden_layers: int = 2,
    num_attention_heads: int = 4, num_key_value_heads: int = 2, vocab_size: int = 512,
    max_position_embeddings: int = 1024, seed: int = 0, corpus_dir: str | Path | None = None,
    initializer_range: float | None = None,
) -> Path:
    """Build the tiny model and tokenizer into `out_dir` (replaced whole, never left half-written).

    `initializer_range` defaults to 1/sqrt(hidden_size), not Llama's 0.02: with a frozen lm_head and final norm
    (LoRA) the logits of a 0.02 init stay within about +-1, so no adapter could ever make an answer likely.
    """
    from tuneline.demo.demo_data import corpus_texts

    out = Path(out_dir).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus_texts(corpus_dir or DEFAULT_CORPUS_DIR), vocab_size, max_position_embeddings)
    if len(tokenizer) > vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens but vocab_size is {vocab_size}")
    model = _build_model(
        tokenizer, vocab_size, seed, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range or hidden_size**-0.5,
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def replace_dir(new: Path, target: Path) -> None:
    """Swap `new` in at `target`; an existing `target` is moved aside first and deleted after."""
    new.chmod(0o755)
    for path in new.iterdir():
        path.chmod(0o644)
    if not target.exists():
        os.replace(new, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    os.replace(target, old / target.name)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)
