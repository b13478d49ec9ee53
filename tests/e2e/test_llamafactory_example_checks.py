"""LLaMA-Factory 0.9.5's example configs before a run: each passes the checks `tuneline validate` makes, and what
tuneline does not build (LLaMA Pro, Ray, a hub dataset, unreadable images) is refused up front, by name. The
trainings themselves run in tests/acceptance."""

import shutil

from tests.support.llamafactory_examples import LLAMAFACTORY, STEPS, TRAINED, VALIDATED, tiny_model_overrides


def test_every_example_config_passes_the_checks_made_before_a_run(checkout, tiny_model_dir, monkeypatch):
    """What `tuneline validate` checks (keys, ranges, template, paths, packages), for every example: in `make test`,
    while the trainings themselves run in `make acceptance`."""
    from tuneline.pipeline.preflight import checked_config

    monkeypatch.chdir(checkout)
    for example in TRAINED:
        config = checked_config(example, [*tiny_model_overrides(example, tiny_model_dir), "output_dir=saves/check"])
        assert config.data.dataset and config.has_validation == (example in VALIDATED), example


def test_a_method_tuneline_has_not_built_is_refused_before_anything_starts(checkout, tiny_model_dir, monkeypatch,
                                                                          capsys):
    from cli.main import run

    monkeypatch.chdir(checkout)
    out = checkout / "saves" / "llama_pro"
    assert run(["train", "examples/extras/llama_pro/llama3_freeze_sft.yaml", f"model_name_or_path={tiny_model_dir}",
                f"output_dir={out}", f"max_steps={STEPS}"]) == 2
    refused = capsys.readouterr().err
    assert "use_llama_pro" in refused and "does not support" in refused and "Traceback" not in refused
    assert not out.exists()


def test_the_dpo_vision_example_is_refused_up_front_without_its_hub_dataset(checkout, tiny_vlm, monkeypatch, capsys):
    """Its `rlhf_v` is a hub dataset with images, read only from a local copy (see local_rlhf_v), which
    LLaMA-Factory's data folder does not hold."""
    from cli.main import run

    monkeypatch.chdir(checkout)
    out = checkout / "saves" / "refused"
    assert run(["train", "examples/train_lora/qwen3vl_lora_dpo.yaml", f"model_name_or_path={tiny_vlm('qwen3_vl')}",
                f"output_dir={out}", f"max_steps={STEPS}"]) == 2
    refused = capsys.readouterr().err
    assert "dataset 'rlhf_v'" in refused and "llamafactory/RLHF-V" in refused and "Traceback" not in refused
    assert not out.exists()


def test_bad_images_end_the_run_before_training_naming_their_rows(prefect_api, tiny_vlm, tmp_path, monkeypatch,
                                                                   capsys):
    from cli.main import run

    shutil.copytree(LLAMAFACTORY, tmp_path, dirs_exist_ok=True)
    images = tmp_path / "data" / "mllm_demo_data"
    (images / "2.jpg").write_bytes((images / "2.jpg").read_bytes()[:2000])  # a truncated JPEG
    (images / "3.jpg").unlink()
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "saves" / "bad"
    assert run(["train", "examples/train_lora/qwen3vl_lora_sft.yaml", f"model_name_or_path={tiny_vlm('gemma3')}",
                "template=gemma3", f"output_dir={out}", f"max_steps={STEPS}"]) == 2
    refused = capsys.readouterr().err
    assert "mllm_demo.json" in refused and "Traceback" not in refused
    assert "bad image" in refused and "2.jpg" in refused and "media file missing" in refused
    assert not (out / "trainer_log.jsonl").exists()
