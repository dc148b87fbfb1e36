"""The values of a job's `--secret` names: read from this machine's environment, written to the attempt's
owner-only file in the job folder on the share (hpcjob.job.plan.secrets_file decides where), removed
when the attempt ends. Never printed, logged or recorded: only the names are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from hpcjob.job.spec import SpecError
from hpcjob.store.share import ShareFolder

if TYPE_CHECKING:
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.runs import RunRecord

# The most a secrets file holds: a token or a connection string each, not a file's worth.
MAX_SECRETS_BYTES = 64 << 10


def secret_values(names: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of `names` from this machine's environment (`environ`: another), in order; a SpecError
    that names the first one missing, or whose value the file cannot carry, never the value."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for name in names:
        if name not in environ:
            raise SpecError(
                f"--secret {name}: no environment variable {name} here; set it in this shell (its value "
                "goes to the job in a file only you may read, never on a command line)"
            )
        value = environ[name]
        if "\n" in value or "\r" in value or "\0" in value:
            raise SpecError(
                f"--secret {name}: the value holds a line break or NUL, and the secrets file holds a line "
                "a variable: give it encoded (base64) and decode it in the script"
            )
        values[name] = value
    if sum(len(name) + len(value.encode()) + 2 for name, value in values.items()) > MAX_SECRETS_BYTES:
        raise SpecError(f"--secret: the values hold more than {MAX_SECRETS_BYTES // 1024} KiB together")
    return values


def write_secrets(folder: ShareFolder, relative: str, values: Mapping[str, str]) -> None:
    """The attempt's secrets file, `relative` to the share's root, this user's alone."""
    from hpcjob.job.plan import secrets_text

    folder.write_private(relative, secrets_text(values).encode())


def remove_run_secrets(folder: ShareFolder, job_folder: str, run_id: str) -> list[str]:
    """Every secrets file of the run's attempts left in its job folder, removed: the names removed."""
    from hpcjob.job.plan import SECRETS_FOLDER, run_secrets_files

    where = f"{job_folder}/{SECRETS_FOLDER}"
    try:
        names = folder.listdir(where)
    except FileNotFoundError:
        return []
    return [name for name in run_secrets_files(run_id, names) if folder.remove(f"{where}/{name}")]


def remove_attempt_secrets(
    folder: ShareFolder | None, plan: JobPlan, progress: Callable[[str], None]
) -> None:
    """The attempt's secrets file removed once it has ended (hpcjob.runner.follow.follow_run); a failure
    is said, never raised: `hpcjob status`, `wait` or `cancel` of the run tries again."""
    if folder is None or plan.secrets_file is None:
        return
    try:
        folder.remove(plan.secrets_file)
    except Exception as exc:  # smbprotocol's errors are of many types; the run's end matters more
        progress(
            f"hpcjob: warning: the attempt's secrets file {plan.secrets_file} was not removed ({exc}); "
            f"`hpcjob status {plan.run_id}` tries again"
        )


def secrets_way(
    plan: JobPlan, values: Mapping[str, str], *, local: bool, private: list[tuple[str, bytes]]
) -> JobPlan:
    """How an attempt's secrets reach its tasks: on this machine (`local`) in their environment, no file;
    else in the attempt's secrets file, added to `private` (path, bytes) to be written with the upload.
    The plan to submit."""
    from hpcjob.job.plan import secrets_in_environment, secrets_text

    if local:
        return secrets_in_environment(plan)
    if plan.secrets_file is not None:
        private.append((plan.secrets_file, secrets_text(values).encode()))
    return plan


def hand_over_secrets(
    spec: JobSpec, plan: JobPlan, open_folder: Callable[[], ShareFolder | None], *, local: bool
) -> JobPlan:
    """A later attempt's secrets (hpcjob.runner.attempts.submit_attempt), read from this machine's
    environment again: written to its own file on the share (`open_folder`; the user's folder checked
    to be theirs alone first), or on this machine (`local`) handed on in the tasks' environment. The plan
    to submit. A value missing here is a SpecError: the attempt does not start."""
    from hpcjob.job.spec import SHARE_FOLDER

    if not spec.secrets:
        return plan
    values = secret_values(spec.secrets)
    private: list[tuple[str, bytes]] = []
    plan = secrets_way(plan, values, local=local, private=private)
    if not private:
        return plan
    folder = open_folder()
    if folder is None:
        raise SpecError("--secret needs the share: the attempt's secrets go to a file in its job folder")
    try:
        if spec.user_folder != SHARE_FOLDER:
            folder.ensure_private(spec.user_folder)
        for relative, data in private:
            folder.write_private(relative, data)
    finally:
        folder.close()
    return plan


def remove_left_over_secrets(record: RunRecord, open_folder: Callable[[], ShareFolder | None]) -> None:
    """Every secrets file of an ended run's attempts left in its job folder (`open_folder`: the run's
    share), removed (`hpcjob status`, `wait`, `cancel`): a run submitted without --wait keeps its file
    while nobody asks about it. Quiet: nothing is opened for a run without secrets, and a share that
    cannot be reached leaves them to the next look."""
    from hpcjob.job.spec import HpcjobError
    from hpcjob.store.runs import find_entry

    if not record.job_folder:  # a bare job id: no run of this machine's
        return
    try:
        plan = find_entry(record.run_id).plan or {}
    except HpcjobError:
        return
    if not plan.get("secret_names"):
        return
    try:
        folder = open_folder()
    except (HpcjobError, OSError):
        return
    if folder is None:  # no share recorded: nothing was written
        return
    try:
        remove_run_secrets(folder, record.job_folder, record.run_id)
    except Exception:  # smbprotocol's errors are of many types; the next look tries again
        pass
    finally:
        folder.close()
