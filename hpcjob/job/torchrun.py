"""The torchrun task command line, as bash text. Pure: no I/O.

HPC Pack's Linux agent writes a task's CommandLine into `cmd.sh` and runs it with `/bin/bash` in the
task's WorkDirectory (facts/hpcpack-jobs.md section 5), so the command is bash script text: the
script's arguments are quoted for bash, and `$HPCJOB_*` variables set by the node helper expand on
the node. The line is the same on every node; what differs per node is decided by the helper.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

# Files hpcjob puts into the job folder next to the user's code (see hpcjob/node/).
NODE_DIR = ".hpcjob"
NODE_HELPER = f"{NODE_DIR}/node.sh"
WORKER_SHIM = f"{NODE_DIR}/worker.py"
ENV_BUILDER = f"{NODE_DIR}/env.py"
# node.sh's function that copies the job's datasets (hpcjob/node/datasets.py) with the task's Python, for
# its role, and exports HPCJOB_DATASETS; a short word, for the scheduler's limit on a command line.
DATASETS_STEP = "hpcjob_datasets"
# Heartbeats a rendezvous member may miss before the others drop it (torchrun's default, kept).
KEEP_ALIVE_ATTEMPTS = 3


@dataclass(frozen=True)
class TorchrunCommand:
    """Everything the torchrun line depends on."""

    python: str
    nnodes: int
    nproc_per_node: int
    rdzv_endpoint: str
    rdzv_id: str
    store_node: str
    script: str
    script_args: tuple[str, ...] = ()
    max_restarts: int = 0
    rdzv_join_timeout: int | None = None
    rdzv_last_call: int | None = None
    rdzv_keep_alive: int | None = None  # seconds between the agents' heartbeats
    min_nnodes: int | None = None  # elastic: torchrun's --nnodes=MIN:MAX
    environment: bool = False  # run in the job's environment (hpcjob/node/env.py) built from `python`
    log_id: str | None = None  # the task's log folder under logs/ [default: rdzv_id]
    datasets: bool = (
        False  # copy the job's datasets first (node.sh's hpcjob_datasets: hpcjob/node/datasets.py)
    )


def bash_quote(word: str) -> str:
    """Quote one word so that bash gives it back unchanged (any text, newlines included)."""
    return shlex.quote(word)


def bash_join(words: Sequence[str]) -> str:
    return " ".join(bash_quote(w) for w in words)


def command_line(cmd: TorchrunCommand) -> str:
    """The task CommandLine: source the node helper, then run torchrun.

    The helper decides on the node whether it hosts the c10d store (`$HPCJOB_IS_HOST`), which
    address the agent advertises (`$HPCJOB_ADDR`) and which interface gloo/NCCL use, so a host
    name that differs in case or domain from the HPC Pack node name, or that resolves to 127.0.1.1,
    cannot hang the rendezvous. torchrun starts the worker shim, which runs the script and records
    a failing rank's exit code so that the task exits with it rather than torchrun's generic 1.
    """
    rdzv_conf = "is_host=$HPCJOB_IS_HOST"
    if cmd.rdzv_join_timeout is not None:
        rdzv_conf += f",join_timeout={cmd.rdzv_join_timeout}"
    if cmd.rdzv_last_call is not None:
        rdzv_conf += f",last_call_timeout={cmd.rdzv_last_call}"
    if cmd.rdzv_keep_alive is not None:  # torch's dynamic_rendezvous.create_handler reads both
        rdzv_conf += (
            f",keep_alive_interval={cmd.rdzv_keep_alive},keep_alive_max_attempt={KEEP_ALIVE_ATTEMPTS}"
        )
    helper, python = _helper_and_python(cmd)
    if cmd.datasets:
        helper += f" && {DATASETS_STEP} {python}"
    torchrun = [
        python,
        "-m torch.distributed.run",
        f"--nnodes={cmd.nnodes}" if cmd.min_nnodes is None else f"--nnodes={cmd.min_nnodes}:{cmd.nnodes}",
        f"--nproc_per_node={cmd.nproc_per_node}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={bash_quote(cmd.rdzv_endpoint)}",
        f"--rdzv_id={bash_quote(cmd.rdzv_id)}",
        f"--rdzv_conf={rdzv_conf}",
        "--local_addr=$HPCJOB_ADDR",
        f"--max_restarts={cmd.max_restarts}",
        WORKER_SHIM,
        bash_join([cmd.script, *cmd.script_args]),
    ]
    return f"{helper} && {' '.join(torchrun)}"


def _helper_and_python(cmd: TorchrunCommand) -> tuple[str, str]:
    """The node helper's line, and the Python that runs the task (the job's environment's, if any)."""
    helper = bash_join([".", NODE_HELPER, cmd.store_node, cmd.log_id or cmd.rdzv_id])
    python = bash_quote(cmd.python)
    if cmd.environment:  # the node's Python builds (or finds) the job's environment and names its Python
        helper += f" && HPCJOB_PYTHON=$({python} {ENV_BUILDER})"
        python = '"$HPCJOB_PYTHON"'
    return helper, python


# A data task's role, on its command line; a task of a job with data nodes without it is a trainer (the
# trainers' lines stay as they are: the scheduler's limit on a CommandLine is tight).
DATA_ROLE = "data"


def data_command_line(cmd: TorchrunCommand) -> str:
    """A data node's task CommandLine: the node helper (the same address rule as the trainers'), then
    the script itself in its data-service role, HPCJOB_ROLE=data. No torchrun: a data node is no rank of
    the training's world, and its output is unbuffered, for the logs."""
    helper, python = _helper_and_python(cmd)
    if cmd.datasets:
        helper += f" && {DATASETS_STEP} {python} {DATA_ROLE}"
    return f"{helper} && HPCJOB_ROLE={DATA_ROLE} {python} -u {bash_join([cmd.script, *cmd.script_args])}"
