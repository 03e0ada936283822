"""The package's shape, read from its source: imports point down the layers,
packages form no circles, no package reaches into another's ``_private`` names,
no function is longer than a screen, and every part of the Runner uses only the
shared attributes it declares (runner/parts.py).

The layers are DESIGN.md's map (lowest first); a module may import its own
package and any package of its own layer or below, never one above.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "platform" / "asolab"

LAYERS: list[set[str]] = [
    {"config", "threads", "interrupt", "errors", "options", "plugins", "version"},
    {"data", "space"},
    {"evolution"},
    {"runner"},
    {"progress", "tracking"},
    {"study", "baseline"},
    {"compare"},
    # The public API (asolab/__init__.py, api.py), the CLI and the reference generator
    # stand on top of everything.
    {"cli", "__init__", "api", "config_doc", "__main__"},
]
LAYER = {package: depth for depth, packages in enumerate(LAYERS) for package in packages}
MAX_FUNCTION_LINES = 60


def _module_name(path: Path, root: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts


def _package(parts: list[str]) -> str:
    return parts[0] if parts else "__init__"


def _imports(
    tree: ast.AST, here: list[str], is_package: bool
) -> Iterator[tuple[list[str], str | None, int]]:
    """(target module parts under asolab, imported name or None, line) for every import."""
    base = here if is_package else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "asolab":
                    yield parts[1:], None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = anchor + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "asolab":
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                yield target, alias.name, node.lineno


def scan(root: Path = ROOT) -> dict[str, list[str]]:
    """Every violation under ``root``, by kind."""
    found: dict[str, list[str]] = {"layer": [], "private": [], "long": [], "cycle": []}
    edges: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        here = _module_name(path, root)
        package = _package(here)
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(root.parent)
        for target, name, line in _imports(tree, here, path.name == "__init__.py"):
            # ``from . import x`` inside asolab/__init__.py names a package; ``from .. import
            # __version__`` anywhere else names the package root (asolab/__init__.py).
            other = _package(target if target else ([name] if name else []))
            if not target and other not in LAYER:
                other = "__init__"
            if other == package or other not in LAYER or package not in LAYER:
                continue
            edges.setdefault(package, set()).add(other)
            if LAYER[other] > LAYER[package]:
                found["layer"].append(f"{where}:{line} ({package}) imports {other}")
            if name and name.startswith("_") and not name.startswith("__"):
                found["private"].append(f"{where}:{line} imports {other}'s {name}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found["long"].append(f"{where}:{node.lineno} {node.name} {length} lines")
    found["cycle"] = _cycles(edges)
    return found


def _cycles(edges: dict[str, set[str]]) -> list[str]:
    """Each package that can reach itself through others' imports, with one such path."""
    cycles = []
    for start in sorted(edges):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges.get(node, ())):
                if nxt == start:
                    cycles.append(" -> ".join([*path, start]))
                    stack = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return cycles


@pytest.fixture(scope="module")
def violations() -> dict[str, list[str]]:
    return scan()


def test_every_package_has_a_layer():
    packages = {_package(_module_name(p, ROOT)) for p in ROOT.rglob("*.py")}
    assert packages <= set(LAYER), sorted(packages - set(LAYER))


def test_imports_point_down_the_layers(violations):
    assert violations["layer"] == []


def test_packages_form_no_circles(violations):
    assert violations["cycle"] == []


def test_no_package_imports_another_packages_private_names(violations):
    assert violations["private"] == []


def test_no_function_is_longer_than_a_screen(violations):
    assert violations["long"] == []


