"""Experiment configs: loading, overrides, and one-line errors for bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asolab import config
from asolab.config import ConfigError


def test_default_experiment_loads_and_is_frozen():
    cfg = config.load()
    assert cfg.name == "digits"
    assert cfg.data.name == "digits"
    with pytest.raises(AttributeError):
        cfg.seed = 3  # type: ignore[misc]


def test_set_overrides_parse_toml_values():
    cfg = config.load(
        None,
        [
            "search.cycles=2",
            "temperature.schedule=cosine",
            "mutation.strength=0.5",
            "space.primitives=['skip_connect','sep_conv_3x3']",
        ],
    )
    assert cfg.search.cycles == 2
    assert cfg.temperature.schedule == "cosine"
    assert cfg.mutation.strength == 0.5
    assert cfg.space.primitives == ("skip_connect", "sep_conv_3x3")


def test_int_is_accepted_for_float_fields():
    assert (
        config.load(None, ["temperature.initial_temperature=3"]).temperature.initial_temperature
        == 3.0
    )


def _write(tmp_path, text):
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "text, words",
    [
        ("[search]\ncyclez = 3\n", ["exp.toml", "search.cyclez", "allowed", "cycles"]),
        ("[serch]\ncycles = 3\n", ["exp.toml", "serch", "allowed", "search"]),
        ("[search]\ncycles = 'three'\n", ["exp.toml", "search.cycles", "integer", "[1, 1000]"]),
        ("[search]\nweight_lr = nan\n", ["exp.toml", "search.weight_lr", "finite", "(0.0, 10.0]"]),
        (
            "[temperature]\ninitial_temperature = inf\n",
            ["exp.toml", "temperature.initial_temperature", "finite"],
        ),
        ("[mutation]\nstrength = 1.5\n", ["exp.toml", "mutation.strength", "[0.0, 1.0]"]),
        ("[data]\nname = 'imagenet'\n", ["exp.toml", "data.name", "digits", "fashion_mnist"]),
        (
            "[space]\nprimitives = ['sep_conv_9x9']\n",
            ["exp.toml", "space.primitives", "sep_conv_3x3"],
        ),
        (
            "[temperature]\ninitial_temperature = 1.0\nmin_temperature = 2.0\n",
            ["exp.toml", "min_temperature", "initial_temperature"],
        ),
        ("device = 'tpu'\n", ["exp.toml", "device", "cuda:N"]),
        (
            "[search]\nbudget_minutes = 60\nfinal_epochs = 0\n",
            ["exp.toml", "search.budget_minutes", "search.final_epochs"],
        ),
        ("[data]\naugment = 1\n", ["exp.toml", "data.augment", "true or false"]),
        ("seed = \n", ["exp.toml", "TOML"]),
    ],
)
def test_bad_config_is_one_line_naming_file_key_and_allowed(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        config.load(_write(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_bad_override_names_the_key():
    with pytest.raises(ConfigError, match=r"search\.w_epochs.*out of range"):
        config.load(None, ["search.w_epochs=-1"])
    with pytest.raises(ConfigError, match="unknown key 'search.nope'"):
        config.load(None, ["search.nope=1"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        config.load(None, ["search.cycles"])
    with pytest.raises(
        ConfigError, match=r"temperature\.initial_temperature must be a finite number"
    ):
        config.load(None, ["temperature.initial_temperature=nan"])


def test_missing_experiment_lists_known_ones():
    with pytest.raises(ConfigError, match="known experiments: .*digits"):
        config.load("no_such_experiment")


def test_flat_view_has_dotted_keys():
    flat = config.load().flat()
    assert flat["temperature.initial_temperature"] == 5.0
    assert flat["seed"] == 0
    assert config.from_dict(config.load().to_dict()) == config.load()


def test_configuration_reference_matches_the_code():
    """docs/configuration.md's tables are what `python -m asolab.config_doc --write` makes
    of the fields: change a field's default, range or help and regenerate the page."""
    from asolab.config_doc import DOC, markdown, replace_generated

    page = DOC.read_text()
    assert replace_generated(page, markdown()) == page, "run: python -m asolab.config_doc --write"
    assert "| `search.cycles` | `3` |" in page and '| `sampler.name` | `"tpe"` |' in page


