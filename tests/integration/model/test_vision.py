"""The freeze_* keys on tiny vision-language models: exactly the expected parameters train under lora, freeze and
full, `lora_target: all` leaves the vision tower and projector alone, and a text model refuses the keys."""

from __future__ import annotations

import pytest

from tests.support.model_steps import changed, snapshot
from tests.support.training import PRESET_MODEL_TYPES
from tuneline.config import load_config
from tuneline.errors import ConfigError
from tuneline.model.vision import COMPOSITE_MODELS, in_part

# presets whose every parameter lies in a part the keys name (GLM-4.1V's tower has parts LLaMA-Factory's keys leave out)
PARTED = ["gemma3", "llava", "minicpm_v_4_6", "mllama", "paligemma", "pixtral", "qwen2_vl", "qwen3_vl", "intern_vl"]
PRESETS = [*PARTED, "glm4v", "glm4_5v"]
UNFROZEN = {"freeze_vision_tower": False, "freeze_multi_modal_projector": False}


def loaded(tiny_vlm, tmp_path, preset: str, **keys):
    from tuneline.model import load_model, load_tokenizer

    config = load_config(None, {"model_name_or_path": str(tiny_vlm(preset)), "dataset": "unused",
                                "output_dir": str(tmp_path / "out"), **keys}, check_paths=False)
    return load_model(config, load_tokenizer(config.model))


def trainable(model) -> set[str]:
    return {name.replace("base_model.model.", "") for name, p in model.named_parameters() if p.requires_grad}


def part_of(name: str, preset: str) -> str:
    parts = COMPOSITE_MODELS[PRESET_MODEL_TYPES.get(preset, preset)]
    for part, keys in (("vision", parts.vision_tower), ("projector", parts.projector),
                       ("language", parts.language_model)):
        if in_part(name, keys):
            return part
    return "other"


def parts_trained(model, preset: str) -> set[str]:
    return {part_of(name, preset) for name in trainable(model)}


@pytest.mark.parametrize("preset", PARTED)
def test_every_parameter_lies_in_a_known_part(tiny_vlm, preset):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm(preset))
    assert [n for n, _ in model.named_parameters() if part_of(n, preset) == "other"] == []
    assert {part_of(n, preset) for n, _ in model.named_parameters()} == {"vision", "projector", "language"}


@pytest.mark.parametrize("preset", PARTED)
def test_full_trains_the_language_model_only_by_default_and_every_part_unfrozen(tiny_vlm, tmp_path, preset):
    model = loaded(tiny_vlm, tmp_path, preset, finetuning_type="full")
    assert type(model).__name__.endswith("ForConditionalGeneration")
    assert parts_trained(model, preset) == {"language"}
    language = {n for n, _ in model.named_parameters() if part_of(n, preset) == "language"}
    assert trainable(model) == language
    model = loaded(tiny_vlm, tmp_path, preset, finetuning_type="full", **UNFROZEN)
    assert all(p.requires_grad for p in model.parameters())
    model = loaded(tiny_vlm, tmp_path, preset, finetuning_type="full", freeze_language_model=True,
                   freeze_multi_modal_projector=False)
    assert parts_trained(model, preset) == {"projector"}


@pytest.mark.parametrize("preset", PRESETS)
def test_freeze_trains_the_last_layers_and_an_unfrozen_projector(tiny_vlm, tmp_path, preset):
    model = loaded(tiny_vlm, tmp_path, preset, finetuning_type="freeze", freeze_trainable_layers=1)
    last = model.config.get_text_config().num_hidden_layers - 1  # mllama's 3 (its cross-attention layer between)
    assert trainable(model) and all(f".language_model.layers.{last}." in n for n in trainable(model))
    model = loaded(tiny_vlm, tmp_path, preset, finetuning_type="freeze", freeze_trainable_layers=1, **UNFROZEN)
    assert parts_trained(model, preset) == {"language", "projector"}  # freeze tuning never trains the tower
    projector = {n for n, _ in model.named_parameters() if part_of(n, preset) == "projector"}
    assert projector <= trainable(model)


