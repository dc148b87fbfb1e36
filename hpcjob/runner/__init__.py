"""The life of a run, below every front door: the command line and the Python API (hpcjob.api) call it,
and the PowerShell module reaches it through the command line.

It opens a cluster (its profile, password and backend), looks runs up, stages the code, submits and
follows a job to its summary, and says where a run's files are. It prints nothing and exits nothing:
what a person should see goes to the `progress` callback it is given (warnings start "hpcjob: warning:"),
and what goes wrong is an HpcjobError with the one line the CLI prints.

Its rooms, by what they do: access (clusters, runs, their files), submit, follow, local, render, mount;
watch (the hang watch while a run is followed); pull (a run's results, home). This module only hands
their names on, each when it is first asked for (PEP 562): importing one room (`hpcjob.runner.render`)
loads that room alone, so a command line that renders never loads the follower, the backends or
`requests`.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names handed on, and their rooms: read by __getattr__ below too
    from hpcjob.runner.access import (
        ClusterAccess,
        HpcjobWarning,
        Progress,
        StoppedWaiting,
        backend_for_run,
        cancel_run,
        close_backends,
        gpus_for_nodes,
        job_id_of,
        keep_open,
        new_run_id,
        open_smb,
        profile_mount_point,
        render_owner,
        run_folder,
        run_folder_opener,
        run_of,
        run_status,
        submit_failure,
        with_profile,
    )
    from hpcjob.runner.attempts import Retries, follow_attempts, not_in_history, submit_attempt, take_up
    from hpcjob.runner.follow import RunOutput, follow_run
    from hpcjob.runner.local import LocalOptions, run_local, start_local, submit_local
    from hpcjob.runner.mount import MountRequest, mount_preview, mount_request, mount_share, prepare_share
    from hpcjob.runner.pull import PullReport, pull_run, pull_target
    from hpcjob.runner.render import (
        RENDERERS,
        Rendered,
        recorded_plan,
        render_job,
        render_run,
        rendered,
        submit_preview,
    )
    from hpcjob.runner.submit import (
        job_spec,
        locked_wheels,
        read_requirements,
        requirements_text,
        smb_access,
        submit_and_follow,
        submit_run,
        submit_to_cluster,
    )

__all__ = [
    "RENDERERS",
    "ClusterAccess",
    "HpcjobWarning",
    "LocalOptions",
    "MountRequest",
    "Progress",
    "PullReport",
    "Rendered",
    "Retries",
    "RunOutput",
    "StoppedWaiting",
    "backend_for_run",
    "cancel_run",
    "close_backends",
    "follow_attempts",
    "follow_run",
    "gpus_for_nodes",
    "job_id_of",
    "job_spec",
    "keep_open",
    "locked_wheels",
    "mount_preview",
    "mount_request",
    "mount_share",
    "new_run_id",
    "not_in_history",
    "open_smb",
    "prepare_share",
    "profile_mount_point",
    "pull_run",
    "pull_target",
    "read_requirements",
    "recorded_plan",
    "render_job",
    "render_owner",
    "render_run",
    "rendered",
    "requirements_text",
    "run_folder",
    "run_folder_opener",
    "run_local",
    "run_of",
    "run_status",
    "smb_access",
    "start_local",
    "submit_and_follow",
    "submit_attempt",
    "submit_failure",
    "submit_local",
    "submit_preview",
    "submit_run",
    "submit_to_cluster",
    "take_up",
    "with_profile",
]


@functools.cache
def _rooms() -> dict[str, str]:
    """Each name of __all__ and the room it lives in, as the imports above say."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    checking = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.name: node.module
        for node in checking.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def __getattr__(name: str) -> Any:
    import importlib

    room = _rooms().get(name) if name in __all__ else None
    if room is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(room), name)
    globals()[name] = value  # asked once
    return value
