"""hpcjob: run PyTorch DistributedDataParallel training on Microsoft HPC Pack clusters.

The public Python API is what this package exports (`__all__`; see hpcjob.api and the README's
"From Python"): submit a run, follow it, read its logs, cancel it, find runs, render a job. Everything
else is hpcjob's own and may change.
"""

from hpcjob.api import (
    HpcjobError,
    HpcjobWarning,
    Run,
    SpecError,
    StoppedWaiting,
    list_runs,
    render_job,
    submit,
)

__all__ = [
    "HpcjobError",
    "HpcjobWarning",
    "Run",
    "SpecError",
    "StoppedWaiting",
    "list_runs",
    "render_job",
    "submit",
]
