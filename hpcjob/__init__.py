"""hpcjob: run PyTorch DistributedDataParallel training on Microsoft HPC Pack clusters.

The public Python API is what this package exports (`__all__`, from hpcjob.api; see
docs/python-api.md): submit a run, follow it, read its logs, cancel it, find runs, render a job. Everything
else is hpcjob's own and may change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcjob.api import *  # noqa: F403 (the API, as hpcjob.api declares it)
    from hpcjob.api import __all__ as __all__


def __getattr__(name: str) -> Any:
    """The API's names, hpcjob.api loaded when one is first asked for (PEP 562): the command line, which
    imports this package first, does not pay for the API it does not use."""
    import importlib
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    if (here / name).is_dir() or (here / f"{name}.py").is_file():  # a module of the package, being imported
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    api = sys.modules.get("hpcjob.api") or importlib.import_module("hpcjob.api")
    exported = getattr(api, "__all__", ())
    if name == "__all__" and exported:
        return list(exported)
    if name in exported:
        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
