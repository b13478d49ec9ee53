"""export_model: the merged standalone model gives base+adapter logits, in safetensors or legacy .bin."""

from __future__ import annotations

import pytest
import torch

from tests.support.model_steps import make_adapter
from tuneline.config import load_config
from tuneline.errors import ConfigError
from tuneline.export.merge import export_model
from tuneline.pipeline.records import TrainResult


def _config(tiny_model_dir, **keys):
    base = {"model_name_or_path": str(tiny_model_dir), "dataset": "unused"}
    return load_config(None, {**base, **keys}, check_paths=False)


def logits(model, batch):
    model.eval()
    with torch.no_grad():
        return model(**batch).logits


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    first = make_adapter(tiny_model_dir, root / "a1", seed=1, targets=("q_proj", "v_proj", "down_proj"))
    second = make_adapter(tiny_model_dir, root / "a2", seed=2, targets=("o_proj", "gate_proj"))
    return [str(first), str(second)]


def _reference_logits(tiny_model_dir, adapters, batch):
    """Base + adapters applied unmerged, one after the other."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for path in adapters[:-1]:
        model = PeftModel.from_pretrained(model, path).merge_and_unload()
    return logits(PeftModel.from_pretrained(model, adapters[-1]), batch)


@pytest.fixture(scope="module")
def batch():
    ids = torch.randint(4, 500, (2, 10), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.parametrize("legacy", [False, True])
def test_export_matches_base_plus_adapters(tiny_model_dir, adapters, batch, tmp_path, legacy):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = _config(tiny_model_dir, adapter_name_or_path=",".join(adapters), export_dir=str(tmp_path / "merged"),
                     export_legacy_format=legacy)
    out = export_model(config)
    names = {p.name for p in out.iterdir()}
    weights = {n for n in names if n.endswith((".safetensors", ".bin"))}
    assert weights == ({"pytorch_model.bin"} if legacy else {"model.safetensors"})
    assert {"config.json", "tokenizer.json", "chat_template.jinja"} <= names
    assert not any(p.name.startswith(".merged.tmp") for p in tmp_path.iterdir())
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    reference = _reference_logits(tiny_model_dir, adapters, batch)
    base = logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir), batch)
    assert (reference - base).abs().max() > 1e-2  # the adapters matter
    assert (logits(merged, batch) - reference).abs().max() < 1e-4
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("hello")["input_ids"] == AutoTokenizer.from_pretrained(tiny_model_dir)("hello")["input_ids"]
    export_model(config)  # an earlier export is replaced whole


def test_export_needs_an_export_dir_and_a_free_folder(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="'export_dir' is not set"):
        export_model(_config(tiny_model_dir))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files that no earlier export wrote"):
        export_model(_config(tiny_model_dir, export_dir=str(tmp_path / "busy")))
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_a_training_config_exports_what_the_training_saved(tiny_model_dir, adapters, batch, tmp_path):
    """`tuneline export` given the training config: its output_dir's finished training is merged in (here the
    second adapter stands for the one trained on top of the first, named by adapter_name_or_path)."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    shutil.copytree(adapters[1], out)
    config = _config(tiny_model_dir, adapter_name_or_path=adapters[0], create_new_adapter=True,
                     output_dir=str(out), export_dir=str(tmp_path / "merged"))
    (out / "run.json").write_text(json.dumps({"status": "running"}))
    with pytest.raises(ConfigError, match="holds no finished training") as refused:
        export_model(_config(tiny_model_dir, output_dir=str(out), export_dir=str(tmp_path / "merged")))
    assert "adapter_name_or_path" in str(refused.value) and not (tmp_path / "merged").exists()
    (out / "run.json").write_text(json.dumps({"status": "complete"}))
    merged = AutoModelForCausalLM.from_pretrained(export_model(config))
    assert (logits(merged, batch) - _reference_logits(tiny_model_dir, adapters, batch)).abs().max() < 1e-4
    assert json.loads((tmp_path / "merged" / "tuneline_export.json").read_text())["trained_in"] == str(out)


