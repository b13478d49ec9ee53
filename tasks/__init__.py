"""Thin Prefect tasks: a decorator (name, cache key, retries, tags), one library call, a small reference."""

from tasks.dataset import build_dataset
from tasks.evaluate import evaluate
from tasks.predict import predict
from tasks.reference import build_reference_model
from tasks.report import model_card, plot
from tasks.tokenizer import load_tokenizer
from tasks.train import train

__all__ = ["build_dataset", "build_reference_model", "evaluate", "load_tokenizer", "model_card", "plot", "predict", "train"]
