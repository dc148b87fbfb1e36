"""All-reduce bandwidth across a job's nodes, for `hpcjob doctor`: NCCL on GPUs, else gloo on the CPU.

Runs under torchrun like the training program. Rank 0 prints one `HPCJOB_METRICS {...}` line: the
backend, the message size, the bus bandwidth in GB/s (as nccl-tests reports it: the algorithm bandwidth
times 2(n-1)/n) and whether the sum came out right.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

MESSAGE_MB = {"nccl": 256, "gloo": 16}  # large enough to measure bandwidth, not latency
ROUNDS = 5


def main() -> int:
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    if cuda and len(sys.argv) > 2 and sys.argv[1] == "--mb":  # the size's mark was measured at this size
        MESSAGE_MB["nccl"] = int(sys.argv[2])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=120))
    world = dist.get_world_size()
    size = MESSAGE_MB[backend] * (1 << 20)
    data = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.all_reduce(data)  # warm-up: connections, buffers
    correct = bool(torch.all(data == world).item())
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(ROUNDS):
        dist.all_reduce(data)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - started) / ROUNDS
    bus = size / seconds * 2 * (world - 1) / world / 1e9
    if dist.get_rank() == 0:
        result = {"allreduce_backend": backend, "allreduce_mb": MESSAGE_MB[backend], "world_size": world}
        result |= {"torch": torch.__version__, "cuda": cuda, "python": sys.executable}
        result |= {"allreduce_bus_gbps": round(bus, 3), "allreduce_correct": correct}
        print("HPCJOB_METRICS " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if correct else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # as the training program: no interpreter teardown after a clean run (gloo aborts)
