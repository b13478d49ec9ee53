"""The docs keep up with the code: every key refused at a non-default value is named in the compatibility page, every
page the README links exists, and the README stays a first hour's read."""

from __future__ import annotations

import re
from pathlib import Path

from tuneline.config.ray_keys import RAY_KEYS
from tuneline.config.training_keys import UNSUPPORTED_KEYS

REPO = Path(__file__).resolve().parents[2]


def test_the_compatibility_page_names_every_refused_key():
    page = (REPO / "docs" / "llamafactory-compatibility.md").read_text(encoding="utf-8")
    assert [key for key in UNSUPPORTED_KEYS if f"`{key}`" not in page] == []
    machines = (REPO / "docs" / "machines.md").read_text(encoding="utf-8")
    assert [key for key in RAY_KEYS if f"`{key}`" not in machines] == []


def test_the_readme_links_pages_that_exist_and_stays_short():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+\.md)\)", readme)
    assert links and [link for link in links if not (REPO / link).is_file()] == []
    assert len(readme) <= 10_000
