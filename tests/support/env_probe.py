"""Run in place of the training child by a launch under test: writes the environment its launcher gave it to
FOLDER/<RANK>.json (a tmp name, then renamed) and exits.

    python -m tests.support.env_probe FOLDER
"""

import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    folder = Path(sys.argv[1])
    tmp = folder / f".{os.environ['RANK']}.json.tmp"
    tmp.write_text(json.dumps(dict(os.environ)))
    tmp.rename(folder / f"{os.environ['RANK']}.json")
