"""asolab as an installed package: the wheel ships the experiment and study configs,
bare names resolve in ./experiments (./studies) first, the default store is ./mlruns."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import textwrap
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
    # the smallest run (tests/conftest.py's ONE_CYCLE): the test is about the install
    "--set",
    "space.steps=1",
    "--set",
    "search.calibration_batches=0",
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


# import name -> distribution name, where they differ
DISTRIBUTIONS = {"PIL": "pillow", "pynvml": "nvidia-ml-py", "sklearn": "scikit-learn"}


def test_pyproject_declares_every_third_party_import():
    """Every package the code imports that is neither the standard library nor asolab is
    a declared dependency: a clean install must not rely on another package's extras."""
    import ast
    import re

    declared = {
        re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower()
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    imported = set()
    for path in (ROOT / "platform" / "asolab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"asolab", "__future__"}
    missing = {DISTRIBUTIONS.get(m, m).lower() for m in third_party} - declared
    assert missing == set(), f"declare {sorted(missing)} in pyproject.toml's dependencies"


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


def _purelib(py: Path) -> str:
    """The site-packages folder of the interpreter ``py``."""
    return subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def make_venv_seeing_this_python(env_dir: Path) -> Path:
    """A fresh venv (no pip) that sees the packages of the interpreter running the tests.

    ``system_site_packages=True`` would show the *base* interpreter's site-packages: when
    the suite runs inside a virtual environment, whose site-packages hold the
    dependencies, the new venv would lack them. A .pth file adds the running
    interpreter's site folders instead (with their own .pth files, as site.py does),
    after the new venv's own site-packages, so what is installed there wins.
    """
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    inner = _purelib(py)
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    line = "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs)
    (Path(inner) / "_outer_site_packages.pth").write_text(line + "\n")
    return py


def test_the_test_venv_sees_the_running_interpreters_packages(tmp_path):
    """Run from inside a plain virtual environment (as a user runs the README's test
    command), the test venv sees what is installed in that environment: a module that
    only the outer venv holds imports in the inner one."""
    outer = tmp_path / "outer"
    venv.EnvBuilder(with_pip=False).create(outer)
    outer_py = outer / "bin" / "python"
    purelib = _purelib(outer_py)
    (Path(purelib) / "asolab_probe_only_in_outer.py").write_text("HERE = True\n")
    # what the outer venv's own pip install would give it: the test tools beside the probe
    (Path(purelib) / "_deps.pth").write_text(
        "".join(
            f"{d}\n"
            for d in [
                *site.getsitepackages(),
                Path(config.__file__).parents[2],  # platform/: asolab/config/__init__.py
                Path(__file__).parent,
            ]
        )
    )
    script = textwrap.dedent(
        f"""
        import sys, subprocess
        from pathlib import Path
        assert sys.prefix != sys.base_prefix
        from test_packaging import make_venv_seeing_this_python
        py = make_venv_seeing_this_python(Path({str(tmp_path / "inner")!r}))
        subprocess.run([str(py), "-c", "import asolab_probe_only_in_outer, psutil"], check=True)
        """
    )
    proc = subprocess.run(
        [str(outer_py), "-c", script], env=_clean_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


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
    py = make_venv_seeing_this_python(env_dir)
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

    # One interpreter (each start imports asolab afresh): the installed wheel is the one
    # imported, not a checkout, and the shipped study file and its base experiment
    # resolve from the package as well.
    where, source, base = subprocess.run(
        [
            str(py),
            "-c",
            (
                "import asolab; from asolab.study.config import load_study; c = load_study(); "
                "print(asolab.__file__, c.source, c.base.name)"
            ),
        ],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert where.startswith(str(env_dir)), where  # the installed wheel, not a checkout
    assert source.startswith(str(env_dir)) and source.endswith("temperature_mutation.toml")
    assert base == "digits"


def test_the_browser_tests_skip_names_the_missing_piece():
    from chromium import missing

    assert missing("/usr/bin/chromium", None) == (
        "chromedriver (apt install chromium-driver) is not installed"
    )
    assert missing(None, "/usr/bin/chromedriver").startswith("headless Chromium (apt install")
    assert " and chromedriver " in missing(None, None) and missing(None, None).endswith(
        "are not installed"
    )
    assert missing("/usr/bin/chromium", "/usr/bin/chromedriver") == ""


def test_the_readmes_first_block_says_how_to_skip_cuda_before_the_install():
    """A newcomer copies the first block: the CPU build's command stands before the
    install command, in the block, not in a bullet below it."""
    readme = (config.PROJECT_ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    cpu = block.find("--index-url https://download.pytorch.org/whl/cpu")
    assert 0 <= cpu < block.find("pip install -e . && asolab run"), block