def test_a_training_config_exports_its_mlflow_run_when_output_dir_is_gone(
        tiny_model_dir, adapters, batch, demo_data_dir, empty_mlflow_store, tmp_path):
    """The flow's own record of a finished training (start_run, record_training, record_results against a real
    SQLite store), then its output_dir deleted: export fetches the model the run logged. Another config's work
    (other data) has no run, and is refused rather than exporting the base."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    from tuneline.content.records import Evaluation
    from tuneline.identity import keys
    from tuneline.pipeline.record import record_results, record_training, start_run

    db = tmp_path / "mlflow.db"
    shutil.copyfile(empty_mlflow_store, db)
    out = tmp_path / "out"
    shutil.copytree(adapters[1], out)
    keys_ = dict(adapter_name_or_path=adapters[0], create_new_adapter=True, output_dir=str(out),
                 export_dir=str(tmp_path / "merged"), dataset="demo_sft", dataset_dir=str(demo_data_dir),
                 mlflow_tracking_uri=f"sqlite:///{db}")
    config = _config(tiny_model_dir, **keys_)
    dataset_fp = keys.dataset_key(config)
    run = start_run(config, dataset_fp, None, None)
    record_training(run, config, TrainResult(str(out), "trained-here"))
    record_results(run, config, Evaluation("base"), Evaluation("tuned"), dataset_fp)
    shutil.rmtree(out)

    other = _config(tiny_model_dir, **{**keys_, "dataset": "demo_sharegpt", "adapter_name_or_path": None,
                                       "create_new_adapter": False})
    with pytest.raises(ConfigError, match="no finished run of this config"):
        export_model(other)
    from tuneline.pipeline.record import logged_model

    # the same training with other logging: not the exact work the finished run did, so not its result
    assert logged_model(_config(tiny_model_dir, **keys_, logging_steps=7), tmp_path / "scratch") is None
    merged = AutoModelForCausalLM.from_pretrained(export_model(config))
    assert (logits(merged, batch) - _reference_logits(tiny_model_dir, adapters, batch)).abs().max() < 1e-4
    record = json.loads((tmp_path / "merged" / "tuneline_export.json").read_text())
    assert record["trained_in"] == f"mlflow run {run.run_id}"


def test_an_oft_adapter_exports_merged_like_a_lora_one(tiny_model_dir, batch, tmp_path):
    """finetuning_type: oft saves a peft adapter: export (and evaluation, which loads the same way) merges it."""
    from peft import OFTConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           OFTConfig(r=0, oft_block_size=8, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "oft_" in name:
                param.normal_(std=0.2)  # away from OFT's identity start, so the adapter changes the logits
    model.save_pretrained(str(tmp_path / "oft"))
    out = export_model(_config(tiny_model_dir, finetuning_type="oft", adapter_name_or_path=str(tmp_path / "oft"),
                               export_dir=str(tmp_path / "merged")))
    merged = AutoModelForCausalLM.from_pretrained(out)
    reference = _reference_logits(tiny_model_dir, [str(tmp_path / "oft")], batch)
    assert (reference - logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir), batch)).abs().max() > 1e-2
    assert (logits(merged, batch) - reference).abs().max() < 1e-4


def test_a_reward_models_adapter_exports_as_a_scorer_with_its_head(tiny_model_dir, batch, tmp_path):
    """An rm run's SEQ_CLS adapter (score head in modules_to_save) exports as a one-label sequence classifier whose
    scores are the adapter's, even from an export config that does not say 'stage: rm'."""
    from peft import LoraConfig, PeftModel, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(4)
    scorer = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1, pad_token_id=0)
    peft_config = LoraConfig(task_type=TaskType.SEQ_CLS, r=4, target_modules=["q_proj"], init_lora_weights=False)
    get_peft_model(scorer, peft_config).save_pretrained(str(tmp_path / "rm"))
    out = export_model(_config(tiny_model_dir, adapter_name_or_path=str(tmp_path / "rm"),
                               export_dir=str(tmp_path / "merged")))
    merged = AutoModelForSequenceClassification.from_pretrained(out)
    base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1, pad_token_id=0)
    reference = logits(PeftModel.from_pretrained(base, str(tmp_path / "rm")), batch)
    assert reference.shape == (2, 1)
    assert (logits(merged, batch) - reference).abs().max() < 1e-4
