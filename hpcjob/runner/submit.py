"""A job submitted: options to a JobSpec, the code staged on the share, the job planned and submitted,
the run recorded at each step."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.job.spec import SpecError, nodes_said
from hpcjob.runner.access import (
    ClusterAccess,
    Progress,
    new_run_id,
    stopped_cluster_hint,
    submit_failure,
    with_profile,
)
from hpcjob.runner.follow import follow_run

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.job.options import JobOptions
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.results import JobSummary, Submission
    from hpcjob.job.spec import JobSpec
    from hpcjob.runner.attempts import Retries
    from hpcjob.store.config import ClusterProfile
    from hpcjob.store.runs import RunRecord
    from hpcjob.store.share import ShareFolder


def locked_wheels(spec: JobSpec, progress: Progress) -> tuple[JobSpec, list[Path]]:
    """With a wheelhouse: the wheels the nodes install from (downloaded here, before anything is planned
    or uploaded: a package without a wheel for the nodes stops the job first), and the spec whose
    requirements are their lock, each wheel pinned with its SHA-256 (hpcjob.job.plan.wheel_lock): the nodes'
    pip installs exactly these files or nothing, whatever the share holds. Else the spec as it is."""
    if spec.wheelhouse is None or spec.requirements is None:
        return spec, []
    from hpcjob.job.plan import wheel_lock
    from hpcjob.store.wheelhouse import download, sha256_of

    wheels = download(spec.requirements, *spec.wheelhouse, progress)
    lock = wheel_lock([(wheel.name, sha256_of(wheel)) for wheel in wheels])
    return replace(spec, requirements=lock), wheels


def submit_and_follow(
    cluster: ClusterAccess,
    spec: JobSpec,
    run_id: str,
    smb: tuple[str | None, str | None, int],
    *,
    mount_step: bool,
    wait: bool,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
    retries: Retries | None = None,
) -> tuple[RunRecord, JobPlan, JobSummary | None]:
    """Upload the code to the cluster's share, submit the job (recording the run at each step, with
    `command`: how it was asked for, and how it goes on: `retries`) and, with `wait`, follow it to its
    summary, its attempts with `retries`, holding the run's follower lock from before the submission on
    (hpcjob.store.followers): the run's latest record, its plan, and the summary (None without `wait`)."""
    from hpcjob.job.spec import NotEnoughNodes
    from hpcjob.store.followers import follower_lock

    with follower_lock(run_id, command) if wait else contextlib.nullcontext():
        try:
            return _submit_and_follow(
                cluster, spec, run_id, smb, mount_step=mount_step, wait=wait, progress=progress,
                command=command, tags=tags, retries=retries,
            )  # fmt: skip
        except NotEnoughNodes as exc:  # its first attempt's nodes: a stopped cluster says how to start it
            raise NotEnoughNodes(f"{exc}{stopped_cluster_hint(cluster.profile.name)}") from None


