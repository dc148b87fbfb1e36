"""`--resume-from RUN`: a new run that starts from an earlier run's latest checkpoint.

Every run saves into a checkpoint folder of its own (hpcjob.job.plan's HPCJOB_CHECKPOINT_DIR,
`<job folder>/checkpoints/<run id>`), so a new run starts fresh unless asked. Asked, hpcjob finds the
earlier run in this machine's history, the folder where its checkpoints are, and that it holds one; the
new run's tasks get the folder as HPCJOB_RESUME_FROM, which they read and never write.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.job.spec import SpecError

if TYPE_CHECKING:
    from hpcjob.job.options import JobOptions
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.runs import HistoryEntry
    from hpcjob.store.share import ShareFolder


def recorded_env(plan: Mapping[str, Any] | None) -> dict[str, str]:
    """The job environment a recorded plan (`render --format json`'s form) gave its tasks."""
    env = (plan or {}).get("env") or {}
    pairs = env.items() if isinstance(env, Mapping) else env
    return {str(name): str(value) for name, value in pairs}


def run_checkpoints(entry: HistoryEntry) -> str:
    """Where the run's checkpoints are, relative to its share's root: its own folder, as its recorded
    plan named it (a folder its --env gave, within the share), else as hpcjob names them."""
    from hpcjob.job.layout import CHECKPOINT_VAR, CHECKPOINTS_FOLDER, checkpoint_folder

    record = entry.record
    named = recorded_env(entry.plan).get(CHECKPOINT_VAR)
    if not named and entry.plan is not None:  # an hpcjob before these folders: the job folder's, shared
        return f"{record.job_folder}/{CHECKPOINTS_FOLDER}"
    folder = recorded_folder(entry, CHECKPOINT_VAR)
    if folder is None:
        return checkpoint_folder(record.job_folder, record.run_id)
    if folder.startswith("/"):
        raise SpecError(
            f"--resume-from {record.run_id}: its checkpoints are in {folder}, outside its share: give the "
            "training program that folder yourself"
        )
    return folder


def recorded_folder(entry: HistoryEntry, variable: str) -> str | None:
    """The folder the run's tasks got as `variable` (its recorded plan's; its --env may have named
    another): relative to its share's root, or the path the nodes saw where it is outside the share
    (it starts with "/"); None where the plan names none (or no share's folder)."""
    record = entry.record
    named = recorded_env(entry.plan).get(variable)
    job_dir = str((entry.plan or {}).get("job_dir") or "")
    if not named or not job_dir.endswith(f"/{record.job_folder}"):
        return None
    root = job_dir[: -len(record.job_folder) - 1]
    folder = posixpath.normpath(named if named.startswith("/") else f"{job_dir}/{named}")
    if not folder.startswith(f"{root}/"):
        return folder if folder.startswith("/") else f"/{folder}"
    return folder[len(root) + 1 :]


def resume_dir(run: str, *, local: bool, share: str | None, mount_point: str) -> str:
    """The checkpoint folder of RUN (a run id, or the job id of a run of this machine's) as a new run's
    nodes see it: a local run reads it where the earlier run's files are on this machine;
    a cluster's reads it on the same share (`share`), mounted at `mount_point`. One line that says
    why not otherwise."""
    from hpcjob.store.runs import RENDERED, find_entry

    try:
        entry = find_entry(run)
    except SpecError:
        raise SpecError(
            f"--resume-from {run}: no such run in this machine's history (`hpcjob runs` lists them)"
        ) from None
    record = entry.record
    if record.state == RENDERED:
        raise SpecError(f"--resume-from {run}: that run was only rendered; nothing ran under it")
    folder = run_checkpoints(entry)
    if local:
        if not record.local_root:
            raise SpecError(
                f"--resume-from {run}: its files are on {record.share or 'the cluster'}, not on this "
                "machine: a local run starts only from a run whose folder is here"
            )
        return f"{record.local_root.rstrip('/')}/{folder}"
    if record.backend == "local" or record.share != share:
        where = "this machine" if record.backend == "local" else (record.share or "no share")
        raise SpecError(
            f"--resume-from {run}: that run's files are on {where}, and this one's on "
            f"{share or 'no share'}: a run starts only from a run of the same share"
        )
    return f"{mount_point.rstrip('/')}/{folder}"


def resolve(options: JobOptions, *, local: bool) -> str | None:
    """The checkpoint folder the job's `resume_from` (a run) names, as JobSpec's `resume_dir` (None: a
    fresh start): from the history alone (render contacts nothing); `check_resume` looks at the folder
    once the share is open."""
    from hpcjob.job.spec import DEFAULT_MOUNT_POINT

    if not options.resume_from:
        return None
    unc = options.share.unc if options.share else None
    mount_point = options.mount_point or DEFAULT_MOUNT_POINT
    return resume_dir(options.resume_from, local=local, share=unc, mount_point=mount_point)


def check_resume(spec: JobSpec, plan: JobPlan, folder: ShareFolder, *, local: bool) -> None:
    """Refuse, in one line, to start from a folder that holds no checkpoint: `folder` is the new run's
    share (the earlier run's too), else for a local run this machine's files. Names that start with a
    dot are a writer's temporary files."""
    from hpcjob.store.share import LocalFolder

    if spec.resume_dir is None:
        return
    root = plan.job_dir[: -len(spec.job_folder) - 1].rstrip("/")
    if spec.resume_dir.startswith(f"{root}/"):
        relative = spec.resume_dir[len(root) + 1 :]
    elif local:  # another local folder of this machine's
        folder, relative = LocalFolder(Path("/")), spec.resume_dir.lstrip("/")
    else:
        return  # not on the share: the nodes alone may see it (resume_dir never gives such a folder)
    try:
        names = [name for name in folder.listdir(relative) if not name.startswith(".")]
    except FileNotFoundError:
        names = []
    except OSError as exc:
        raise SpecError(
            f"--resume-from: cannot read the checkpoint folder {spec.resume_dir}: {exc}"
        ) from None
    if not names:
        raise SpecError(
            f"--resume-from: no checkpoint in {spec.resume_dir}: that run saved none (it ended before its "
            "first, or trained nothing)"
        )


def checkpoints_shown(entry: HistoryEntry) -> str:
    """Where the run's checkpoints are, as `runs show` says it: in its files here or on its share."""
    record = entry.record
    base = record.local_root or record.share or "the share"
    try:
        return f"{base}/{run_checkpoints(entry)}"
    except SpecError:  # its --env put them outside the share
        from hpcjob.job.layout import CHECKPOINT_VAR

        return f"{recorded_env(entry.plan).get(CHECKPOINT_VAR)} (on the nodes)"