def test_the_configs_choices_are_the_registries():
    """Each name lives in its registry; the config accepts exactly those names."""
    from asolab.data import REGISTRY
    from asolab.evolution.growth import POLICIES
    from asolab.evolution.temperature import SCHEDULES
    from asolab.space.ops import OPS, PRIMITIVES

    assert config.DATASETS() == tuple(REGISTRY)
    assert config.SCHEDULES() == tuple(SCHEDULES)
    assert config.GROWTH_POLICIES() == tuple(POLICIES)
    # OPS and PRIMITIVES list the same operations in the same order; the default space is all
    assert config.PRIMITIVES() == tuple(OPS) == PRIMITIVES == config.SpaceConfig().primitives
    for key in ("data.name", "temperature.schedule", "growth.policy"):
        with pytest.raises(
            config.ConfigError, match=f"{key} = 'no_such' is out of range; allowed: one of "
        ):
            config.load(None, {key: "no_such"})
    with pytest.raises(
        config.ConfigError, match="unknown value .no_such_op.; allowed: one of none, "
    ):
        config.load(None, {"space.primitives": ["no_such_op"]})


def test_reading_a_config_does_not_import_torch():
    """The registries are read when a config is checked, so `import asolab.config` stays light."""
    code = "import sys, asolab.config; assert 'torch' not in sys.modules, 'torch imported'"
    env = {**os.environ, "PYTHONPATH": str(config.PROJECT_ROOT / "platform")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def _float_fields(cls=config.ExperimentConfig, prefix=""):
    import dataclasses

    for f in dataclasses.fields(cls):
        sub = config.section_type(f)
        if sub is not None:
            yield from _float_fields(sub, f"{prefix}{f.name}.")
        elif str(f.type) == "float":
            yield f"{prefix}{f.name}", f.metadata


def test_inf_is_accepted_exactly_where_the_message_and_the_docs_say_so():
    """A float field's allowed range ends in "inf]" only if the validator takes inf;
    search.grad_clip = inf means no clipping, as docs/configuration.md says."""
    from asolab.config_doc import DOC

    page = DOC.read_text()
    takes_inf = []
    for key, meta in _float_fields():
        allowed = config.describe_allowed(meta)
        try:
            config.load(None, {key: float("inf")})
            accepted = True
        except ConfigError as exc:
            accepted = False
            assert "finite" in str(exc) and "inf]" not in str(exc), (key, str(exc))
        assert accepted == allowed.endswith("inf]"), (key, allowed)
        assert accepted == (f"| `{key}` |" in page and _doc_row(page, key).endswith("inf] |"))
        if accepted:
            takes_inf.append(key)
    assert takes_inf == ["search.grad_clip"]
    assert "inf = no clipping" in _doc_row(page, "search.grad_clip")


def _doc_row(page: str, key: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))


def test_a_run_without_gradient_clipping(tiny_cfg):
    from asolab.runner import Runner

    cfg = tiny_cfg.replace(**{"search.grad_clip": float("inf"), "search.cycles": 1})
    result = Runner(cfg, []).run()
    assert 0.0 < result.val_acc <= 1.0 and result.derived_params > 0


def test_an_exception_reads_as_its_first_line():
    from asolab.errors import first_line

    exc = OSError("disk full\nTraceback (most recent call last): ...")
    assert first_line(exc) == "disk full"
    assert first_line(exc, named=True) == "OSError: disk full"
    assert first_line(exc, named=True, limit=7) == "OSError"
    assert first_line("  \n") == "" and first_line(ValueError(), named=True) == "ValueError: "
