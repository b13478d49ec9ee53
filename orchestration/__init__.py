"""Prefect plumbing the flows share: parameters, artifacts, concurrency, crash detection, a lost server, user errors shown
without a traceback."""
