"""Train a model (the FashionMNIST-style MLP, or a torchvision ResNet) with DistributedDataParallel
under torchrun.

Run on every node with ``python3 -m torch.distributed.run ... run_ddp.py [flags]``; torchrun sets
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Started without torchrun (no RANK in
the environment) it trains as a single process, which is handy for debugging.

Metrics contract with the hpcjob launcher
-----------------------------------------
At the very end of a successful run, rank 0 prints exactly one line::

    HPCJOB_METRICS {"accuracy": 0.8812, "data_wait_fraction": 0.032, ...}

The prefix is ``HPCJOB_METRICS`` followed by one space, then a single-line JSON object. It holds
only what this invocation measured; a run resumed from a checkpoint counts none of the earlier epochs'
figures as its own. Always:

* ``epochs_completed`` (int): epochs finished, including those from a resumed checkpoint
* ``epochs_trained`` (int), ``steps`` (int): epochs and training steps this invocation trained; 0 when
  the checkpoint it resumed already covered ``--epochs`` (it trained nothing)
* ``resumed_from_epoch`` (int), and ``resumed_from`` (str, the save's folder) when it resumed
* ``world_size`` (int): number of processes of this run
* ``wall_time_s`` (float): wall time of this invocation, from argument parsing to this line

and only when it trained (``epochs_trained`` > 0):

* ``train_loss``, ``test_loss`` (float): mean losses of the last epoch
* ``accuracy`` (float): fraction of correct test predictions in [0, 1], last epoch
* ``samples_per_sec`` (float): training samples of all ranks per second of training-loop time, over the
  epochs this invocation trained
* ``data_wait_fraction`` (float): share of that training-loop time spent waiting for the DataLoader
* ``gpus`` (list, only when the ranks' GPUs were watched): per rank ``rank``, ``node``, ``gpu``,
  ``util_mean_pct``, ``util_peak_pct``, ``memory_peak_mib``, ``samples``

Non-finite numbers (a diverged run) are written as ``null``. The launcher takes the last such
line of the log. Nothing else starts with this prefix.

Checkpoints and metrics through hpctorch
----------------------------------------
It uses hpctorch, the library hpcjob ships with every job, as any script may: ``hpctorch.Metrics`` for
the figures over time and the metrics line, ``hpctorch.Checkpoints`` for a save after every epoch
(asynchronous DCP: training goes on while it is written; the newest ``--checkpoints-kept`` complete saves
kept). hpcjob gives every run a folder of its own, ``$HPCJOB_CHECKPOINT_DIR``, the default of
``--checkpoint-dir``: a new run starts fresh, a restart (or a later attempt) of the same run resumes from
its newest complete save there. ``hpcjob run --resume-from RUN`` sets ``$HPCJOB_RESUME_FROM`` to that
earlier run's folder, the default of ``--resume-from``: read when the run's own folder has no save yet,
never written.

Exit codes: 0 success, 1 data/checkpoint/runtime error, 2 bad arguments or environment.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
from hpctorch import CheckpointError, Checkpoints, Metrics
from hpctorch import data as data_service
from torch.nn.parallel import DistributedDataParallel

from gpu_monitor import GpuMonitor, open_monitor
from images import default_workers, node_cpus, processes_on_node
from neural_network import MODELS, build_model, input_shape
from operations import (
    DATA_KINDS,
    DECODERS,
    DataBundle,
    DataError,
    EpochMetrics,
    StepOptions,
    Totals,
    download_fashion_mnist,
    epoch_metrics,
    epochs_to_run,
    evaluate,
    format_epoch_line,
    load_data,
    local_sums,
    make_loaders,
    one_line,
    resident_tensors,
    train_one_epoch,
)

MOMENTUM = 0.9
# What hpcjob sets for every task (hpcjob.job.plan): the run's own checkpoint folder, and with
# `--resume-from RUN` the earlier run's, to start from.
CHECKPOINT_DIR_VAR = "HPCJOB_CHECKPOINT_DIR"
RESUME_VAR = "HPCJOB_RESUME_FROM"
# When the task started (Unix time): hpcjob's node.sh sets it.
TASK_START_VAR = "HPCJOB_TASK_START"
T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Arguments and environment
# --------------------------------------------------------------------------------------------


def _number(kind: Callable[[str], T], check: Callable[[T], bool], wanted: str) -> Callable[[str], T]:
    def convert(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        return value

    return convert


positive_int = _number(int, lambda v: v > 0, "a positive integer")
non_negative_int = _number(int, lambda v: v >= 0, "a non-negative integer")
positive_float = _number(float, lambda v: v > 0 and v != float("inf"), "a positive number")
non_negative_float = _number(float, lambda v: 0 <= v < float("inf"), "a non-negative number")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_ddp.py",
        description="DDP training of an image classifier (a small MLP, or a torchvision ResNet); run it "
        "under torchrun.",
    )
    data = parser.add_argument_group("data")
    data.add_argument("--data", choices=DATA_KINDS, default="synthetic", help="data set (default: synthetic)")
    data.add_argument(
        "--data-root", type=Path, help="data folder; required for fashion-mnist and image-folder"
    )
    data.add_argument(
        "--download",
        action="store_true",
        help="download FashionMNIST if missing (off: nodes rarely have internet)",
    )
    data.add_argument(
        "--train-samples", type=positive_int, default=4096, help="synthetic train set size (default: 4096)"
    )
    data.add_argument(
        "--test-samples", type=positive_int, default=1024, help="synthetic test set size (default: 1024)"
    )
    data.add_argument(
        "--batch-size", type=positive_int, default=64, help="batch size per process (default: 64)"
    )
    data.add_argument(
        "--num-workers",
        type=non_negative_int,
        help="image-folder loader workers per process (default: the node's CPUs / its processes, less one)",
    )
    data.add_argument(
        "--prefetch", type=positive_int, default=4, help="batches each loader worker reads ahead (default: 4)"
    )
    data.add_argument(
        "--decode",
        choices=DECODERS,
        default="cpu",
        help="where image-folder JPEGs are decoded and transformed: cpu (loader workers) or device "
        "(batched nvJPEG on the GPU; the workers only read files)",
    )

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        choices=MODELS,
        default="mlp",
        help="mlp (1x28x28 input) or a torchvision image model (3x224x224) (default: mlp)",
    )
    model.add_argument("--image-size", type=positive_int, help="input size (default: 28 for mlp, else 224)")
    model.add_argument("--bf16", action="store_true", help="bfloat16 autocast (changes the last digits)")
    model.add_argument(
        "--channels-last",
        action="store_true",
        help="channels-last memory layout (same results, faster convs)",
    )

    train = parser.add_argument_group("training")
    train.add_argument(
        "--epochs", type=positive_int, default=3, help="total epochs, resumed ones included (default: 3)"
    )
    train.add_argument("--lr", type=positive_float, default=0.01, help="SGD learning rate (default: 0.01)")
    train.add_argument("--scale-lr", action="store_true", help="multiply the learning rate by the world size")
    train.add_argument(
        "--seed", type=non_negative_int, default=0, help="seed for weights, shuffling, synthetic data"
    )
    train.add_argument("--max-steps-per-epoch", type=positive_int, help="cap on training steps per epoch")
    train.add_argument(
        "--step-sleep", type=non_negative_float, default=0.0, help="seconds to sleep in every step (tests)"
    )

    runtime = parser.add_argument_group("runtime")
    runtime.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl with CUDA, gloo without")
    runtime.add_argument(
        "--device", choices=("auto", "cuda", "cpu"), default="auto", help="default: cuda if available"
    )
    runtime.add_argument(
        "--pg-timeout",
        type=positive_float,
        default=300.0,
        help="seconds before a collective with a lost peer fails",
    )
    runtime.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=Path(os.environ.get(CHECKPOINT_DIR_VAR) or "checkpoints"),
        help=f"where the run saves its checkpoints, and resumes from them (default: ${CHECKPOINT_DIR_VAR}, "
        "the run's own folder under hpcjob, else ./checkpoints)",
    )
    runtime.add_argument(
        "--resume-from",
        type=Path,
        metavar="DIR",
        default=Path(os.environ[RESUME_VAR]) if os.environ.get(RESUME_VAR) else None,
        help=f"start from the newest complete save in DIR when --checkpoint-dir has none yet; DIR is only "
        f"read (default: ${RESUME_VAR}, which `hpcjob run --resume-from RUN` sets)",
    )
    runtime.add_argument(
        "--no-resume", action="store_true", help="ignore existing checkpoints (and --resume-from)"
    )
    runtime.add_argument(
        "--checkpoints-kept",
        type=positive_int,
        default=2,
        help="complete saves kept in --checkpoint-dir, the newest (default: 2)",
    )
    runtime.add_argument(
        "--metrics-dir",
        type=Path,
        default=None,
        help="where each rank writes its metrics over time, as JSON lines (default: the run's log folder's "
        "metrics/ under hpcjob, else none: rank 0 prints them)",
    )
    runtime.add_argument(
        "--metrics-every",
        type=non_negative_float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between a rank's metrics lines (0: every step; default: 10)",
    )
    runtime.add_argument(
        "--gpu-report-every",
        type=non_negative_float,
        default=30.0,
        help="seconds between each rank's HPCJOB_GPU line (0: none; default: 30)",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the flags; any problem exits with status 2 and a one-line error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.data != "synthetic" and args.data_root is None:
        parser.error(f"--data {args.data} needs --data-root")
    if args.download and args.data != "fashion-mnist":
        parser.error("--download only applies to --data fashion-mnist")
    if args.decode == "device" and args.data != "image-folder":
        parser.error("--decode device only applies to --data image-folder")
    return args


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    under_torchrun: bool


def read_dist_env(environ: Mapping[str, str]) -> DistEnv:
    """Rank, world size and local rank as set by torchrun; a single process without it."""
    if "RANK" not in environ:
        return DistEnv(0, 1, 0, under_torchrun=False)
    try:
        rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local_rank = int(environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"bad torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {one_line(exc)}") from exc
    if not (0 <= rank < world_size and local_rank >= 0):
        raise ValueError(
            f"bad torchrun environment: RANK={rank} WORLD_SIZE={world_size} LOCAL_RANK={local_rank}"
        )
    return DistEnv(rank, world_size, local_rank, under_torchrun=True)


def choose_device(requested: str, backend: str | None, local_rank: int) -> tuple[torch.device, str]:
    """The device and backend for this process; raises ValueError for impossible combinations."""
    cuda = torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        raise ValueError("--device cuda, but CUDA is not available on this node")
    use_cuda = requested == "cuda" or (requested == "auto" and cuda)
    chosen = backend or ("nccl" if use_cuda else "gloo")
    if chosen == "nccl" and not use_cuda:
        raise ValueError("--backend nccl needs a CUDA device")
    if not use_cuda:
        return torch.device("cpu"), chosen
    if local_rank >= torch.cuda.device_count():
        raise ValueError(
            f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s): "
            "start fewer processes per node"
        )
    return torch.device("cuda", local_rank), chosen


# --------------------------------------------------------------------------------------------
# Collective helpers
# --------------------------------------------------------------------------------------------


def _nothing() -> None:
    pass


class RunAborted(Exception):
    """All ranks agreed to stop; the failing rank(s) already printed why."""


@dataclass
class Context:
    env: DistEnv
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    def log(self, message: str) -> None:
        # Only rank 0 logs so that every line appears once in the job output.
        if self.is_main:
            print(message, flush=True)

    def main_only(self, step: Callable[[], None]) -> Callable[[], None]:
        """``step`` on rank 0, a no-op elsewhere (for use with ``on_all_ranks``)."""
        return step if self.is_main else _nothing

    def all_reduce(
        self, values: Sequence[float], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> list[float]:
        # float64 on the process's device: NCCL only reduces CUDA tensors.
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return [float(v) for v in tensor.tolist()]

    def gather(self, value: T) -> list[T]:
        """Every rank's `value`, in rank order (small picklable values; once an epoch at most)."""
        values: list[T] = [value] * self.env.world_size
        dist.all_gather_object(values, value)
        return values

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.env.local_rank])
        else:
            dist.barrier()

    def on_all_ranks(self, step: Callable[[], T], what: str) -> T:
        """Run ``step`` on every rank and stop all of them if it failed on any.

        Without this a rank that hit a missing file would exit while its peers sit in the next
        collective until the process-group timeout.
        """
        try:
            result = step()
        except (DataError, CheckpointError, OSError, data_service.DataServiceError) as exc:
            self._agree(one_line(exc), what)  # raises: this rank failed
            raise
        self._agree(None, what)
        return result

    def _agree(self, error: str | None, what: str) -> None:
        (failed,) = self.all_reduce([1.0 if error is not None else 0.0])
        if not failed:
            return
        if error is not None:
            print(f"error: rank {self.env.rank}: {error}", file=sys.stderr, flush=True)
        elif self.is_main:
            print(
                f"error: {what} failed on {int(failed)} rank(s); see their output",
                file=sys.stderr,
                flush=True,
            )
        raise RunAborted(what)


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def prepare_data(args: argparse.Namespace, ctx: Context) -> DataBundle:
    """Load the data set; with --download fetch it once per node before anyone reads it."""
    if args.download:
        # Rank 0 first, then the first process of every other node: with a shared data root the
        # others find the files already there; with node-local roots each node gets its copy.
        # Nobody downloads into the same folder concurrently.
        download = partial(download_fashion_mnist, args.data_root)
        ctx.on_all_ranks(ctx.main_only(download), "download")
        ctx.on_all_ranks(download if ctx.env.local_rank == 0 and not ctx.is_main else _nothing, "download")
    shape = input_shape(args.model, args.image_size)
    return ctx.on_all_ranks(
        lambda: load_data(
            args.data, args.data_root, args.train_samples, args.test_samples, args.seed, shape, args.decode
        ),
        "loading data",
    )