@pytest.mark.parametrize("preset", PRESETS)
def test_lora_all_adapts_the_language_model_and_leaves_the_image_side_alone(tiny_vlm, tmp_path, preset):
    model = loaded(tiny_vlm, tmp_path, preset)
    adapted = {n for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted and all(part_of(n.replace("base_model.model.", ""), preset) == "language" for n in adapted)
    assert parts_trained(model, preset) == {"language"} and all("lora_" in n for n in trainable(model))
    assert model.peft_config["default"].modules_to_save is None


@pytest.mark.parametrize("preset", ["gemma3", "qwen2_vl"])
def test_lora_with_the_image_side_unfrozen_adapts_the_tower_and_trains_the_projector_whole(tiny_vlm, tmp_path,
                                                                                         preset):
    model = loaded(tiny_vlm, tmp_path, preset, **UNFROZEN)
    adapted = {part_of(n.replace("base_model.model.", ""), preset)
               for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"language", "vision"}
    whole = {n for n in trainable(model) if "lora_" not in n}
    assert whole and all(part_of(n, preset) == "projector" for n in whole)
    assert model.peft_config["default"].modules_to_save == list(COMPOSITE_MODELS[PRESET_MODEL_TYPES.get(preset, preset)].projector)


def test_lora_names_its_targets_outside_the_frozen_tower(tiny_vlm, tmp_path):
    """SigLIP's attention has q_proj too: an explicit target reaches the tower only when it is unfrozen."""
    model = loaded(tiny_vlm, tmp_path, "gemma3", lora_target="q_proj")
    assert {part_of(n.replace("base_model.model.", ""), "gemma3")
            for n, m in model.named_modules() if hasattr(m, "lora_A")} == {"language"}
    model = loaded(tiny_vlm, tmp_path, "gemma3", lora_target="q_proj", freeze_vision_tower=False)
    assert {part_of(n.replace("base_model.model.", ""), "gemma3")
            for n, m in model.named_modules() if hasattr(m, "lora_A")} == {"language", "vision"}


def test_lora_with_everything_frozen_is_refused_naming_the_keys(tiny_vlm, tmp_path):
    with pytest.raises(ConfigError, match="'lora_target: all' adapts no module .*'freeze_language_model: false'"):
        loaded(tiny_vlm, tmp_path, "llava", freeze_language_model=True)


def test_a_training_step_changes_exactly_the_trainable_parameters(tiny_vlm, tmp_path):
    """The image passes through the frozen tower into trained layers: frozen weights stay, trained ones move."""
    import torch
    from transformers import AutoProcessor

    from tuneline.model.processor import load_processor

    model = loaded(tiny_vlm, tmp_path, "llava", finetuning_type="full", freeze_multi_modal_projector=False)
    processor = load_processor(load_config(None, {"model_name_or_path": str(tiny_vlm("llava")), "dataset": "x"},
                                           check_paths=False))
    assert isinstance(processor, type(AutoProcessor.from_pretrained(tiny_vlm("llava"))))
    image = torch.randint(0, 255, (3, 40, 40), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    batch = processor(text=["USER: <image>\nWhat is it? ASSISTANT: a square"], images=[image], return_tensors="pt")
    before = snapshot(model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(**batch, labels=batch["input_ids"]).loss.backward()
    optimizer.step()
    moved = changed(model, before)
    assert moved and moved <= trainable(model)
    assert {part_of(n, "llava") for n in moved} == {"language", "projector"}


def test_a_text_model_refuses_the_freeze_keys_and_keeps_its_class(make_config, tokenizer, tiny_model_dir):
    from tuneline.model import load_model

    with pytest.raises(ConfigError, match="'freeze_vision_tower: False' has no effect in this run: it applies only "
                                          "with a vision-language model"):
        make_config(freeze_vision_tower=False)
    model = load_model(make_config(finetuning_type="full", freeze_vision_tower=True), tokenizer)
    assert type(model).__name__ == "LlamaForCausalLM" and all(p.requires_grad for p in model.parameters())


def test_the_loader_refuses_the_keys_on_a_text_model_it_only_sees_when_loading(tiny_model_dir, tmp_path):
    """A hub model's config.json is read only when it loads: the loader's own check names the key there."""
    from types import SimpleNamespace

    from tuneline.model.vision import check_freeze_keys

    config = load_config(None, {"model_name_or_path": str(tiny_model_dir), "dataset": "x"}, check_paths=False)
    config.finetuning.freeze_language_model = True
    with pytest.raises(ConfigError, match="'freeze_language_model: true' has no effect: .* is a text-only 'llama'"):
        check_freeze_keys(SimpleNamespace(model_type="llama"), config)
    with pytest.raises(ConfigError, match="vision-language model of type 'new_vlm'"):
        check_freeze_keys(SimpleNamespace(model_type="new_vlm", vision_config={}), config)


def test_llava_next_newline_embedding_trains_with_full_tuning_as_in_llamafactory(tiny_vlm, tmp_path):
    """LLaVA-NeXT's `image_newline` (the vector closing each row of grid features) lies in none of the parts the
    freeze_* keys name, in LLaMA-Factory as here: full tuning trains it whatever they say, LoRA leaves it alone."""
    from transformers import AutoModelForImageTextToText

    names = [n for n, _ in AutoModelForImageTextToText.from_pretrained(tiny_vlm("llava_next")).named_parameters()]
    assert [n for n in names if part_of(n, "llava_next") == "other"] == ["model.image_newline"]
    model = loaded(tiny_vlm, tmp_path, "llava_next", finetuning_type="full", freeze_language_model=True)
    assert trainable(model) == {"model.image_newline"}
    model = loaded(tiny_vlm, tmp_path, "llava_next", finetuning_type="full", **UNFROZEN)
    assert all(p.requires_grad for p in model.parameters())
    assert parts_trained(loaded(tiny_vlm, tmp_path, "llava_next"), "llava_next") == {"language"}


@pytest.mark.parametrize("preset", ["glm4v", "glm4_5v"])
def test_glm4v_tower_parts_outside_patch_embed_and_blocks_train_with_full_tuning_as_in_llamafactory(tiny_vlm, tmp_path,
                                                                                                  preset):
    """LLaMA-Factory's GLM-4.1V and GLM-4.5V parts are Qwen2-VL's: the tower is `visual.patch_embed` and
    `visual.blocks`, so its position embedding, its norms and its downsampling convolution lie in none of the parts the
    freeze_* keys name, and full tuning trains them whatever they say; LoRA and freeze tuning leave them alone."""
    from transformers import AutoModelForImageTextToText

    names = [n for n, _ in AutoModelForImageTextToText.from_pretrained(tiny_vlm(preset)).named_parameters()]
    outside = {n for n in names if part_of(n, preset) == "other"}
    assert {n.split(".")[2] for n in outside} == {"embeddings", "post_conv_layernorm", "downsample", "post_layernorm"}
    model = loaded(tiny_vlm, tmp_path, preset, finetuning_type="full")
    assert trainable(model) == outside | {n for n in names if part_of(n, preset) == "language"}
    model = loaded(tiny_vlm, tmp_path, preset, finetuning_type="full", **UNFROZEN)
    assert all(p.requires_grad for p in model.parameters())
