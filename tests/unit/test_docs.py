"""The docs keep up with the code: every key refused at a non-default value is named in the compatibility page, every
page the README links exists, and the README stays a first hour's read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


# What the docs show a user, run here: every config through `tuneline validate` from the repo's root, every
# `tuneline` command line through the command's own parser, every `make` target and benchmark script with its options.
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]


def _blocks(page: Path) -> list[tuple[str, str]]:
    """(language, text) of each fenced block of a page."""
    return re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def _configs() -> list[tuple[str, str]]:
    return [(page.name, text) for page in PAGES for lang, text in _blocks(page)
            if lang == "yaml" and re.search(r"^(stage|model_name_or_path):", text, flags=re.M)]


def _command_lines(program: str, inline: bool = True) -> list[tuple[str, str]]:
    """Each line of a page's plain code blocks (and, with `inline`, each `...` span of its prose) that starts with
    `program `, its comment cut off."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        lines = [line for lang, block in _blocks(page) if lang in ("", "bash", "sh")
                 for line in block.replace("\\\n", " ").splitlines()]  # a command continued with `\` is one line
        if inline:
            lines += re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
        found += [(page.name, line.split("  #")[0].split(" # ")[0].strip()) for line in lines
                  if line.strip().startswith(program + " ")]
    return found


def test_the_docs_show_a_config_and_each_validates_from_the_repo(tmp_path, monkeypatch):
    from cli.main import run

    configs = _configs()
    assert any(name == "README.md" for name, _ in configs)
    monkeypatch.chdir(REPO)  # dataset_dir: data, as a user in a fresh clone
    for index, (name, text) in enumerate(configs):
        path = tmp_path / f"{index}.yaml"
        path.write_text(text)
        assert run(["validate", str(path)]) == 0, f"the config shown in {name} does not validate:\n{text}"


def test_every_tuneline_command_the_docs_show_parses(capsys):
    """Whole command lines parse; a command named in prose exists with the options it is shown with."""
    import shlex

    from cli.main import _parser

    for name, line in set(_command_lines("tuneline")) - set(_command_lines("tuneline", inline=False)):
        words = shlex.split(line)
        with pytest.raises(SystemExit) as shown:
            _parser().parse_args([words[1], "--help"])
        usage = capsys.readouterr().out
        assert shown.value.code == 0 and all(o in usage for o in words[2:] if o.startswith("--")), f"{name}: {line}"
    commands = _command_lines("tuneline", inline=False)
    assert len(commands) >= 10
    for name, line in commands:
        argv = [word for word in shlex.split(line)[1:] if word not in ("[", "]", "...")]
        argv = [word.strip("[]") for word in argv]
        try:
            _parser().parse_args(argv)
        except SystemExit as exited:
            raise AssertionError(f"{name}: `{line}` is not a command tuneline takes") from exited


def test_every_make_target_and_benchmark_option_the_docs_show_exists():
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.M))
    for name, line in _command_lines("make"):
        assert line.split()[1] in targets, f"{name}: `{line}` names no Makefile target"
    scripts = [(name, line) for name, line in _command_lines("python") if "benchmarks/" in line]
    assert scripts
    for name, line in scripts:
        script = REPO / re.search(r"benchmarks/\w+\.py", line).group(0)
        assert script.is_file(), f"{name}: `{line}`: no {script.name}"
        source = script.read_text()  # with the benchmark modules it loads (video_parity parses through mm_parity)
        source += "".join(m.read_text() for m in script.parent.glob("*.py") if f"{m.stem}" in source)
        assert [o for o in re.findall(r"(--[\w-]+)", line) if f'"{o}"' not in source] == [], f"{name}: `{line}`"


def test_a_served_alias_says_where_it_comes_from():
    """`champion` is set by `tuneline retrain` alone: a page serving it says so on the same line."""
    for page in PAGES:
        for line in page.read_text(encoding="utf-8").splitlines():
            assert "@champion" not in line or "retrain" in line, f"{page.name}: {line}"


def test_user_docs_hold_current_figures_not_their_history():
    """No issue numbers, development dates or commits in what users read: the history lives in git."""
    history = re.compile(r"\bissue\b|(?<![\w/])#\d+\b|\b20\d\d-\d\d-\d\d\b|\b(?:commit|at) [0-9a-f]{7,40}\b", re.I)
    found = [f"{page.name}: {line.strip()[:80]}" for page in PAGES
             for line in page.read_text(encoding="utf-8").splitlines() if history.search(line)]
    assert found == []
