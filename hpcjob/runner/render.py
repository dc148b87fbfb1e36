"""A job rendered for submitting by hand: its texts, and the run recorded (and staged) for it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.job.spec import SpecError
from hpcjob.runner.access import Progress, new_run_id
from hpcjob.runner.submit import locked_wheels

if TYPE_CHECKING:
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.share import ShareFolder


RENDERERS = ("xml", "clusrun", "powershell", "json")


def rendered(plan: JobPlan, formats: Iterable[str] = RENDERERS) -> dict[str, str]:
    """The plan in each of `formats` (RENDERERS): the job file, the mount step and submit commands for
    cmd.exe (a plan without a share has none: asked for, it is one line that says so), the head node's
    script, the plan."""
    from hpcjob.job.render import clusrun_text, job_xml, plan_json, powershell_text

    render = {"xml": job_xml, "clusrun": clusrun_text, "powershell": powershell_text, "json": plan_json}
    return {name: render[name](plan) for name in formats}


def named_plan(spec: JobSpec, run_id: str, no_nodes: str) -> JobPlan:
    """SPEC's plan on the nodes it names, as a plan made without asking a cluster must be: its trainers
    and its data nodes named (`no_nodes`: the line for trainers that are not)."""
    from hpcjob.job.plan import make_plan

    if not spec.node_names:
        raise SpecError(no_nodes)
    if spec.data_nodes and not spec.data_node_names:
        raise SpecError(
            "name the data nodes too, each with --data-node: nothing here asks a cluster for them"
        )
    return make_plan(spec, spec.node_names, run_id, data_node_names=spec.data_node_names)


def render_job(spec: JobSpec, run_id: str | None = None) -> dict[str, str]:
    """SPEC on its named nodes in every format that applies (no cluster-run text without a share),
    contacting nothing and recording nothing (hpcjob.render_job)."""
    plan = named_plan(spec, run_id or new_run_id(spec.name), "render_job needs the nodes: give node_names")
    return rendered(plan, [name for name in RENDERERS if name != "clusrun" or plan.mount is not None])


def submit_preview(spec: JobSpec, run_id: str, *, mount_step: bool) -> str:
    """What `submit` would do with SPEC on its named nodes, sending nothing (`submit --dry-run`): the
    upload, the mount job (as root, with `mount_step`), and the job, as job XML."""
    from hpcjob.job.render import job_xml, mount_job_xml
    from hpcjob.store.staging import code_files

    plan = named_plan(spec, run_id, "--dry-run asks the cluster nothing: name the nodes with --node")
    lines = []
    if spec.share:
        code_dir = Path(spec.script).resolve().parent
        files = list(code_files(code_dir))
        lines.append(
            f"# would upload {len(files)} file(s), {sum(f.size for f in files)} bytes, from {code_dir} "
            f"to {spec.share.unc}/{spec.job_folder} (unchanged files are skipped)"
        )
    if plan.secrets_file is not None:
        lines.append(
            f"# would write the secrets {', '.join(plan.secret_names)}, from this machine's environment, "
            f"to {plan.secrets_file} on the share, readable by you alone (removed when the attempt ends)"
        )
    if mount_step and plan.mount:
        lines.append(f"# would mount the share on the nodes first, as root, with:\n{mount_job_xml(plan)}")
    lines.append(f"# would create and submit the job:\n{job_xml(plan)}")
    return "\n".join(lines)


def secrets_where(plan: JobPlan, share: str | None) -> str:
    """Where a job rendered with --secret reads its secrets, for whoever submits it by hand: never a
    value (render reads none)."""
    from hpcjob.job.plan import SECRETS_VAR

    on_share = f"{share.rstrip('/')}/{plan.secrets_file}" if share else str(plan.secrets_file)
    return (
        f"hpcjob: the job reads its secrets ({', '.join(plan.secret_names)}) from "
        f"{dict(plan.env)[SECRETS_VAR]} on the nodes, {on_share} on the share: write a NAME=value line for "
        "each there before you submit it, readable by you alone, and remove it when the job has ended"
    )


@dataclass(frozen=True)
class Rendered:
    """A job rendered for submitting by hand: its plan, its texts, and whether it is the job folder's
    current run again (renders of one folder share a run id, so that the job file and the mount step
    agree)."""

    plan: JobPlan
    texts: dict[str, str]
    again: bool


def render_run(
    spec: JobSpec,
    run_id: str | None,
    formats: Iterable[str],
    *,
    stage_into: Callable[[], ShareFolder] | None = None,
    where: Mapping[str, Any],
    progress: Progress,
) -> Rendered:
    """Plan SPEC on its named nodes for submitting by hand and render it in `formats`, contacting nothing
    but `stage_into`: with it (opening the share over SMB, or as mounted here), a new run whose code and
    node files are staged there; without, the job folder's current run (recorded here as rendered), unless
    `run_id` names one. `where`: the record's share and local folder."""
    from hpcjob.store.runs import RENDERED, RunRecord, check_new_run_id, current_manual_run, save_run
    from hpcjob.store.staging import stage_run

    no_nodes = "render needs the nodes: name each with --node (render contacts no cluster)"
    if not spec.node_names:  # before the wheels are locked
        raise SpecError(no_nodes)
    staging = stage_into is not None
    if spec.wheelhouse is not None and not staging:
        raise SpecError(
            "render --wheelhouse needs --upload or --copy-to: the nodes install a lock of the wheels, made "
            "as they are uploaded"
        )
    current = None if staging or run_id else current_manual_run(spec.job_folder, where.get("share"))
    chosen = run_id or (current.run_id if current else new_run_id(spec.name))
    if staging:
        check_new_run_id(chosen)
    spec, wheels = locked_wheels(spec, progress)
    plan = named_plan(
        spec, chosen, "render needs the nodes: name each with --node (render contacts no cluster)"
    )
    texts = rendered(plan, formats)  # before anything is recorded or staged: a text may be refused
    if plan.secrets_file is not None:
        progress(secrets_where(plan, where.get("share")))
    record = RunRecord.of(plan, spec.job_folder, "manual", **where)
    if stage_into is not None:
        code_dir = Path(spec.script).resolve().parent
        staged = stage_run(
            code_dir, stage_into(), spec.job_folder, plan.run_id, plan.files, wheels, spec.user_folder
        )
        progress(f"hpcjob: run {chosen}: {staged}")
        save_run(record)
    elif current is None and not run_id:
        save_run(replace(record, state=RENDERED))  # later renders of the folder reuse it
    return Rendered(plan, texts, current is not None)


def recorded_plan(run_id: str) -> JobPlan | None:
    """The plan this machine's history keeps for the run (None: not a run of this machine's)."""
    from hpcjob.job.plan import JobPlan
    from hpcjob.store.runs import find_entry

    try:
        entry = find_entry(run_id)
    except SpecError:
        return None
    return JobPlan.from_dict(entry.plan) if entry.plan else None
