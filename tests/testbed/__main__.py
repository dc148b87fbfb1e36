"""`python -m tests.testbed [NAMES...]`: bring a bed up and down, and print how long each took."""

from __future__ import annotations

import sys
import time

from . import TestBed, missing_prerequisites


def main(names: list[str]) -> int:
    if missing := missing_prerequisites():
        print("cannot start a test bed, missing:", ", ".join(missing), file=sys.stderr)
        return 2
    start = time.perf_counter()
    with TestBed(names or ["node1", "node2"]) as bed:
        up = time.perf_counter()
        assert bed.smb is not None
        print(f"up in {up - start:.2f} s: smbd on {bed.smb.address}:{bed.smb.port}")
        for host in bed.hosts:
            print(f"  {host.hpc_name} {host.name} {host.address} ({host.netns})")
        down = time.perf_counter()
    print(f"down in {time.perf_counter() - down:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
