"""asolab as an installed package: the wheel ships the experiment and study configs,
bare names resolve in ./experiments (./studies) first, the default store is ./mlruns."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import tomllib
from mlflow import MlflowClient

from asolab import config
from asolab.study.config import load_study
from asolab.tracking.store import default_tracking_uri

ROOT = Path(__file__).resolve().parents[1]
TINY_ARGS = [
    "--quiet",
    "--set",
    "threads=1",
    "--set",
    "space.init_channels=4",
    "--set",
    "search.cycles=1",
    "--set",
    "search.w_epochs=1",
    "--set",
    "search.alpha_epochs=1",
    "--set",
    "search.retrain_epochs=1",
    "--set",
    "data.train_subset=200",
    "--set",
    "tracking.log_models=false",
]


def test_pyproject_lists_every_package_and_ships_the_configs():
    """The package list is explicit (to map experiments/ and studies/ into the package):
    a new subpackage must be added there, or a regular install would lack it."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(ROOT / "platform").parts)
        for p in (ROOT / "platform" / "asolab").rglob("__init__.py")
    }
    listed = set(setuptools["packages"])
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [tool.setuptools] packages"
    assert setuptools["package-dir"]["asolab.experiments"] == "experiments"
    assert setuptools["package-dir"]["asolab.studies"] == "studies"


def test_bare_names_look_in_the_working_directory_first(tmp_path, monkeypatch):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "digits.toml").write_text("seed = 7\n[space]\ninit_channels = 4\n")
    (tmp_path / "experiments" / "mine.toml").write_text("seed = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert config.load().seed == 7  # the default name, found in ./experiments
    assert config.load("mine").seed == 3
    assert config.load("fashion_mnist").data.name == "fashion_mnist"  # then the shipped ones
    assert (
        load_study("temperature_mutation").base.seed == 7
    )  # its base experiment "digits" is ./experiments'
    assert default_tracking_uri() == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    with pytest.raises(config.ConfigError, match="known experiments: digits, fashion_mnist, mine"):
        config.load("nope")


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH (it would put a checkout's asolab before the installed one), no store
    override."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    env.update(OMP_NUM_THREADS="1", PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


@pytest.mark.slow
def test_wheel_installs_and_runs_from_an_empty_folder(tmp_path):
    # Build from a copy: a build in the checkout leaves build/ and *.egg-info behind.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("platform", "experiments", "studies"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    env = _clean_env()
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(src),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("asolab-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    work = tmp_path / "empty"
    work.mkdir()
    where = subprocess.run(
        [str(py), "-c", "import asolab; print(asolab.__file__)"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(env_dir)), where  # the installed wheel, not a checkout

    proc = subprocess.run(
        [str(env_dir / "bin" / "asolab"), "run", *TINY_ARGS],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    db = work / "mlruns" / "mlflow.db"
    assert db.is_file(), sorted(p.name for p in work.iterdir())
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FINISHED"]
    assert runs[0].data.params["data.name"] == "digits"
    assert sorted(p.name for p in work.iterdir()) == ["mlruns"]  # nothing else lands in the folder

    # The shipped study file and its base experiment resolve from the package as well.
    study = subprocess.run(
        [
            str(py),
            "-c",
            (
                "from asolab.study.config import load_study; c = load_study(); "
                "print(c.source, c.base.name)"
            ),
        ],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert study[0].startswith(str(env_dir)) and study[0].endswith("temperature_mutation.toml")
    assert study[1] == "digits"
