"""The library side of orchestration: step keys, the training subprocess, the run record.

Prefect-free, so the pipeline contract (content keys, resume, one MLflow run per piece of work) is testable
without a Prefect API."""
