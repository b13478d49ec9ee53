"""The final model as an MLflow pyfunc model whose loader is `tuneline.serving.mlflow_model` (named, never imported here).

Logging loads nothing: the signature is declared and the requirements listed rather than inferred (MLflow infers
them by loading the model in a subprocess)."""

from __future__ import annotations

from pathlib import Path

LOADER_MODULE = "tuneline.serving.mlflow_model"
INPUT_EXAMPLE = {"messages": [{"role": "user", "content": "Hello!"}]}
PYFUNC = "python_function"


def chat_signature():
    """Input: `messages` (the template's or OpenAI's) or `prompt`, optional `system`, `tools` and `images` (paths or
    base64 texts, for a vision-language model); output: per row, the answer and its tool calls. MLflow refuses undeclared keys; a tool's JSON schema has keys no fixed schema names, so
    `tools` is any."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, Array, ColSpec, Object, Property, Schema

    function = Object([Property("name", "string"), Property("arguments", "string")])
    openai_call = Object([Property("id", "string", required=False), Property("type", "string", required=False),
                          Property("function", function)])
    message = Object([Property("role", "string"), Property("content", "string", required=False),
                      Property("tool_calls", Array(openai_call), required=False),
                      Property("tool_call_id", "string", required=False), Property("name", "string", required=False)])
    inputs = Schema([ColSpec(Array(message), "messages", required=False), ColSpec("string", "prompt", required=False),
                     ColSpec("string", "system", required=False), ColSpec(AnyType(), "tools", required=False),
                     ColSpec(Array("string"), "images", required=False)])
    call = Object([Property("name", "string"), Property("arguments", AnyType())])
    answer = Object([Property("answer", "string"), Property("tool_calls", Array(call))])
    return ModelSignature(inputs=inputs, outputs=Schema([ColSpec(answer)]))


def save_served_model(model_dir: Path, dest: Path, settings: dict, requirements: list[str]) -> Path:
    """Write the MLflow model folder `dest` (which must not exist) around a copy of `model_dir`."""
    import mlflow.pyfunc

    mlflow.pyfunc.save_model(str(dest), loader_module=LOADER_MODULE, data_path=str(model_dir),
                             signature=chat_signature(), input_example=INPUT_EXAMPLE, pip_requirements=requirements,
                             model_config=settings)
    return dest


def model_files(root: Path) -> Path:
    """The trained model's own files in a downloaded MLflow model (its pyfunc data folder); `root` itself for a
    model logged as plain files (runs recorded before models were MLflow models)."""
    import yaml

    mlmodel = root / "MLmodel"
    if not mlmodel.is_file():
        return root
    flavor = (yaml.safe_load(mlmodel.read_text(encoding="utf-8")).get("flavors") or {}).get(PYFUNC) or {}
    return root / flavor["data"] if flavor.get("data") else root


def load_served_model(model_uri: str, model_config: dict | None = None):
    """The `tuneline.serving.chat.Chat` of a registered version (`models:/NAME@ALIAS`), loaded by MLflow's own pyfunc loader as
    `mlflow models serve` loads it; a version or registry that is not there is one UserError."""
    import mlflow

    from tuneline.errors import UserError

    try:
        model = mlflow.pyfunc.load_model(model_uri, model_config=model_config or None)
    except mlflow.exceptions.MlflowException as exc:
        raise UserError(f"'{model_uri}': {exc.message} (the registry is MLFLOW_TRACKING_URI's: "
                        f"{mlflow.get_tracking_uri()})", title="cannot serve") from None
    return model.get_raw_model()
