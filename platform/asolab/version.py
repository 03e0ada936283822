"""The installed package's version, on the ground floor: every layer records it (MLflow
tags, a logged model's requirements) without importing the package root above them."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("asolab")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"
