"""Each step's key holds the version of the code it runs, found from what that code imports: editing any module a
step imports changes that step's code version, and leaves the versions of the steps that do not import it alone.

Run on a copy of the package (every module edited in turn), so the sources here stay as they are."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tuneline.content.code import PACKAGE_ROOT, STEP_ENTRIES, code_version, imported_modules
from tuneline.train import STAGE_MODULES


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("copy") / "tuneline"
    shutil.copytree(PACKAGE_ROOT, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def versions(root: Path) -> dict[str, str]:
    return {step: code_version(*entries, root=root) for step, entries in STEP_ENTRIES.items()}


def test_editing_a_module_changes_the_keys_of_exactly_the_steps_that_import_it(package):
    imports = {step: {path.relative_to(package) for path in imported_modules(*entries, root=package).values()}
               for step, entries in STEP_ENTRIES.items()}
    before = versions(package)
    sources = sorted(package.rglob("*.py"))
    untouched_somewhere = 0
    for source in sources:
        text = source.read_text()
        source.write_text(text + "\n# edited\n")
        try:
            after = versions(package)
        finally:
            source.write_text(text)
        relative = source.relative_to(package)
        changed = {step for step in STEP_ENTRIES if after[step] != before[step]}
        assert changed == {step for step in STEP_ENTRIES if relative in imports[step]}, relative
        untouched_somewhere += len(STEP_ENTRIES) - len(changed)
    assert versions(package) == before
    assert untouched_somewhere, "some edit leaves some step's key alone"


def test_what_each_step_reaches_includes_its_indirect_and_by_name_imports(package):
    evaluate = imported_modules(*STEP_ENTRIES["evaluate"], root=package)
    train = imported_modules(*STEP_ENTRIES["train"], root=package)
    assert "tuneline.objectives.logps" in evaluate  # the evaluation loss's log-probs, imported by its scoring
    assert "tuneline.objectives.losses" not in evaluate and "tuneline.train.sft" not in evaluate  # training's own code
    assert "tuneline.export.merge" not in train
    assert set(STAGE_MODULES.values()) <= set(train)  # each stage's module, loaded by name
    assert "tuneline.train" in train and "tuneline" in train  # the packages an import runs


def test_every_cached_step_of_the_flow_has_a_code_version():
    assert set(STEP_ENTRIES) == {"load-tokenizer", "build-dataset", "build-reference-model", "train", "evaluate",
                                 "predict", "plot", "model-card"}


def test_the_data_and_reference_versions_follow_their_imports_not_their_folders(package):
    dataset = imported_modules(*STEP_ENTRIES["build-dataset"], root=package)
    reference = imported_modules(*STEP_ENTRIES["build-reference-model"], root=package)
    tokenizer = imported_modules(*STEP_ENTRIES["load-tokenizer"], root=package)
    assert "tuneline.model.tokenizer" in dataset and "tuneline.data.templates" in str(sorted(dataset))
    assert "tuneline.objectives.logps" in reference and "tuneline.reference.compute" in reference
    assert "tuneline.train.sft" not in dataset | reference | tokenizer
    assert "tuneline.model.tokenizer" in tokenizer and "tuneline.evaluation.run" not in tokenizer
    assert "tuneline.data.build" not in tokenizer and "tuneline.reference" not in tokenizer  # later steps' code
