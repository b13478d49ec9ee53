"""Retraining that runs itself, without a work pool: serve the deployments of deployments/prefect.yaml.

    python deployments/serve.py [PREFECT_YAML]     # the same as `tuneline serve [PREFECT_YAML]`
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREFECT_YAML = Path(__file__).with_name("prefect.yaml")


def runner_deployments(prefect_yaml: Path = PREFECT_YAML) -> list:
    sys.path.insert(0, str(REPO))
    from cli.serving import runner_deployments as from_yaml

    return from_yaml(prefect_yaml)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from cli.serving import serve_deployments

    serve_deployments(Path(sys.argv[1]) if len(sys.argv) > 1 else PREFECT_YAML)
