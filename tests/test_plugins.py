"""Plugins, the Python way: a package the test builds and installs adds a data set and
ops through the entry-point groups ``asolab.datasets`` and ``asolab.ops``.

The package (a wheel the test writes) is installed with ``pip install --no-deps --target
DIR``; with DIR on
PYTHONPATH its entry points are read by ``importlib.metadata``, so its names are
valid config values at once, in ``asolab run`` (a subprocess) and in ``asolab.run``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import processes
import pytest
import torch.nn as nn
from conftest import ONE_CYCLE
from mlflow import MlflowClient

import asolab
from asolab.cli import main
from asolab.config import PROJECT_ROOT, ConfigError
from asolab.data import REGISTRY
from asolab.plugins import PluginError
from asolab.space.ops import OPS
from asolab.tracking import layout as L

# One worker builds the module's plugin, built and installed (--dist loadgroup), not both.
pytestmark = pytest.mark.xdist_group("plugins")

TINY = ONE_CYCLE


PLUGIN = '''
"""A researcher's package: a data set of noisy blobs and two ops."""

import numpy as np
import torch.nn as nn

from asolab.data import Arrays


def load_blobs(cfg):
    rng = np.random.default_rng(0)
    y = np.arange(90) % 3
    x = rng.normal(size=(90, 1, 8, 8)).astype(np.float32) + y[:, None, None, None]
    return Arrays(x, y, num_classes=3, mean=(1.0,), std=(1.2,), source="blobs://generated")


def conv_1x1(c, stride, affine):
    return nn.Sequential(
        nn.ReLU(), nn.Conv2d(c, c, 1, stride=stride, bias=False), nn.BatchNorm2d(c, affine=affine)
    )


def wide_1x1(c, stride, affine):
    return nn.Conv2d(c, 2 * c, 1, stride=stride)  # twice the channels: the wrong shape
