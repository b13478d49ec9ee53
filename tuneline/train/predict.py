"""`predict_with_generate`: answer every evaluation prompt, write generated_predictions.jsonl, score the text.

Prompts are left-padded so every row's answer starts at the same column."""

from __future__ import annotations

import json
from pathlib import Path

from tuneline.evaluation.generation import eos_token_ids, generate_batches, split_prompt_answer, text_metrics
from tuneline.training_contract import PREDICTIONS_FILE

# text_metrics key -> LLaMA-Factory's metric name (reported x100 as it does)
METRIC_NAMES = {"rouge1": "rouge-1", "rouge2": "rouge-2", "rougeL": "rouge-l", "bleu4": "bleu-4",
                "exact_match": "exact_match"}


def generation_config(config, tokenizer, eos_ids: set[int]):
    from transformers import GenerationConfig

    gen = config.generating
    beams = config.training.get("generation_num_beams") or gen.num_beams
    max_new = config.training.get("generation_max_length") or gen.max_new_tokens
    sampling = {"temperature": gen.temperature, "top_p": gen.top_p, "top_k": gen.top_k} if gen.do_sample else {}
    return GenerationConfig(do_sample=gen.do_sample, num_beams=beams, max_new_tokens=max_new,
                            repetition_penalty=gen.repetition_penalty, length_penalty=gen.length_penalty,
                            pad_token_id=tokenizer.pad_token_id, eos_token_id=sorted(eos_ids) or None, **sampling)


def predict_with_generate(trainer, config, dataset, tokenizer) -> dict[str, float]:
    """Write `<output_dir>/generated_predictions.jsonl` and return predict_rouge-*/predict_bleu-4 (main process)."""
    if dataset is None or not config.training.get("predict_with_generate") or not trainer.is_world_process_zero():
        return {}
    model = trainer.accelerator.unwrap_model(trainer.model)
    eos_ids = eos_token_ids(tokenizer, model)
    pairs = [split_prompt_answer(row["input_ids"], row["labels"], eos_ids) for row in dataset]
    pairs = [p for p in pairs if p is not None]
    settings = generation_config(config, tokenizer, eos_ids)
    answers = generate_batches(model, [p for p, _ in pairs], settings, tokenizer.pad_token_id, eos_ids,
                               trainer.args.per_device_eval_batch_size)
    skip = config.generating.skip_special_tokens
    records = [{"prompt": tokenizer.decode(prompt, skip_special_tokens=skip),
                "label": tokenizer.decode(label, skip_special_tokens=skip),
                "prediction": tokenizer.decode(answer, skip_special_tokens=skip)}
               for (prompt, label), answer in zip(pairs, answers, strict=True)]
    path = Path(trainer.args.output_dir) / PREDICTIONS_FILE
    with path.open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    scores = text_metrics([r["prediction"] for r in records], [r["label"] for r in records])
    metrics = {f"predict_{METRIC_NAMES[k]}": round(100.0 * v, 4) for k, v in scores.items()}
    trainer.log_metrics("predict", metrics)
    trainer.save_metrics("predict", metrics)
    return metrics
