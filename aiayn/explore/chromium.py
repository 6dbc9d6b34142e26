"""Headless Chromium for the explorer's end-to-end test and README screenshots.

Debian's ``chromium`` package (``make setup-browser``) driven by Playwright; Playwright's own
browser download is never used.  The flags keep Chromium off the network (background
services, component updates, sync and QUIC all try to reach Google's hosts) and let it run as
root in a container (``--no-sandbox``).
"""

from __future__ import annotations

import shutil

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> str | None:
    """The path of the system's Chromium, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")
