"""hpcjob's own folders on this machine: a module of its own, light, so that a command that only reads
the run history (`hpcjob runs`) does not import the cluster profiles' (hpcjob.store.config)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def user_folder(kind: str) -> Path:
    """hpcjob's folder of `kind` ("config", "state" or "cache") for this user: %APPDATA%\\hpcjob (config),
    %LOCALAPPDATA%\\hpcjob (state) and %LOCALAPPDATA%\\hpcjob\\cache on Windows, else the XDG base
    directories (~/.config/hpcjob, ~/.local/state/hpcjob, ~/.cache/hpcjob)."""
    if sys.platform == "win32":
        variable = "APPDATA" if kind == "config" else "LOCALAPPDATA"
        base = os.environ.get(variable) or str(
            Path.home() / "AppData" / ("Roaming" if kind == "config" else "Local")
        )
        return Path(base) / "hpcjob" / ("cache" if kind == "cache" else "")
    variable, default = {
        "config": ("XDG_CONFIG_HOME", ".config"),
        "state": ("XDG_STATE_HOME", ".local/state"),
        "cache": ("XDG_CACHE_HOME", ".cache"),
    }[kind]
    return Path(os.environ.get(variable) or Path.home() / default) / "hpcjob"
