"""`do_predict` / `predict_with_generate`: answer every validation prompt under the generating keys and score the
answers as LLaMA-Factory does; the lines of generated_predictions.jsonl are its (prompt, predict, label).

Prompts are left-padded so every row's answer starts at the same column."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tuneline.content.records import BuiltDataset
from tuneline.evaluation.generation import eos_token_ids, generate_batches, split_prompt_answer
from tuneline.evaluation.similarity import similarity_metrics


def generation_config(config, tokenizer, eos_ids: set[int]):
    """LLaMA-Factory's GeneratingArguments as a GenerationConfig; `generation_max_length` and
    `generation_num_beams` (Seq2SeqTrainingArguments) win where set, as in its trainer."""
    from transformers import GenerationConfig

    gen = config.generating
    beams = config.training.get("generation_num_beams") or gen.num_beams
    max_new = config.training.get("generation_max_length") or gen.max_new_tokens
    sampling = {"temperature": gen.temperature, "top_p": gen.top_p, "top_k": gen.top_k} if gen.do_sample else {}
    return GenerationConfig(do_sample=gen.do_sample, num_beams=beams, max_new_tokens=max_new,
                            repetition_penalty=gen.repetition_penalty, length_penalty=gen.length_penalty,
                            pad_token_id=tokenizer.pad_token_id, eos_token_id=sorted(eos_ids) or None, **sampling)


def predict_rows(config, model, tokenizer, data, batch_size: int, row_inputs=None) -> tuple[list[dict], dict]:
    """(records, metrics): one {"prompt", "predict", "label"} per row that has an answer to compare with, in the
    rows' order, and predict_rouge-1/2/l and predict_bleu-4 over them. `row_inputs(prompts, rows)`: the media
    inputs of those rows (see EvalContext.row_inputs)."""
    eos_ids = eos_token_ids(tokenizer, model)
    pairs, rows = [], []
    for row, (input_ids, labels) in enumerate(zip(data["input_ids"], data["labels"], strict=True)):
        split = split_prompt_answer(input_ids, labels, eos_ids)
        if split is not None:
            pairs.append(split)
            rows.append(row)
    prompts = [prompt for prompt, _ in pairs]
    answers = generate_batches(model, prompts, generation_config(config, tokenizer, eos_ids),
                               tokenizer.pad_token_id, eos_ids, batch_size,
                               row_inputs(prompts, rows) if row_inputs else None)
    skip = config.generating.skip_special_tokens
    records = [{"prompt": tokenizer.decode(prompt, skip_special_tokens=False),
                "predict": tokenizer.decode(answer, skip_special_tokens=skip),
                "label": tokenizer.decode(label, skip_special_tokens=skip)}
               for (prompt, label), answer in zip(pairs, answers, strict=True)]
    # LLaMA-Factory scores the text without special tokens whatever skip_special_tokens says for the file
    scored = [(tokenizer.decode(a, skip_special_tokens=True), tokenizer.decode(label, skip_special_tokens=True))
              for (_, label), a in zip(pairs, answers, strict=True)]
    return records, similarity_metrics([p for p, _ in scored], [label for _, label in scored])


def write_predictions(path: str | os.PathLike, records: list[dict[str, Any]]) -> Path:
    """generated_predictions.jsonl, written to a temporary name and renamed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    os.replace(tmp, path)
    return path


def run_prediction(config, dataset_ref: BuiltDataset | dict[str, Any], adapter_dir: str | None) -> tuple[list[dict], dict]:
    """Predict with the model at adapter_dir (or the base and its `adapter_name_or_path`) on the validation split."""
    from tuneline.evaluation.run import eval_context

    ctx = eval_context(config, dataset_ref, adapter_dir)
    return predict_rows(config, ctx.model, ctx.tokenizer, ctx.data, ctx.batch_size, ctx.row_inputs)
