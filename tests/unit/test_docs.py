"""The docs keep up with the code: every key refused at a non-default value is named in the compatibility page, every
page the README links exists, and the README stays a first hour's read."""

from __future__ import annotations

import itertools
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
    """(language, text) of each fenced block of a page, those indented under a list item too (text dedented)."""
    import textwrap

    found = re.findall(r"^( *)```(\w*)\n(.*?)^\1```", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return [(lang, textwrap.dedent(text)) for _, lang, text in found]


def _configs() -> list[tuple[str, str]]:
    return [(page.name, text) for page in PAGES for lang, text in _blocks(page)
            if lang == "yaml" and re.search(r"^(stage|model_name_or_path):", text, flags=re.M)]


def _code_lines(page: Path) -> list[str]:
    """Each line of a page's plain code blocks, a line continued with `\\` joined to the next, its comment cut off."""
    lines = [line for lang, block in _blocks(page) if lang in ("", "bash", "sh")
             for line in block.replace("\\\n", " ").splitlines()]
    return [_without_comment(line) for line in lines]


def _without_comment(line: str) -> str:
    return line.split("  #")[0].split(" # ")[0].strip()


def _shell_commands(line: str) -> list[str]:
    """The commands of a shell line: each side of `&&`, without the VAR=value assignments before it."""
    return [re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+", "", part.strip()) for part in line.split("&&")]


def _command_lines(program: str, inline: bool = True) -> list[tuple[str, str]]:
    """Each command of a page's plain code blocks (and, with `inline`, each `...` span of its prose) that starts with
    `program `, its comment cut off."""
    found = []
    for page in PAGES:
        lines = _code_lines(page)
        if inline:
            text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
            lines += [_without_comment(span) for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)]
        found += [(page.name, command) for line in lines for command in _shell_commands(line)
                  if command.startswith(program + " ")]
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


def _machines_commands(program: str) -> list[list[str]]:
    """The words of each `program` command in docs/machines.md's code blocks."""
    import shlex

    return [shlex.split(line) for name, line in _command_lines(program, inline=False) if name == "machines.md"]


def test_the_ray_and_prefect_commands_for_several_machines_parse_with_their_own_programs(monkeypatch, capsys):
    """`ray` commands through Ray's own command line (click: an unknown option or missing value raises), `prefect`
    ones against Prefect's help for that command (Prefect's CLI runs a command as it parses it)."""
    import sys

    from prefect.cli import app as prefect_cli
    from ray.scripts.scripts import cli as ray_cli

    rays = _machines_commands("ray")
    assert {words[1] for words in rays} >= {"start", "get-auth-token"}
    for words in rays:
        ray_cli.commands[words[1]].make_context(words[1], words[2:])
    prefects = _machines_commands("prefect")
    assert {tuple(words[1:3]) for words in prefects} >= {("work-pool", "create"), ("deploy", "--all"),
                                                         ("worker", "start")}
    monkeypatch.setenv("COLUMNS", "200")
    for words in prefects:
        path = [word for word in words[1:] if not word.startswith("-")][:3]
        monkeypatch.setattr(sys, "argv", ["prefect", *path, "--help"])
        with pytest.raises(SystemExit) as shown:
            prefect_cli()
        usage = capsys.readouterr().out
        options = [word.split("=")[0] for word in words if word.startswith("--")]
        unknown = [o for o in options if not re.search(re.escape(o) + r"(?![\w-])", usage)]
        assert shown.value.code == 0 and unknown == [], " ".join(words)


def test_the_kubernetes_commands_name_what_deployments_holds():
    """The files the commands apply, build and deploy exist; the pool, secret and deployment names agree with them."""
    import json

    import yaml

    kubectl, docker, helm = (_machines_commands(p) for p in ("kubectl", "docker", "helm"))
    applied = {words[words.index("-f") + 1] for words in kubectl if words[1] == "apply"}
    assert applied == {"deployments/ray-cluster.yaml", "deployments/shared-volume.yaml"}
    assert all((REPO / words[words.index("-f") + 1]).is_file() for words in docker if "-f" in words)
    repos = {words[3] for words in helm if words[1:3] == ["repo", "add"]}
    assert all(words[3].split("/")[0] in repos for words in helm if words[1] == "install")
    template = json.loads((REPO / "deployments" / "kubernetes-job-template.json").read_text())
    secret = next(words for words in kubectl if words[1:4] == ["create", "secret", "generic"])
    assert secret[4] == template["variables"]["properties"]["ray_auth_secret"]["default"]
    assert {w.split("=")[1] for w in secret if w.startswith("--from-literal=")} == {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}
    prefects = _machines_commands("prefect")
    create = next(words for words in prefects if words[1:3] == ["work-pool", "create"])
    pool = create[3]
    assert create[create.index("--base-job-template") + 1] == "deployments/kubernetes-job-template.json"
    deployed = [REPO / words[words.index("--prefect-file") + 1] for words in prefects if words[1] == "deploy"]
    assert all(path.is_file() for path in deployed) and REPO / "deployments/prefect-kubernetes.yaml" in deployed
    spec = yaml.safe_load((REPO / "deployments" / "prefect-kubernetes.yaml").read_text())
    assert {d["work_pool"]["name"] for d in spec["deployments"]} == {pool}
    assert all(words[words.index("--pool") + 1] == pool for words in prefects if words[1:3] == ["worker", "start"])
    [trigger] = [words for words in _machines_commands("tuneline") if words[1] == "trigger"]
    assert trigger[2] in {f"finetune/{d['name']}" for d in spec["deployments"]}


def test_the_commands_for_two_machines_give_the_configs_they_say(monkeypatch):
    """LLaMA-Factory's torchrun variables and the Ray keys on the lines shown become the machines, ranks and
    cluster they say, on the config shown (LLaMA-Factory's own Ray example: from its 0.9.5 examples)."""
    import shlex

    from tuneline.config import load_config

    examples = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5"
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    lines = [line for line in _code_lines(REPO / "docs" / "machines.md") if "tuneline train" in line]
    torchrun = [line for line in lines if line.startswith("FORCE_TORCHRUN=1 ")]
    assert len(torchrun) == 2
    for line in torchrun:
        words = shlex.split(line)
        env = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_]+=\S+", word))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        config = load_config(words[len(env) + 2], check_paths=False).pipeline
        assert (config.num_machines, config.machine_rank, config.main_process_ip, config.main_process_port) == (
            int(env["NNODES"]), int(env["NODE_RANK"]), env["MASTER_ADDR"], int(env["MASTER_PORT"])), line
    for name in ("FORCE_TORCHRUN", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name)
    heads = {w.split("=")[1] for words in _machines_commands("ray") for w in words if w.startswith("--address=")}
    on_ray = [words for words in (shlex.split(_shell_commands(line)[-1]) for line in lines) if "ray_address" in
              " ".join(words)]
    assert on_ray
    for words in on_ray:
        path = words[2] if (REPO / words[2]).is_file() else examples / words[2]
        config = load_config(path, words[3:], check_paths=False)
        workers = dict(word.split("=", 1) for word in words[3:]).get("ray_num_workers")
        assert config.ray.address in heads and workers in (None, str(config.ray.num_workers)), " ".join(words)


def test_every_table_has_its_header_row():
    """A markdown table renders only with a header row above its `|---|` line; a page that lost one shows raw pipes."""
    headless = [f"{page.name}:{number}" for page in PAGES
                for number, (above, line) in enumerate(itertools.pairwise(page.read_text().splitlines()), start=2)
                if line.startswith("|---") and not above.startswith("|")]
    assert headless == []