def loader_workers(args: argparse.Namespace, data: DataBundle) -> int:
    """--num-workers, else for files this process's share of the node's CPUs; none for data in memory."""
    if args.num_workers is not None:
        return int(args.num_workers)
    if args.data != "image-folder":
        return 0
    return default_workers(node_cpus(), processes_on_node(os.environ))


@dataclass(frozen=True)
class Resumed:
    """Where this invocation started: the save it resumed (None: from scratch), its epoch and step."""

    path: str | None = None
    epoch: int = 0
    step: int = 0


def final_metrics(
    args: argparse.Namespace,
    ctx: Context,
    resumed: Resumed,
    started: float,
    trained: tuple[EpochMetrics, Totals, int] | None = None,
    gpus: Sequence[dict[str, object]] = (),
) -> dict[str, object]:
    """The metrics line's figures: what this invocation measured. `trained`: the last epoch it trained,
    its own epochs' counters and its steps; None when it trained nothing (the save it resumed covered
    --epochs): then no losses, accuracy or throughput, which would be the earlier run's."""
    last, totals, steps = trained if trained is not None else (None, Totals(), 0)
    result: dict[str, object] = {
        "epochs_completed": last.epoch if last is not None else resumed.epoch,
        "epochs_requested": args.epochs,
        "epochs_trained": last.epoch - resumed.epoch if last is not None else 0,
        "steps": steps,
        "resumed_from_epoch": resumed.epoch,
        "world_size": ctx.env.world_size,
        "backend": ctx.backend,
        "device": ctx.device.type,
        "data": args.data,
        "model": args.model,
        "bf16": args.bf16,
        "channels_last": args.channels_last,
        "wall_time_s": time.perf_counter() - started,
    }
    if resumed.path is not None:
        result["resumed_from"] = resumed.path
    if last is not None:
        result.update(
            train_loss=last.train_loss,
            test_loss=last.test_loss,
            accuracy=last.accuracy,
            samples_per_sec=totals.samples_per_sec,
            data_wait_fraction=totals.data_wait_fraction,
        )
    if gpus:  # no GPU watched: no field, rather than zeros
        result["gpus"] = list(gpus)
    return result