'''

ENTRY_POINTS = """\
[asolab.datasets]
blobs = asolab_blobs:load_blobs

[asolab.ops]
conv_1x1 = asolab_blobs:conv_1x1
wide_1x1 = asolab_blobs:wide_1x1
broken_op = asolab_blobs:no_such_op
"""
OPS_WITH_PLUGIN = ["skip_connect", "sep_conv_3x3", "conv_1x1"]


def build_wheel(folder: Path) -> Path:
    """The package as a wheel, written by hand (a wheel is a zip with its metadata), so
    that building it needs no build backend and no network."""
    dist = "asolab_blobs-0.3.1"
    files = {
        "asolab_blobs.py": textwrap.dedent(PLUGIN),
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\nName: asolab-blobs\nVersion: 0.3.1\n",
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist}.dist-info/entry_points.txt": ENTRY_POINTS,
    }
    record = [
        f"{name},sha256="
        + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        + f",{len(text.encode())}"
        for name, text in files.items()
    ]
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return wheel


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    """The package built and installed into a folder of its own, as pip installs it."""
    wheel = build_wheel(tmp_path_factory.mktemp("dist"))
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    assert (target / "asolab_blobs-0.3.1.dist-info" / "entry_points.txt").is_file()
    return target


@pytest.fixture
def plugin_path(plugin_dir, monkeypatch) -> Path:
    """The installed plugin on this process's path (as PYTHONPATH puts it there)."""
    monkeypatch.syspath_prepend(str(plugin_dir))
    yield plugin_dir
    for name in ("asolab_blobs",):
        sys.modules.pop(name, None)


@contextlib.contextmanager
def caplog_at_warning():
    """The asolab.api log records of the block (the library warns through logging)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("asolab.api")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _env(plugin_dir: Path) -> dict[str, str]:
    paths = [str(plugin_dir), str(PROJECT_ROOT / "platform"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _sets(overrides: dict) -> list[str]:
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def test_plugin_names_are_config_values_and_show_in_run_help(plugin_path, capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "blobs (plugin: asolab-blobs 0.3.1 (asolab_blobs:load_blobs))" in out
    assert "conv_1x1 (plugin: asolab-blobs 0.3.1" in out and "sep_conv_3x3" in out
    cfg = asolab.load_config("digits", {"data.name": "blobs", "space.primitives": ["conv_1x1"]})
    assert cfg.data.name == "blobs" and cfg.space.primitives == ("conv_1x1",)


@pytest.mark.slow
def test_asolab_run_searches_a_plugin_data_set_with_a_plugin_op(plugin_dir, tmp_path):
    """A process of its own, as a researcher runs it (the plugin found through
    PYTHONPATH): the plugin's data set and op are used and recorded (tag asolab.plugins
    with the package and version; the op set in the genotype JSON; the data set's
    declared normalisation). The process is forked from the preloaded server of
    tests/processes.py, which reads the plugin's entry points from the PYTHONPATH given
    to it, as a fresh interpreter would."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = {
        **TINY,
        "data.name": "blobs",
        "space.primitives": OPS_WITH_PLUGIN,
        "tracking.tracking_uri": store,
    }
    proc = processes.run(
        [sys.executable, "-m", "asolab.cli", "run", "--quiet", *_sets(overrides)],
        env=_env(plugin_dir),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    client = MlflowClient(store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    origins = json.loads(run.data.tags[L.TAG_PLUGINS])
    assert origins["data set blobs"].startswith("plugin: asolab-blobs 0.3.1")
    assert origins["op conv_1x1"] == "plugin: asolab-blobs 0.3.1 (asolab_blobs:conv_1x1)"
    assert "op sep_conv_3x3" not in origins  # built-ins are not listed
    assert json.loads(run.data.params["space.primitives"]) == OPS_WITH_PLUGIN
    local = client.download_artifacts(run.info.run_id, L.FINAL_GENOTYPE_ARTIFACT, str(tmp_path))
    record = json.loads(Path(local).read_text())
    assert record[L.GENOTYPE_OPS_KEY] == OPS_WITH_PLUGIN
    profile = json.loads(run.inputs.dataset_inputs[0].dataset.profile)
    assert profile["mean"] == [1.0] and profile["std"] == [1.2] and profile["num_classes"] == 3


def test_asolab_run_in_code_uses_the_installed_plugin(plugin_path):
    result = asolab.run(
        "digits",
        {**TINY, "data.name": "blobs", "space.primitives": OPS_WITH_PLUGIN},
        track=False,
    )
    assert result.config.data.name == "blobs" and 0.0 <= result.test_acc <= 1.0
    ops = {op for _, _, op, _ in result.genotype.edges()}
    assert ops <= set(OPS_WITH_PLUGIN)


def _refused_by_api_and_cli(op: str, match: str, capsys) -> str:
    """A run with ``op`` beside skip_connect: asolab.run raises PluginError matching
    ``match``, and ``asolab run`` exits 2 with one error line naming the op; that line."""
    prims = ["skip_connect", op]
    with pytest.raises(PluginError, match=rf"op '{op}' .*{match}"):
        asolab.run("digits", {**TINY, "space.primitives": prims}, track=False)
    rc = main(["run", "--quiet", "--no-track", *_sets({**TINY, "space.primitives": prims})])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"asolab: error: op '{op}'") and "\n" not in err
    return err


def test_a_plugin_op_of_the_wrong_shape_is_refused_at_start_with_its_name(plugin_path, capsys):
    err = _refused_by_api_and_cli("wide_1x1", r"returns shape \(2, 8, 8, 8\)", capsys)
    assert "(2, 4, 8, 8)" in err  # what it must return


def test_an_op_that_fails_at_the_runs_width_is_one_line_naming_it_and_the_width(capsys):
    """NP05: the registration probe builds at 4 channels; the run builds at 8 and 16."""

    def picky(c, stride, affine):
        if c > 4:
            raise ValueError(f"picky: {c} channels is too many")
        return nn.Identity() if stride == 1 else nn.AvgPool2d(1, stride=stride)

    asolab.register_op("picky", picky)
    try:
        _refused_by_api_and_cli("picky", r"factory\(8, stride=.*too many", capsys)
    finally:
        OPS.unregister("picky")


def test_a_study_with_an_op_that_fails_to_import_is_refused_up_front(plugin_path, tmp_path, capsys):
    """NP20: as run refuses it, before a trial runs or the store is touched."""
    store = tmp_path / "mlflow.db"
    args = ["study", "studies/temperature_mutation.toml", "--n-trials", "1"]
    args += ["--tracking-uri", f"sqlite:///{store}", "--storage", str(tmp_path / "j.log")]
    args += ["--set", 'space.primitives=["skip_connect", "broken_op"]']
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("asolab: error: op plugin 'broken_op'") and "\n" not in err, err
    assert "failed to load" in err and not store.exists()


def test_code_registration_adds_a_data_set_and_an_op_and_checks_the_op():
    def factory(c, stride, affine):
        return nn.Sequential(nn.AvgPool2d(1, stride=stride), nn.BatchNorm2d(c, affine=affine))

    def loader(cfg):
        import numpy as np

        y = np.arange(60) % 2
        return np.repeat(y[:, None, None], 8, 1).repeat(8, 2).astype(np.uint8) * 200, y

    asolab.register_op("pool_1x1", factory)
    asolab.register_dataset("stripes", loader)
    try:
        assert "pool_1x1" in OPS and "stripes" in REGISTRY
        assert str(OPS.origin("pool_1x1")).startswith("code: test_plugins.")
        result = asolab.run(
            "digits",
            {**TINY, "data.name": "stripes", "space.primitives": ["pool_1x1", "skip_connect"]},
            track=False,
        )
        assert result.config.space.primitives == ("pool_1x1", "skip_connect")
        # widening knows the built-in ops' layers only: refused before the run, not mid-way
        with pytest.raises(ConfigError, match="growth.policy = 'cycle' may widen.*pool_1x1"):
            asolab.load_config(
                "digits", {"growth.policy": "cycle", "space.primitives": ["pool_1x1", "none"]}
            )
        with pytest.raises(PluginError, match="op 'squash' .* returns shape"):
            asolab.register_op("squash", lambda c, stride, affine: nn.AdaptiveAvgPool2d(1))
        with pytest.raises(PluginError, match="not valid"):
            asolab.register_op("Bad-Name", factory)
    finally:
        OPS.unregister("pool_1x1")
        REGISTRY.unregister("stripes")
    with pytest.raises(ConfigError, match="unknown value 'pool_1x1'"):
        asolab.load_config("digits", {"space.primitives": ["pool_1x1"]})


@pytest.mark.slow
def test_compare_warns_when_runs_searched_different_op_sets(tmp_path, capsys):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    small = {**TINY, "data.train_subset": 100}
    ids = [
        asolab.run("digits", {**small, "space.primitives": prims, "seed": seed}, store).run_id
        for prims, seed in (
            (["skip_connect", "sep_conv_3x3"], 0),
            (["skip_connect", "max_pool_3x3"], 0),
            (["skip_connect", "sep_conv_3x3"], 1),
        )
    ]
    capsys.readouterr()
    report = tmp_path / "report"
    assert main(["compare", "--tracking-uri", store, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    page = (report / "index.html").read_text()
    assert "<b>Different op sets.</b> The compared runs searched 2" in page
    (line,) = [x for x in out.splitlines() if x.startswith("warning: different op sets.")]
    assert "2 different op sets" in line and "[sep_conv_3x3]" in line and "[max_pool_3x3]" in line
    # runs that searched one op set: no warning
    assert main(["compare", "--tracking-uri", store, "--run", ids[0], "--run", ids[2]]) == 0
    assert "op sets" not in capsys.readouterr().out
    # the Python API's table warns the same way
    with caplog_at_warning() as records:
        table = asolab.runs(tracking_uri=store)
    assert len(table) == 3 and any("different op sets" in r.getMessage() for r in records)
