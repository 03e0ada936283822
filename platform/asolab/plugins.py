"""Registries that plugins extend: built-in entries, entry points, and code.

A :class:`Registry` maps names to entries (data sets, operations). It holds the
built-in entries of the module that implements them, the entries that installed
packages declare under an entry-point group (``asolab.datasets``,
``asolab.ops``; read with :func:`importlib.metadata.entry_points`), and those
registered by code at run time (``asolab.register_dataset``,
``asolab.register_op``). Entry points are listed by name at once, so a
plugin's names are valid config values as soon as its package is installed,
and loaded (their module imported) only when the entry is used.

This module imports neither torch nor any plugin: the config validator reads
the names from here while it checks a file.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

BUILTIN = "built-in"


class PluginError(RuntimeError):
    """A plugin could not be loaded or gives a wrong entry; the message names it."""


@dataclass(frozen=True)
class Origin:
    """Where a registry entry comes from, as recorded with a run."""

    kind: str  # built-in | plugin | code
    where: str = ""  # "package 1.2 (module:attr)" or "module.function"

    def __str__(self) -> str:
        return self.kind if not self.where else f"{self.kind}: {self.where}"


def _dist_text(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    name = f"{dist.name} {dist.version}" if dist is not None else "an unnamed distribution"
    return f"{name} ({ep.value})"


class Registry(Mapping[str, T], Generic[T]):
    """Built-in entries, then entry points of ``group``, then entries registered in code.

    A name registered in code replaces an entry point or built-in of that name (with
    a warning); an entry point never shadows a built-in. ``convert`` turns what an
    entry point loads into an entry and checks it, raising ``PluginError``.
    """

    def __init__(
        self,
        what: str,
        group: str,
        builtins: Mapping[str, T],
        convert: Callable[[str, Any], T],
    ) -> None:
        self.what, self.group, self._convert = what, group, convert
        self._builtins = dict(builtins)
        self._code: dict[str, tuple[T, Origin]] = {}
        self._loaded: dict[str, T] = {}
        self._eps: tuple[tuple[str, ...], dict[str, EntryPoint]] | None = None

    def _entry_points(self) -> dict[str, EntryPoint]:
        # Reading them costs ~15 ms (a scan of sys.path), so once per sys.path: a folder
        # put on the path later (a plugin installed into it) is read then.
        key = tuple(sys.path)
        if self._eps is None or self._eps[0] != key:
            self._eps = (key, self._read_entry_points())
        return self._eps[1]

    def _read_entry_points(self) -> dict[str, EntryPoint]:
        eps: dict[str, EntryPoint] = {}
        for ep in entry_points(group=self.group):
            if ep.name in self._builtins:
                log.warning(
                    "%s plugin %r from %s ignored: a built-in has that name",
                    self.what,
                    ep.name,
                    _dist_text(ep),
                )
                continue
            eps.setdefault(ep.name, ep)
        return eps

    def refresh(self) -> None:
        """Read the entry points again (after a package was installed in this process)."""
        self._eps = None

    def names(self) -> tuple[str, ...]:
        """Built-in names first (in their order), then plugins and code, sorted."""
        extra = sorted((set(self._entry_points()) | set(self._code)) - set(self._builtins))
        return (*self._builtins, *extra)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name: object) -> bool:
        if name in self._builtins or name in self._code:
            return True
        return isinstance(name, str) and name in self._entry_points()

    def __getitem__(self, name: str) -> T:
        if name in self._code:
            return self._code[name][0]
        if name in self._builtins:
            return self._builtins[name]
        if name in self._loaded:
            return self._loaded[name]
        ep = self._entry_points().get(name)
        if ep is None:
            raise KeyError(name)
        try:
            obj = ep.load()
        except Exception as exc:  # a plugin's import can fail in any way; name it
            raise PluginError(
                f"{self.what} plugin {name!r} from {_dist_text(ep)} failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        self._loaded[name] = self._convert(name, obj)
        return self._loaded[name]

    def register(self, name: str, entry: Any, where: str = "") -> None:
        """Add (or replace) ``name`` for this process."""
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"a {self.what} name must be a non-empty word, got {name!r}")
        if name in self:
            log.warning("%s %r registered in code replaces the one of that name", self.what, name)
        self._code[name] = (self._convert(name, entry), Origin("code", where))

    def unregister(self, name: str) -> None:
        """Forget an entry registered in code (tests, notebooks)."""
        self._code.pop(name, None)

    def origin(self, name: str) -> Origin:
        """Where ``name`` comes from (a built-in, a plugin package, code)."""
        if name in self._code:
            return self._code[name][1]
        if name in self._builtins:
            return Origin(BUILTIN)
        ep = self._entry_points().get(name)
        if ep is None:
            raise KeyError(name)
        return Origin("plugin", _dist_text(ep))

    def builtin(self, name: str) -> bool:
        return name in self._builtins and name not in self._code


def qualname(obj: Any) -> str:
    """``module.name`` of a function or class, for the record of code registrations."""
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{name}"
