"""What a checkpoint costs training: hpctorch's asynchronous DCP save against a synchronous `torch.save`.

A model state of `--gib` GiB on the CPU (bias-free 4096x4096 linear layers, 64 MiB each), saved
`--repeats` times each way, into a folder of this machine's disk and, where it can, into a share served
by a real smbd on a test-bed host's network (read and written through smbnetfs, libsmbclient under FUSE:
this kernel cannot mount CIFS). For each: the seconds training is held per save (the whole save for
`torch.save`; for hpctorch, `async_save` until the state is staged off the model), and the wall time of a
save until it is written (and marked). The goal: held at most a tenth of the synchronous save.

    .venv/bin/python benchmarks/bench_checkpoint.py [--gib 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL = 0.1  # held / synchronous save


def measure(folder: Path, gib: float, repeats: int) -> dict[str, list[float]]:
    """Seconds per save into `folder`: sync (torch.save), held and written (hpctorch.Checkpoints)."""
    import torch

    from hpctorch import Checkpoints

    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    layers = max(1, round(gib * 16))
    model = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096, bias=False) for _ in range(layers)))
    figures: dict[str, list[float]] = {"sync": [], "held": [], "written": []}
    for repeat in range(repeats):
        target = folder / f"sync-{repeat}.pt"
        began = time.perf_counter()
        with target.open("wb") as out:
            torch.save(model.state_dict(), out)
            out.flush()
            os.fsync(out.fileno())
        figures["sync"].append(time.perf_counter() - began)
        target.unlink()
        checkpoints = Checkpoints(folder=str(folder / f"dcp-{repeat}"), every_steps=1, keep=1)
        checkpoints.close(1, model)
        [saved] = checkpoints.saved
        figures["held"].append(saved["held_s"])
        figures["written"].append(saved["written_s"])
        shutil.rmtree(folder / f"dcp-{repeat}")
        print(
            f"  {folder}: repeat {repeat + 1}/{repeats}: torch.save {figures['sync'][-1]:.2f} s; "
            f"hpctorch held {saved['held_s']:.2f} s, written in {saved['written_s']:.2f} s",
            file=sys.stderr,
        )
    return figures


def over_smb(gib: float, repeats: int) -> dict[str, list[float]] | None:
    """`measure` on a test-bed host, into the share through smbnetfs; None (said) without the tools."""
    if os.geteuid() != 0 or not all(map(shutil.which, ("smbd", "smbnetfs", "fusermount"))):
        print("over SMB: skipped: it needs root, samba and smbnetfs (apt-get install smbnetfs)")
        return None
    from tests.testbed import TestBed
    from tests.testbed.bed import smbnetfs_share

    with TestBed(("node1",)) as bed, smbnetfs_share(bed, "node1") as share:
        out = bed["node1"].check_output(
            [sys.executable, __file__, "--child", share, "--gib", str(gib), "--repeats", str(repeats)],
            timeout=3600,
        )
    result: dict[str, list[float]] = json.loads(out.strip().splitlines()[-1])
    return result


def table(where: str, figures: dict[str, list[float]]) -> None:
    sync, held, written = (statistics.median(figures[k]) for k in ("sync", "held", "written"))
    ratio = held / sync
    verdict = "met" if ratio <= GOAL else "NOT met"
    print(f"| {where} | {sync:.2f} s | {held:.2f} s | {written:.2f} s | {ratio:.3f} ({verdict}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a test-bed host's side: measure there
    args = parser.parse_args()
    if args.child:
        figures = measure(Path(args.child), args.gib, args.repeats)
        print(json.dumps(figures))
        return
    import torch

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as folder:
        local = measure(Path(folder), args.gib, args.repeats)
    smb = over_smb(args.gib, args.repeats)
    print(
        f"\ncheckpoint of a {args.gib:g} GiB model state on the CPU, {args.repeats} repeats (medians), "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs"
    )
    print(
        f"| into | torch.save (held: all) | hpctorch held | hpctorch written | held / sync (goal <= {GOAL}) |"
    )
    print("|---|---|---|---|---|")
    table("this machine's disk", local)
    if smb is not None:
        table("the share, smbd over a test-bed network (smbnetfs)", smb)


if __name__ == "__main__":
    main()
