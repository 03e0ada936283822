"""Where the browser tests find headless Chromium and chromedriver, and what their skip
says when one is missing (each is a package of its own: Chromium without its driver
is a common half-install)."""

from __future__ import annotations

import shutil

CHROMIUM = (
    shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
)
DRIVER = shutil.which("chromedriver")


def missing(chromium: str | None, driver: str | None) -> str:
    """The skip's reason: the piece that is missing, and how to install it ("" if none)."""
    lacks = [
        what
        for what, found in (
            ("headless Chromium (apt install chromium)", chromium),
            ("chromedriver (apt install chromium-driver)", driver),
        )
        if not found
    ]
    if not lacks:
        return ""
    return " and ".join(lacks) + (" is" if len(lacks) == 1 else " are") + " not installed"
