"""Where edgepack keeps caches and user configuration."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Root of edgepack's caches (``$EDGEPACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgepack``)."""
    explicit = os.environ.get("EDGEPACK_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "edgepack"


def config_root() -> Path:
    """Root of edgepack's user configuration (``$XDG_CONFIG_HOME/edgepack``)."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "edgepack"
