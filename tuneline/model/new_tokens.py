"""New tokens (`add_tokens`, `add_special_tokens`, `new_special_tokens_config`): added to the tokenizer, then given
embedding rows, started as `init_special_tokens` says (LLaMA-Factory's three ways).

noise_init: the mean of the old rows plus Gaussian noise of standard deviation 1/sqrt(hidden size), for every row
the resize adds (rows of padding to a multiple of 64 included). desc_init: a described token's row is the mean of
the input embeddings of its description's tokens (old tokens only); desc_init_w_noise adds the same noise. The
output layer, where it is not tied to the input embeddings, is started the same way."""

from __future__ import annotations

import logging
import math

from tuneline.config.feature_keys import token_descriptions
from tuneline.config.run_config import split_names

logger = logging.getLogger("tuneline")


def special_tokens(model_args) -> list[str]:
    """The special tokens to add: the described ones of `new_special_tokens_config`, else `add_special_tokens`."""
    return list(token_descriptions(model_args.new_special_tokens_config)) or split_names(model_args.add_special_tokens)


def add_new_tokens(tokenizer, model_args) -> None:
    """Ordinary tokens first, then special ones, as LLaMA-Factory adds them; load_model grows the embeddings."""
    ordinary = split_names(model_args.add_tokens)
    if ordinary:
        tokenizer.add_tokens(ordinary, special_tokens=False)
    special = special_tokens(model_args)
    if special:
        tokenizer.add_special_tokens({"extra_special_tokens": special}, replace_extra_special_tokens=False)
    if model_args.model_max_length and (tokenizer.model_max_length or 0) < model_args.model_max_length:
        tokenizer.model_max_length = model_args.model_max_length


def grows_vocab(model_args) -> bool:
    """New tokens need new embedding rows: `resize_vocab`, or any key that adds tokens (which implies it)."""
    return bool(model_args.resize_vocab or model_args.add_special_tokens or model_args.add_tokens
                or model_args.new_special_tokens_config)


def grow_embeddings(model, tokenizer, model_args) -> None:
    """Embedding rows for the tokenizer's new tokens, started as `init_special_tokens` says."""
    import torch

    old_rows = model.get_input_embeddings().weight.shape[0]
    if not grows_vocab(model_args) or old_rows >= len(tokenizer):
        return
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64, mean_resizing=False)
    descriptions = token_descriptions(model_args.new_special_tokens_config)
    method = model_args.init_special_tokens if descriptions else "noise_init"
    source = model.get_input_embeddings().weight
    described = {tokenizer.convert_tokens_to_ids(token): _description_ids(tokenizer, text, old_rows)
                 for token, text in descriptions.items()} if method != "noise_init" else {}
    with torch.no_grad():
        starts = {row: source[ids].mean(dim=0) if len(ids) else source[:old_rows].mean(dim=0)
                  for row, ids in described.items()}
        weights = [source]
        output = model.get_output_embeddings()
        if output is not None and not model.config.get_text_config().tie_word_embeddings:
            weights.append(output.weight)
        for weight in weights:
            _start_rows(weight, old_rows, starts, noise=method == "desc_init_w_noise")
    logger.info("grew the embeddings from %d to %d rows for %d tokens (%s)", old_rows,
                model.get_input_embeddings().weight.shape[0], len(tokenizer) - old_rows, method)


def _description_ids(tokenizer, text: str, old_rows: int) -> list[int]:
    return [i for i in tokenizer(text, add_special_tokens=False)["input_ids"] if i < old_rows]


def _start_rows(weight, old_rows: int, starts: dict, noise: bool) -> None:
    """Every row from `old_rows` on: the old rows' mean plus noise; then each described token's row its start, plus
    noise unless `noise` is false (desc_init)."""
    import torch

    scale = 1 / math.sqrt(weight.shape[1])
    new = weight[old_rows:]
    new.copy_(weight[:old_rows].mean(dim=0, keepdim=True) + torch.randn_like(new) * scale)
    for row, start in starts.items():
        weight[row] = start + (torch.randn_like(start) * scale if noise else 0)
