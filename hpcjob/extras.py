"""The optional parts of hpcjob (pyproject.toml's extras) and the one line that names the missing one.

The base install gives every command and the main path: submitting over the REST API with the upload
over SMB. What only some users need stays an extra, and a command that needs one says which, in one line,
instead of ending in a traceback.
"""

from __future__ import annotations

from hpcjob.job.spec import SpecError

# Extra -> what it installs, as the one line names it (its packages are in pyproject.toml;
# tests/test_packaging.py checks that every extra named here is one).
EXTRAS = {
    "train": "torch",
    "gpu": "nvidia-ml-py",
    "winrm": "pywinrm",
    "emulator": "pyspnego and tree-sitter-powershell",
    "plot": "matplotlib",
    "keyring": "the keyring package",
}


def missing_extra(extra: str, what: str) -> SpecError:
    """The error for `what` (e.g. "the winrm backend") when the extra's packages are not installed:
    `raise missing_extra("winrm", "the winrm backend") from None` in the ImportError's handler."""
    return SpecError(f"{what} needs {EXTRAS[extra]}: pip install 'hpcjob[{extra}]'")