def open_checkpoints(args: argparse.Namespace, ctx: Context) -> Checkpoints:
    """The run's checkpoints (hpctorch: a folder checked writable on every rank)."""
    return ctx.on_all_ranks(
        lambda: Checkpoints(
            folder=str(args.checkpoint_dir),
            keep=args.checkpoints_kept,
            resume_from=None if args.resume_from is None else str(args.resume_from),
        ),
        "opening the checkpoint folder",
    )


def resume(checkpoints: Checkpoints, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Resumed:
    """The newest complete save loaded into the model and optimizer (hpctorch), and where it was: its
    epochs, kept beside the model in the save's `extra`."""
    step = checkpoints.resume(model, optimizer)
    if checkpoints.resumed_from is None:
        return Resumed()
    epoch = checkpoints.extra.get("epoch")
    if not isinstance(epoch, int) or epoch < 0 or not isinstance(checkpoints.extra.get("totals"), dict):
        raise CheckpointError(
            f"hpctorch: {checkpoints.resumed_from} was not saved by run_ddp.py (no epoch in it)"
        )
    return Resumed(checkpoints.resumed_from, epoch, step)


def gpu_use(ctx: Context, monitor: GpuMonitor | None) -> list[dict[str, object]]:
    """Every watched rank's GPU use while it trained, in rank order (a collective: all ranks call it)."""
    if monitor is not None:
        monitor.training_ended()
    summaries = ctx.gather(monitor.summary() if monitor else None)
    return [summary for summary in summaries if summary is not None]


def epoch_gpu_util(ctx: Context, monitor: GpuMonitor | None) -> float | None:
    """The ranks' mean GPU utilisation over the epoch just ended (a collective), None when unwatched."""
    utils = [u for u in ctx.gather(monitor.window_util() if monitor else None) if u is not None]
    return sum(utils) / len(utils) if utils else None


def first_step_done(ctx: Context, started: float, monitor: GpuMonitor | None = None) -> None:
    """Start-up cost, in a person's words: how long after the task's start (node.sh's HPCJOB_TASK_START;
    without hpcjob, this process's) the run's first step was done, and at what local time (the exact
    time is in the rank's timeline: hpctorch's `first_step` line). The GPU figures count from here."""
    if monitor is not None:
        monitor.training_begins()
    now = time.time()
    try:
        since = now - float(os.environ[TASK_START_VAR])
    except (KeyError, ValueError):
        since = time.perf_counter() - started
    ctx.log(f"first step done {since:.1f} s after start ({time.strftime('%H:%M:%S', time.localtime(now))})")


def gpu_figures(monitor: GpuMonitor | None) -> dict[str, float]:
    """This rank's newest GPU reading, for its timeline's step lines (none when unwatched)."""
    sample = monitor.latest if monitor is not None else None
    if sample is None:
        return {}
    return {"gpu_util_pct": sample.util_pct, "gpu_memory_mib": sample.memory_mib}


def run(args: argparse.Namespace, ctx: Context, started: float, monitor: GpuMonitor | None = None) -> None:
    folder = str(args.metrics_dir) if args.metrics_dir is not None else None
    metrics = Metrics(folder=folder, every_s=args.metrics_every)  # this start's timeline
    checkpoints = open_checkpoints(args, ctx)
    data = prepare_data(args, ctx)
    torch.manual_seed(args.seed)  # identical initial weights everywhere (DDP broadcasts rank 0's anyway)
    shape = input_shape(args.model, args.image_size)
    options = StepOptions(bf16=args.bf16, channels_last=args.channels_last)
    model = build_model(args.model, data.num_classes, shape).to(ctx.device)
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    lr = args.lr * ctx.env.world_size if args.scale_lr else args.lr
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    resumed = Resumed()
    totals = Totals()  # over all epochs, the resumed ones' too: kept with each save
    if not args.no_resume:
        # DCP loads into the model's own (on-device) tensors, resharding a save of another world size.
        resumed = ctx.on_all_ranks(
            partial(resume, checkpoints, model, optimizer), "resuming from a checkpoint"
        )
        if resumed.path is not None:
            totals = Totals(**checkpoints.extra.get("totals", {}))
        for group in optimizer.param_groups:
            group["lr"] = lr  # the current flags win (the world size may have changed)
    completed = resumed.epoch
    if resumed.path is not None and not epochs_to_run(completed, args.epochs):
        covers = f"already covers {completed} of {args.epochs} epoch(s)"
        ctx.log(f"checkpoint {resumed.path} {covers}; nothing to train")
        metrics.summary(**final_metrics(args, ctx, resumed, started))
        return
    if resumed.path is not None:
        ctx.log(
            f"resumed from {resumed.path} at epoch {completed}, continuing with epoch "
            f"{completed + 1}/{args.epochs}"
        )

    ddp_model = DistributedDataParallel(
        model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None
    )
    loaders = make_loaders(
        data,
        rank=ctx.env.rank,
        world_size=ctx.env.world_size,
        batch_size=args.batch_size,
        num_workers=(workers := loader_workers(args, data)),
        seed=args.seed,
        pin_memory=ctx.device.type == "cuda",
        device=ctx.device,
        shape=shape,
        prefetch=args.prefetch,
    )
    remote = remote_batches(args, ctx)
    if remote is not None:  # the data nodes make this rank's training batches
        loaders = replace(loaders, train=remote, train_sampler=remote)
    ctx.log(
        f"start world_size={ctx.env.world_size} backend={ctx.backend} device={ctx.device.type} "
        f"model={args.model} input={'x'.join(map(str, shape.dims))} bf16={args.bf16} "
        f"channels_last={args.channels_last} data={data.description} loader_workers={workers} "
        f"train_samples={data.train_size} test_samples={data.test_size} classes={data.num_classes} "
        f"batch_size={args.batch_size} global_batch_size={args.batch_size * ctx.env.world_size} lr={lr:g} "
        f"epochs={args.epochs} first_epoch={completed + 1}"
    )

    mine, steps = Totals(), 0  # this invocation's own: its metrics line
    step = resumed.step  # the run's steps, the resumed ones' too: what its saves are numbered by
    last: EpochMetrics | None = None
    for epoch in epochs_to_run(completed, args.epochs):
        loaders.train_sampler.set_epoch(epoch)  # a different, but reproducible, shuffle every epoch

        def one_step(samples: int, loss: torch.Tensor, data_wait_s: float, epoch: int = epoch) -> None:
            nonlocal step
            step += 1
            metrics.step(samples, loss, data_wait_s, epoch=epoch, step=step, **gpu_figures(monitor))

        train_stats = train_one_epoch(
            ddp_model,
            loaders.train,
            optimizer,
            ctx.device,
            max_steps=args.max_steps_per_epoch,
            step_sleep=args.step_sleep,
            on_first_step=partial(first_step_done, ctx, started, monitor) if epoch == completed + 1 else None,
            options=options,
            on_step=one_step,
        )
        eval_stats = evaluate(model, loaders.test, ctx.device, options)
        sums = ctx.all_reduce(local_sums(train_stats, eval_stats))
        (slowest,) = ctx.all_reduce([train_stats.loop_s], op=dist.ReduceOp.MAX)
        last, epoch_totals = epoch_metrics(epoch, sums, slowest)
        totals, mine, steps = totals.add(epoch_totals), mine.add(epoch_totals), steps + train_stats.steps
        util = epoch_gpu_util(ctx, monitor)
        ctx.log(format_epoch_line(last, args.epochs) + (f" gpu_util={util:.0f}%" if util is not None else ""))
        metrics.epoch(**asdict(last))
        # In the background: the next epoch trains while this one's save is written (hpctorch).
        extra = {"epoch": epoch, "totals": asdict(totals)}
        ctx.on_all_ranks(partial(checkpoints.save, step, model, optimizer, extra), "saving a checkpoint")

    ctx.on_all_ranks(checkpoints.close, "finishing the last checkpoint")
    assert last is not None  # epochs_to_run was not empty
    gpus = gpu_use(ctx, monitor)
    figures = final_metrics(args, ctx, resumed, started, (last, mine, steps), gpus)
    if remote is not None:
        figures.update(data_node_metrics(ctx.gather(remote.close())))
    metrics.summary(**figures)


def remote_batches(args: argparse.Namespace, ctx: Context) -> data_service.RemoteBatches | None:
    """This rank's batches from its data node, in a job with data nodes (HPCJOB_ROLE=trainer); else
    None. Every rank waits for its data node (--data-wait at most), and all stop if one cannot."""
    if data_service.role(os.environ) != data_service.TRAINER_ROLE:
        return None
    layout = data_service.Layout.from_env(os.environ)
    if layout is None:
        return None
    return ctx.on_all_ranks(
        lambda: data_service.RemoteBatches(
            layout, ctx.env.rank, batch_size=args.batch_size, seed=args.seed, prefetch=args.prefetch
        ),
        "connecting to the data nodes",
    )


def data_node_metrics(served: Sequence[dict[str, object] | None]) -> dict[str, object]:
    """What the data nodes did, from each trainer's last word with its data node: per node its latest
    figures, and their samples a second together."""
    nodes: dict[str, dict[str, object]] = {}
    for figures in served:
        if figures is None:
            continue
        node = str(figures.get("node"))
        if node not in nodes or _count(figures) >= _count(nodes[node]):
            nodes[node] = figures
    rates = [r for f in nodes.values() if isinstance(r := f.get("samples_per_sec"), int | float)]
    return {"data_node_stats": list(nodes.values()), "data_samples_per_sec": sum(rates) if rates else None}


def _count(figures: dict[str, object]) -> int:
    samples = figures.get("samples")
    return samples if isinstance(samples, int) else 0


def serve_data(args: argparse.Namespace) -> int:
    """A data node's whole part (HPCJOB_ROLE=data): the training set, decoded and augmented here in
    loader workers, served to the trainer ranks this node serves until each is done. No process group:
    a data node is no rank of the training's world."""
    layout = data_service.Layout.from_env(os.environ)
    if layout is None:
        print("error: HPCJOB_ROLE=data, and the job names no data nodes (HPCJOB_DATA_NODES)", file=sys.stderr)
        return 2
    node = os.environ.get("HPCJOB_NODE") or data_service.socket.gethostname().split(".")[0]
    shape = input_shape(args.model, args.image_size)
    data = load_data(
        args.data, args.data_root, args.train_samples, args.test_samples, args.seed, shape, decode="cpu"
    )
    streams = max(1, len(layout.ranks_of(node)))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # Decoding is the work here: every CPU this node gives, shared by the trainer ranks it serves; data
    # held in memory needs no worker.
    workers = 0 if resident_tensors(data.train) is not None else max(1, cpus // streams)
    if args.num_workers is not None:
        workers = args.num_workers
    print(
        f"data node {node}: {data.description}, {data.train_size} training samples, {workers} loader "
        f"worker(s) per trainer rank, {cpus} CPU(s)",
        flush=True,
    )
    data_service.serve(
        data.train,
        layout,
        node,
        data_service.node_address(os.environ),
        batch_size=args.batch_size,
        seed=args.seed,
        workers=workers,
        prefetch=args.prefetch,
        log=partial(print, flush=True),
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    parser = build_parser()
    args = parse_args(argv)
    if data_service.role(os.environ) == data_service.DATA_ROLE:  # a CPU node: no device, no torchrun
        try:
            return serve_data(args)
        except (DataError, OSError, data_service.DataServiceError) as exc:
            print(f"error: data node: {one_line(exc)}", file=sys.stderr, flush=True)
            return 1
    try:
        env = read_dist_env(os.environ)
        device, backend = choose_device(args.device, args.backend, env.local_rank)
    except ValueError as exc:
        parser.error(str(exc))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif "OMP_NUM_THREADS" not in os.environ:
        # Training on the CPU: the processes sharing this node's CPUs (all local nodes' on `run --local`)
        # split them, rather than each taking them all and taking turns.
        torch.set_num_threads(max(1, node_cpus() // processes_on_node(os.environ)))
    timeout = timedelta(seconds=args.pg_timeout)
    if env.under_torchrun:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    else:
        # Single process without torchrun: a private store on a free local port.
        dist.init_process_group(
            backend, init_method="tcp://127.0.0.1:0", rank=0, world_size=1, timeout=timeout
        )
    ctx = Context(env, device, backend)
    monitor = open_monitor(device, env.rank, report_every_s=args.gpu_report_every)
    try:
        run(args, ctx, started, monitor)
        ctx.barrier()  # nobody tears down while a peer still needs the process group
    except RunAborted:
        return 1
    finally:
        if monitor is not None:
            monitor.stop()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: after a clean run and destroy_process_group, torch 2.14's gloo
    # threads were seen to abort a rank in C++ destructors at exit ("terminate called without an
    # active exception", SIGABRT), failing a job that had finished its work.
    os._exit(exit_code)
