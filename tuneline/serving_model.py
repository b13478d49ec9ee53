"""The loader module named in the MLmodel file of versions registered before serving had its package
(`loader_module: tuneline.serving_model`): MLflow imports it by that name, so those versions load and answer as
new ones do. New versions name `tuneline.serving.mlflow_model`."""

from tuneline.serving.mlflow_model import _load_pyfunc

__all__ = ["_load_pyfunc"]
