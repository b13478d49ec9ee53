"""benchmarks/gpu_wheelhouse.py without the network: which requirements the GPU image meets, a wheel's requirements
as Python 3.12 on Linux reads them, the versions pinned from the venv tested here, and the size check."""

from __future__ import annotations

import importlib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def wheelhouse(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # a script folder, not a package
    return importlib.import_module("gpu_wheelhouse")


def test_the_image_meets_what_its_known_versions_satisfy_and_roots_need_bounds_it_can_show(wheelhouse):
    meets = wheelhouse.image_meets
    assert meets(Requirement("transformers>=5.0,<5.25"), root=True)  # the image's 5.17
    assert not meets(Requirement("transformers<=5.6.0,>=4.55"), root=True)  # LLaMA-Factory's pin: it travels
    assert not meets(Requirement("prefect>=3.4"), root=False)  # not in the image at all
    # peft's version there is unknown: a root with an upper bound travels, a transitive need is taken as met
    assert not meets(Requirement("peft<=0.18.1"), root=True) and meets(Requirement("peft<=0.18.1"), root=False)
    assert meets(Requirement("pyyaml>=5.1"), root=True)


def _wheel(folder: Path, requires: list[str]) -> Path:
    path = folder / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"
                       + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_a_wheels_requirements_are_read_for_python_312_on_linux(wheelhouse, tmp_path):
    wheel = _wheel(tmp_path, ["a>=1", "b; python_version < '3.12'", "c; sys_platform == 'win32'",
                              "d; extra == 'dev'", "e; python_version >= '3.12' and platform_system == 'Linux'"])
    assert [r.name for r in wheelhouse.requirements_of(wheel)] == ["a", "e"]
    assert [r.name for r in wheelhouse.requirements_of(wheel, frozenset({"dev"}))] == ["a", "d", "e"]
    assert wheelhouse.requirements_of(tmp_path / "deepspeed-0.19.8.tar.gz") == []  # an sdist: built there


def test_versions_are_pinned_from_the_venv_where_they_satisfy(wheelhouse, tmp_path):
    local = {"prefect": "3.8.8", "trl": "1.16.0"}
    assert wheelhouse.pinned(Requirement("prefect>=3.4,<3.9"), local) == "prefect==3.8.8"
    assert wheelhouse.pinned(Requirement("trl<=0.24.0"), local) == "trl<=0.24.0"  # pip chooses
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "mlflow_skinny-3.17.2.dist-info").mkdir(parents=True)
    assert wheelhouse.installed_versions(tmp_path) == {"mlflow-skinny": "3.17.2"}


def test_the_report_fails_a_load_over_the_limit(wheelhouse, tmp_path, capsys):
    wheel = _wheel(tmp_path, [])
    size = wheel.stat().st_size
    assert wheelhouse.report("load", {"demo": wheel}, tree=100, limit=size + 100)
    assert not wheelhouse.report("load", {"demo": wheel}, tree=101, limit=size + 100)
    assert "DOES NOT FIT" in capsys.readouterr().out
