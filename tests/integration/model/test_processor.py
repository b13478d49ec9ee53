"""The processor: None for a text model, the family's for a vision-language one (a Qwen-VL processor's image half
where torchvision does not load, a clear refusal for any other), and saved into every checkpoint by a real Trainer
through SaveProcessorCallback."""

from __future__ import annotations

import pytest

from tuneline.config import load_config
from tuneline.errors import UserError


def model_keys(folder) -> dict:
    return load_config(None, {"model_name_or_path": str(folder), "dataset": "x"}, check_paths=False)


def test_a_text_model_has_no_processor(tiny_model_dir):
    from tuneline.model import load_processor

    assert load_processor(model_keys(tiny_model_dir)) is None


def test_a_vision_language_model_loads_its_processor_with_the_given_tokenizer(tiny_vlm):
    from tuneline.model import load_processor, load_tokenizer

    config = model_keys(tiny_vlm("gemma3"))
    tokenizer = load_tokenizer(config.model)
    processor = load_processor(config, tokenizer)
    assert type(processor).__name__ == "Gemma3Processor" and processor.tokenizer is tokenizer
    assert processor.image_seq_length == 4 and processor.image_processor.size["height"] == 32
    assert type(load_processor(config.model)).__name__ == "Gemma3Processor"  # its ModelArgs do as well


@pytest.mark.parametrize("preset", ["qwen2_vl", "qwen3_vl"])
def test_a_qwen_processor_loads_whole_with_torchvision_or_as_its_image_half(tiny_vlm, tmp_path, preset):
    from transformers import AutoImageProcessor, AutoTokenizer
    from transformers.utils import is_torchvision_available

    from tuneline.model import load_processor, load_tokenizer

    config = model_keys(tiny_vlm(preset))
    tokenizer = load_tokenizer(config.model)
    processor = load_processor(config, tokenizer)
    if is_torchvision_available():
        assert type(processor).__name__.endswith("VLProcessor")
        return
    assert type(processor).__name__ == "ImageOnlyProcessor" and processor.tokenizer is tokenizer
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    assert "mm_token_type_ids" in processor.model_input_names and "pixel_values" in processor.model_input_names
    processor.save_pretrained(tmp_path / "saved")  # the model's own processor files, the image processor, the tokenizer
    assert (tmp_path / "saved" / "processor_config.json").read_text() == (
        tiny_vlm(preset) / "processor_config.json").read_text()
    assert AutoImageProcessor.from_pretrained(tmp_path / "saved").merge_size == processor.image_processor.merge_size
    assert AutoTokenizer.from_pretrained(tmp_path / "saved").get_vocab() == tokenizer.get_vocab()


def test_a_processor_without_torchvision_is_refused_naming_it_for_other_families():
    """Only the Qwen-VL processors have an image half that suffices; any other ImportError naming torchvision is the
    user's to fix."""
    from types import SimpleNamespace

    from tuneline.model.image_only_processor import load_image_only_processor

    error = ImportError("FancyVideoProcessor requires the Torchvision library")
    with pytest.raises(UserError, match="needs torchvision.*install the torchvision build"):
        load_image_only_processor(SimpleNamespace(model_name_or_path="some/model"),
                                  SimpleNamespace(model_type="fancy_vl"), {}, error)


def test_the_trainer_saves_the_processor_into_each_checkpoint_and_the_output_dir(tiny_vlm, tmp_path):
    import torch
    from transformers import AutoProcessor, Trainer, TrainingArguments

    from tuneline.model import SaveProcessorCallback, load_model, load_processor, load_tokenizer

    config = load_config(None, {"model_name_or_path": str(tiny_vlm("llava")), "dataset": "x",
                                "output_dir": str(tmp_path / "out")}, check_paths=False)
    tokenizer = load_tokenizer(config.model)
    processor = load_processor(config, tokenizer)
    image = torch.randint(0, 255, (3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    row = processor(text=["USER: <image>\nWhat? ASSISTANT: red"], images=[image], return_tensors="pt")
    rows = [{**{k: v[0] for k, v in row.items()}, "labels": row["input_ids"][0]}] * 4
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, save_steps=1, per_device_train_batch_size=2,
                             use_cpu=True, report_to="none", disable_tqdm=True, save_only_model=True)
    trainer = Trainer(model=load_model(config, tokenizer), args=args, train_dataset=rows, processing_class=tokenizer,
                      callbacks=[SaveProcessorCallback(processor)])
    trainer.train()
    trainer.save_model()
    for folder in (tmp_path / "out" / "checkpoint-1", tmp_path / "out" / "checkpoint-2", tmp_path / "out"):
        assert (folder / "processor_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
        reloaded = AutoProcessor.from_pretrained(folder)
        assert type(reloaded).__name__ == "LlavaProcessor" and reloaded.patch_size == 8


def test_a_pixtral_processor_loads_whole_with_torchvision_or_as_its_image_half(tiny_vlm, tmp_path):
    """transformers builds PixtralProcessor only with torchvision; without, its image processor, the tokenizer and the
    settings of processor_config.json (what the plugin reads), saved back as the model's own files."""
    from transformers import AutoImageProcessor
    from transformers.utils import is_torchvision_available

    from tuneline.model import load_processor, load_tokenizer

    config = model_keys(tiny_vlm("pixtral"))
    tokenizer = load_tokenizer(config.model)
    processor = load_processor(config, tokenizer)
    expected = "PixtralProcessor" if is_torchvision_available() else "PixtralImageOnlyProcessor"
    assert type(processor).__name__ == expected and processor.tokenizer is tokenizer
    assert (processor.patch_size, processor.spatial_merge_size, processor.image_break_token) == (8, 1, "[IMG_BREAK]")
    assert "image_sizes" in processor.model_input_names
    processor.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "processor_config.json").read_text() == (
        tiny_vlm("pixtral") / "processor_config.json").read_text()
    assert AutoImageProcessor.from_pretrained(tmp_path / "saved").patch_size["height"] == 8
