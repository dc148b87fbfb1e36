"""Where a run's files are in its job folder on the share, and the variables that tell its tasks: names
only, in a module of their own so that reading the history (`hpcjob runs show`) does not build plans."""

from __future__ import annotations

# Each run's own checkpoint folder, `<job folder>/checkpoints/<run id>`, in every task's environment:
# where the training program saves and resumes (docs/training.md, the contract for a script of one's
# own). A new run starts fresh; a restart, or a later attempt of the same run, finds its own. With
# `--resume-from RUN`, RESUME_VAR names that earlier run's folder, to start from and never write.
CHECKPOINT_VAR = "HPCJOB_CHECKPOINT_DIR"
RESUME_VAR = "HPCJOB_RESUME_FROM"
CHECKPOINTS_FOLDER = "checkpoints"
# Each run's own output folder, `<job folder>/outputs/<run id>`, in every task's environment: what the
# training program keeps besides checkpoints (a final model, predictions, plots), which `hpcjob pull`
# brings home with the checkpoints and logs.
OUTPUT_VAR = "HPCJOB_OUTPUT_DIR"
OUTPUTS_FOLDER = "outputs"

# Each attempt of a run is one HPC Pack job; the tasks know which (issue 33: a user's script may start
# afresh on attempt 1 and resume on a later one from HPCJOB_CHECKPOINT_DIR, which all attempts share).
ATTEMPT_VAR = "HPCJOB_ATTEMPT"


def attempt_id(run_id: str, attempt: int) -> str:
    """What names attempt `attempt` of a run on the cluster: its job, its rendezvous, its processes. The
    first attempt's is the run id, as a run's job has always been named; a later one's is
    RUN_ID.ATTEMPT, so that no attempt's job, store or tasks is taken for another's."""
    return run_id if attempt == 1 else f"{run_id}.{attempt}"


def attempt_log_folder(run_id: str, attempt: int) -> str:
    """Attempt `attempt`'s log folder under the job folder's logs/: RUN_ID for the first (where a run's
    logs have always been), RUN_ID/ATTEMPT for a later one, so no attempt reads another's exit files,
    beats or dumps."""
    return run_id if attempt == 1 else f"{run_id}/{attempt}"


def checkpoint_folder(job_folder: str, run_id: str) -> str:
    """A run's checkpoint folder, relative to the share's root as the job folder is."""
    return f"{job_folder}/{CHECKPOINTS_FOLDER}/{run_id}"


def output_folder(job_folder: str, run_id: str) -> str:
    """A run's output folder, relative to the share's root as the job folder is."""
    return f"{job_folder}/{OUTPUTS_FOLDER}/{run_id}"