def _submit_and_follow(
    cluster: ClusterAccess,
    spec: JobSpec,
    run_id: str,
    smb: tuple[str | None, str | None, int],
    *,
    mount_step: bool,
    wait: bool,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None,
    retries: Retries | None,
) -> tuple[RunRecord, JobPlan, JobSummary | None]:
    profile, share = cluster.profile, spec.share
    smb_user, smb_server, smb_port = smb

    def open_share(plan: JobPlan | None = None) -> ShareFolder:  # for the upload, and the summary
        assert share is not None
        return cluster.share(share, smb_user, smb_server, smb_port)

    where = {
        "share": share.unc if share else None,
        "local_root": profile.local_share,
        "smb_server": smb_server,
        "smb_port": smb_port,
        "smb_user": smb_user or profile.smb_user or profile.user,
        "cluster": profile.name,
    }
    if wait and retries is not None and retries.retries and retries.max_cost_usd is not None:
        from hpcjob.runner.cost import unbounded_cost

        if (why := unbounded_cost(profile, progress, for_data_nodes=bool(spec.data_nodes))) is not None:
            progress(  # before the first attempt, not after it
                f"hpcjob: warning: --max-cost {retries.max_cost_usd:g} cannot bound run {run_id}: {why}; its "
                "attempts go on as --retries says"
            )
    started = time.monotonic()
    latest, plan = submit_run(
        cluster.backend,
        spec,
        run_id,
        open_folder=open_share if share else None,
        where=lambda plan: where,
        mount_step=mount_step,
        progress=progress,
        command=command,
        tags=tags,
        retries=retries,
    )
    job_id = latest.job_id
    progress(f"submitted job {job_id} (run {plan.run_id}) to {profile.name} on {nodes_said(plan.nodes)}")
    if not wait:
        if plan.hang_timeout_s is not None:
            progress(
                "hpcjob: warning: --hang-timeout ends a hung job while hpcjob follows it (submit --wait, "
                "Run.wait()): this job is not followed"
            )
        if retries is not None and retries.retries:
            progress(
                "hpcjob: warning: --retries starts a new attempt while hpcjob follows the run: nobody "
                f"retries this one until `hpcjob wait {plan.run_id}` follows it"
            )
        progress(f"follow it with: hpcjob status {job_id}   or: hpcjob logs {job_id} --follow")
        return latest, plan, None
    folder = open_share if share else lambda: None
    if retries is None or not retries.retries:
        return latest, plan, follow_run(cluster.backend, latest, plan, folder, started, progress)
    from hpcjob.job.spec import JobSpec
    from hpcjob.runner.attempts import follow_attempts
    from hpcjob.store.runs import recorded_follow

    recorded, _ = recorded_follow(run_id)  # as submit_run recorded it: its requirements locked to its wheels
    spec = JobSpec.from_dict(recorded) if recorded else spec
    latest, summary = follow_attempts(
        cluster.backend, spec, latest, plan, folder, started, progress, retries, mount_step=mount_step
    )
    return latest, plan, summary


