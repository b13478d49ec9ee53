"""Reward models on vision-language models: the family's multimodal backbone with a one-label `score` head.

LLaMA-Factory scores with a value head on the whole image-text model. Ours stays the sequence classifier that the
text reward model is (`tuneline.model.loader`), so training, saving, SEQ_CLS adapters, export and PPO's scoring are
the same code for both. transformers ships such a classifier for Gemma 3 only; for the other families
(`LlavaForSequenceClassification`, `Qwen2VLForSequenceClassification`, ...) it is built here from transformers'
public pieces - `GenericForSequenceClassification` over the family's backbone (`model.*`, the weight names of its
image-text-to-text model, so those weights load as they are) - and registered with
`AutoModelForSequenceClassification`, which then saves and reloads it like any other.
"""

from __future__ import annotations


def scorer_class(model_config):
    """The one-label sequence classifier of a vision-language model's family, registered for `model_config`'s
    type if transformers has none."""
    from transformers import MODEL_MAPPING, AutoModelForSequenceClassification, PreTrainedModel
    from transformers.modeling_layers import GenericForSequenceClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

    config_class = type(model_config)
    if config_class in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING:
        return MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[config_class]
    backbone = MODEL_MAPPING[config_class]  # LlavaModel, Qwen2VLModel, ...: vision tower, projector, language model
    family = next(cls for cls in backbone.__mro__[1:] if issubclass(cls, PreTrainedModel))
    name = f"{backbone.__name__.removesuffix('Model')}ForSequenceClassification"
    scorer = type(name, (GenericForSequenceClassification, family), {"__module__": __name__})
    # exist_ok: transformers' own config classes are only registered when the caller says so
    AutoModelForSequenceClassification.register(config_class, scorer, exist_ok=True)
    return scorer


def scorer_config(model_config, pad_token_id: int | None):
    """`model_config` for a one-label scorer: the classifier pools at the last token that is not the text
    config's pad, so the pad is set there (a vision-language config has no top-level pad to pass)."""
    model_config.num_labels = 1
    model_config.get_text_config().pad_token_id = pad_token_id
    return model_config
