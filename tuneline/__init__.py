"""tuneline: LLM fine-tuning as cached, resumable Prefect flows tracked in MLflow.

The library never imports Prefect; flows/ and tasks/ orchestrate it.
"""

__version__ = "0.1.0"