def read_requirements(path: Path, named: str) -> str:
    """A requirements file's text, or one line that says why not (`named`: how the user gave it)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{named}: no such file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{named}: not UTF-8 text") from None
    except OSError as exc:
        raise SpecError(f"{named}: {exc.strerror}") from None


def requirements_text(script: Path, given: str | Path | None, no_env: bool, progress: Progress) -> str | None:
    """The job's requirements: the file given, else requirements.txt beside the script (said on one
    line), else none; none at all with `no_env`."""
    if given is not None and no_env:
        raise SpecError("--requirements and --no-env contradict each other: give one")
    if no_env:
        return None
    path = Path(given) if given is not None else script.resolve().parent / "requirements.txt"
    if given is None:
        if not path.is_file():
            return None
        progress(
            f"hpcjob: the job's packages from {path.name} beside {script.name} (--no-env: the nodes' "
            "Python as it is)"
        )
    return read_requirements(path, f"--requirements {given}" if given is not None else str(path))


def blob_requirements(
    requirements: str | None, secrets: Iterable[str], *, no_env: bool, local: bool
) -> str | None:
    """The job's requirements with the pinned packages its nodes copy Blob datasets with
    (hpcjob.job.datasets.blob_packages: the SDK, and azure-identity where `secrets` hand the nodes no
    credential), an environment made for them where the job has none. With --no-env: a local run whose
    Python (this one's) has the SDK runs as it is; a cluster's nodes' own Python is not known here:
    refused."""
    from hpcjob.job.datasets import blob_packages, names_package

    if no_env:
        if local and importlib.util.find_spec("azure.storage.blob") is not None:
            return None
        raise SpecError(
            "--dataset: a Blob source is copied with azure-storage-blob, and --no-env runs the nodes' own "
            "Python: leave --no-env out (hpcjob adds it to the job's environment), or use --requirements"
        )
    added = [pin for pin in blob_packages(secrets) if not names_package(requirements or "", pin)]
    if not added:
        return requirements
    return "\n".join([*filter(None, [(requirements or "").rstrip()]), *added]) + "\n"


def submit_run(
    backend: Backend,
    spec: JobSpec,
    run_id: str,
    *,
    open_folder: Callable[[JobPlan], ShareFolder] | None,
    where: Callable[[JobPlan], Mapping[str, Any]],
    mount_step: bool,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
    gpus_per_node: int | None = None,
    retries: Retries | None = None,
) -> tuple[RunRecord, JobPlan]:
    """Plan the job on `backend`, stage its code into `open_folder(plan)` (the share, or the local
    folder that stands in for it; None: the code is there already), submit it, recording the run at
    each step (`where`: the record's share, local folder and cluster; `command`: how it was asked
    for; `gpus_per_node`: each node's GPUs, for the history's GPU-hours [default: the spec's]; the
    spec, `retries` and the mount step, from which whoever follows the run plans its next attempt). The
    run's latest record, and its plan."""
    from hpcjob.job.render import plan_json
    from hpcjob.runner.datasets import check_datasets
    from hpcjob.runner.resume import check_resume
    from hpcjob.store.runs import SUBMIT_FAILED, RunRecord, check_new_run_id, save_run
    from hpcjob.store.secrets import secret_values, secrets_way
    from hpcjob.store.staging import stage_run

    if spec.wheelhouse is not None and open_folder is None:
        raise SpecError("--wheelhouse needs --share: the nodes install its wheels from there")
    local = backend.kind == "local"
    if spec.secrets and open_folder is None and not local:
        raise SpecError("--secret needs --share: the job reads its secrets from a file in its folder there")
    values = secret_values(spec.secrets)  # before anything is staged or sent
    spec, wheels = locked_wheels(spec, progress)
    plan = backend.plan(spec, run_id)  # before the upload: refuses a run id the cluster has seen
    private: list[tuple[str, bytes]] = []
    plan = secrets_way(plan, values, local=local, private=private)
    if open_folder is not None:
        code_dir = Path(spec.script).resolve().parent
        folder = open_folder(plan)
        try:  # on the share the upload opens: the run to start from saved a checkpoint; the datasets
            check_resume(spec, plan, folder, local=backend.kind == "local")
            check_datasets(spec, plan, folder, values, local=local)
        except BaseException:
            folder.close()
            raise
        staged = stage_run(
            code_dir, folder, spec.job_folder, plan.run_id, plan.files, wheels, spec.user_folder, private
        )
        progress(staged)
        if plan.secrets_file is not None:
            progress(f"hpcjob: {len(values)} secret(s) for the job in {plan.secrets_file}, yours alone")
    else:
        check_datasets(spec, plan, None, values, local=local)
        progress("hpcjob: warning: no --share: the code must already be in the job folder on the nodes")
    first = RunRecord.of(plan, spec.job_folder, backend.kind, **where(plan))
    latest = first
    job = plan_json(plan)
    asked = json.dumps(spec.to_dict())
    follow = json.dumps({"mount_step": mount_step, "retries": retries.to_dict() if retries else None})

    def save(run: RunRecord) -> None:
        gpus = gpus_per_node or spec.gpus_per_node
        save_run(run, command=command, plan=job, tags=tags, gpus_per_node=gpus, spec=asked, follow=follow)

    def record(step: Submission) -> None:
        nonlocal latest
        latest = first.after(step)
        save(latest)

    check_new_run_id(plan.run_id)  # again: another submit may have taken it during the upload
    try:
        backend.submit(plan, mount=mount_step, progress=progress, record=record)
    except BaseException as exc:  # a step failed, the network, Ctrl-C: the record must not say "mounting"
        if latest.state not in (None, "submitted"):  # recorded, and the job is not in the scheduler
            latest = replace(latest, state=SUBMIT_FAILED, failure=submit_failure(exc, latest.state))
            with contextlib.suppress(Exception):  # the history itself failing: the first error says more
                save(latest)
        if latest.state != "submitted" and plan.secrets_file is not None and open_folder is not None:
            from hpcjob.store.secrets import remove_attempt_secrets

            with contextlib.suppress(Exception):  # no job will read them; the first error says more
                folder = open_folder(plan)
                try:
                    remove_attempt_secrets(folder, plan, progress)
                finally:
                    folder.close()
        raise
    return latest, plan


def job_spec(
    options: JobOptions,
    profile: ClusterProfile | None = None,
    *,
    local: bool = False,
    progress: Progress | None = None,
) -> JobSpec:
    """The one way from a front door's options (the command line's, hpcjob.submit's, hpcjob.render_job's)
    to a JobSpec, a cluster `profile` filling in what they do not say (with_profile). Checks that the
    script exists, then reads its requirements (the file given, else requirements.txt beside it, said to
    `progress`). `resume_from`, a run to start from, becomes the folder of its checkpoints
    (hpcjob.runner.resume; `local`: as a local run reads it). A job to run (`profile` or `local`) finds its
    `--secret` values in this machine's environment, or stops here in one line."""
    from hpcjob.job.datasets import BLOB, parse_datasets
    from hpcjob.job.spec import JobSpec, check_data_service
    from hpcjob.runner.resume import resolve
    from hpcjob.store.secrets import secret_values

    if profile is not None:
        options = with_profile(options, profile)
    script = Path(options.script)
    if not script.is_file():  # before its requirements.txt is looked for beside it
        raise SpecError(f"script {options.script} does not exist")
    requirements = requirements_text(script, options.requirements, options.no_env, progress or _unsaid)
    datasets = parse_datasets(options.datasets)  # before anything is uploaded
    if any(dataset.kind == BLOB for dataset in datasets):
        requirements = blob_requirements(
            requirements, options.secrets, no_env=options.no_env, local=local and options.python is None
        )
    resume_dir = resolve(options, local=local)
    spec = JobSpec(**options.spec_fields(), requirements=requirements, resume_dir=resume_dir)
    if spec.datasets and profile is not None and spec.local_dir is None and spec.vm_size is None:
        raise SpecError(
            "--dataset: the nodes' local folder is not known: set local_dir (or vm_size) in the cluster's "
            "profile (hpcjob cluster add ... ; clusters.toml)"
        )
    if spec.data_nodes:
        check_data_service(spec.script, script.read_text(encoding="utf-8", errors="replace"))
    if profile is not None or local:  # a job to run, not to render: its secrets' values are here
        secret_values(spec.secrets)
    return spec


def _unsaid(line: str) -> None:
    """Progress nobody asked to see."""


def smb_access(
    user: str | None, server: str | None, port: int, profile: ClusterProfile
) -> tuple[str | None, str | None, int]:
    """How the upload reaches the share: the SMB user, server and port given, the profile's server and
    port where they are not."""
    return user, server or profile.smb_server, profile.smb_port if port == 445 else port


def submit_to_cluster(
    options: JobOptions,
    cluster_name: str,
    backend_kind: str | None,
    *,
    mount_step: bool,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
    wait: bool = False,
    retries: Retries | None = None,
) -> tuple[RunRecord, JobPlan, JobSummary | None]:
    """Submit a job to the cluster of profile `cluster_name` (its share reached as the profile says), the
    profile filling in what the options do not say; with `wait`, follow it (its attempts, with
    `retries`) to its summary."""
    cluster = ClusterAccess(cluster_name, backend_kind)
    spec = job_spec(options, cluster.profile, progress=progress)
    smb = smb_access(None, None, 445, cluster.profile)
    return submit_and_follow(
        cluster,
        spec,
        options.run_id or new_run_id(spec.name),
        smb,
        mount_step=mount_step,
        wait=wait,
        progress=progress,
        command=command,
        tags=tags,
        retries=retries,
    )
