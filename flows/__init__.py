"""Prefect flows: each reads like a table of contents of its tasks."""

import os

# A Prefect server that tuneline starts (the temporary one, when no PREFECT_API_URL is set) sends no usage analytics;
# set here, before Prefect is imported, so that every way of running a flow behaves alike.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