def test_the_scan_sees_a_planted_violation(tmp_path):
    """The checks are not vacuous: a small tree with one of each is caught."""
    pkg = tmp_path / "asolab"
    for sub in ("space", "evolution"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "space" / "net.py").write_text(
        "from ..evolution.sample import _draw\n" + "def long():\n" + "    x = 1\n" * 61
    )
    (pkg / "evolution" / "sample.py").write_text("from asolab.space import net\n_draw = 1\n")
    (pkg / "space" / "version.py").write_text("from .. import __version__\n")
    found = scan(pkg)
    assert found["layer"] == [
        "asolab/space/net.py:1 (space) imports evolution",
        "asolab/space/version.py:1 (space) imports __init__",
    ]
    assert found["private"] == ["asolab/space/net.py:1 imports evolution's _draw"]
    assert found["long"] == ["asolab/space/net.py:2 long 62 lines"]
    assert "space -> evolution -> space" in found["cycle"]


# The Runner's parts: each uses only the shared state it declares (runner/parts.py).

RUNNER_OWNERS = {"self", "runner"}  # the names a part's code calls the runner by


def part_violations(cls: type, shared: frozenset[str]) -> list[str]:
    """What ``cls`` (a Runner part, the Runner or a subclass) does with the runner's
    attributes that its own ``reads`` / ``writes`` do not declare: an attribute it
    assigns outside ``writes``, a shared one it uses outside both, a declared one that
    runner/parts.py's ``Shared`` does not annotate."""
    reads, writes = cls.__dict__.get("reads", frozenset()), cls.__dict__.get("writes", frozenset())
    name = cls.__name__
    unknown = sorted((reads | writes) - shared)
    found = [f"{name} declares {a}, which Shared does not" for a in unknown]
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in RUNNER_OWNERS
        ):
            continue
        if isinstance(node.ctx, (ast.Store, ast.Del)) and node.attr not in writes:
            found.append(f"{name} sets {node.attr} without declaring it in writes")
        elif node.attr in shared and node.attr not in reads | writes:
            found.append(f"{name} uses {node.attr} without declaring it")
    return sorted(set(found))


def runner_parts() -> list[type]:
    """The Runner, its parts, and the runners that subclass it (baseline/arms.py)."""
    from asolab.baseline import arms
    from asolab.runner.cycle import Runner
    from asolab.runner.parts import Part

    classes = [c for c in Runner.__mro__ if issubclass(c, Part) and c is not Part]
    return [*classes, arms.FixedGenotypeRunner, arms.FinalOnlyRunner]


def test_runner_parts_use_only_the_state_they_declare():
    from asolab.runner.parts import shared_names

    parts = runner_parts()
    assert len(parts) >= 7  # the Runner, its five parts, the control arms' runners
    assert {v for c in parts for v in part_violations(c, shared_names())} == set()


def test_runner_parts_check_sees_a_planted_violation():
    """The check is not vacuous: a part that sets an undeclared attribute, uses a shared
    one it does not declare, or declares one Shared lacks, is caught."""
    from asolab.runner.parts import Part, shared_names

    class Planted(Part):
        reads = frozenset({"cfg", "velocity"})
        writes = frozenset({"state"})

        def step(self) -> None:
            self.state = self.cfg
            self.net = None  # a part that did not declare net replaces it
            self.speed.step()  # used, never declared

    assert part_violations(Planted, shared_names()) == [
        "Planted declares velocity, which Shared does not",
        "Planted sets net without declaring it in writes",
        "Planted uses speed without declaring it",
    ]


def test_every_doc_the_package_points_to_exists():
    """A docstring, help text or error that names docs/x.md (or docs/x.md#section) names a
    page that is there, and a section the page has."""
    import re

    docs = ROOT.parents[1] / "docs"
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        for page, anchor in re.findall(r"docs/([\w-]+\.md)(?:#([\w-]+))?", path.read_text()):
            where = f"{path.relative_to(ROOT.parent)} -> docs/{page}"
            if not (docs / page).is_file():
                missing.append(where)
            elif anchor and not any(
                re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") == anchor
                for h in re.findall(r"^#+ (.*)$", (docs / page).read_text(), re.M)
            ):
                missing.append(f"{where}#{anchor}")
    assert missing == []
