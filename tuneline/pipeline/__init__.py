"""The library side of orchestration: step keys, the training subprocess, the run record.

Prefect-free, so the whole pipeline contract (content keys, resume, one MLflow run per piece of work) is
testable without a Prefect API; `tasks/` and `flows/` only wrap these calls.
"""
