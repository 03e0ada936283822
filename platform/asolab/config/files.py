"""Where config files are found and how they are read: a path or a bare name
looked up in ``./experiments`` then in the shipped ones, TOML read with
one-line errors, and :func:`load` (file + overrides -> a checked config)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

from .fields import ConfigError
from .schema import ExperimentConfig
from .validate import apply_overrides, from_dict, parse_overrides

PROJECT_ROOT = Path(__file__).resolve().parents[3]


def shipped_dir(name: str) -> Path:
    """Where the configs that come with asolab live: ``<checkout>/<name>`` in a source
    checkout (editable install, PYTHONPATH), else the package data of an installed wheel
    (``asolab/<name>``, mapped from the checkout's folder by pyproject.toml)."""
    checkout = PROJECT_ROOT / name
    if (PROJECT_ROOT / "pyproject.toml").is_file() and checkout.is_dir():
        return checkout
    return Path(__file__).resolve().parents[1] / name


EXPERIMENTS_DIR = shipped_dir("experiments")
# The experiment a command runs when none is named (experiments/digits.toml).
DEFAULT_EXPERIMENT = "digits"


def resolve_named_file(path: str | Path | None, default: Path, folder: Path, kind: str) -> Path:
    """The file a user named: ``path`` if it is a file, else a bare name (``.toml``
    optional) looked up first in ``./<folder.name>/`` of the working directory, then
    in ``folder`` (the shipped configs); ``default``'s name looked up the same way
    when None. ``kind`` names the file in the error ("experiment", "study")."""
    if path is None:
        path = default.stem
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{kind} file {str(path)!r} is a directory; name a .toml file in it")
    if p.exists():
        return p
    name = p.name if p.suffix == ".toml" else f"{p.name}.toml"
    folders = search_folders(folder)
    for candidate in (f / name for f in folders):
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted({x.stem for f in folders for x in f.glob("*.toml")}))
    raise ConfigError(f"{kind} file {str(path)!r} not found; known {folder.name}: {known}")


def search_folders(folder: Path) -> list[Path]:
    """``./<name>`` of the working directory first, then the shipped folder (once)."""
    local = Path.cwd() / folder.name
    if local.is_dir() and local.resolve() != folder.resolve():
        return [local, folder]
    return [folder]


def read_toml(file: Path, kind: str) -> dict[str, Any]:
    """A TOML file's tables; one ConfigError line for a file that cannot be read or parsed."""
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"{file}: not a text file (it holds bytes that are not UTF-8); {kind} files are TOML "
            "text"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{kind} file {file} cannot be read ({exc.strerror or exc})") from None


def resolve_experiment_path(path: str | Path | None) -> Path:
    """A file path, or a bare name looked up in ./experiments/, then in the shipped ones."""
    default = EXPERIMENTS_DIR / f"{DEFAULT_EXPERIMENT}.toml"
    return resolve_named_file(path, default, EXPERIMENTS_DIR, "experiment")


def load(
    path: str | Path | None = None, overrides: Sequence[str] | Mapping[str, Any] = ()
) -> ExperimentConfig:
    """Load an experiment file (default: digits) and apply ``--set`` overrides."""
    file = resolve_experiment_path(path)
    data = read_toml(file, "experiment")
    data.setdefault("name", file.stem)
    cfg = from_dict(data, str(file))
    if overrides:
        cfg = apply_overrides(cfg, parse_overrides(overrides), f"{file} (--set)")
    return cfg


def config_json(cfg: ExperimentConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)
