"""hpcjob: run PyTorch DistributedDataParallel training on Microsoft HPC Pack clusters.

The public Python API is what this package exports (`__all__`, from hpcjob.api; see
docs/python-api.md): submit a run, follow it, read its logs, cancel it, find runs, render a job. Everything
else is hpcjob's own and may change.
"""

from hpcjob.api import *  # noqa: F403 (the API, as hpcjob.api declares it)
from hpcjob.api import __all__ as __all__
