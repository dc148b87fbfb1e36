"""The training program's data service (issue 34), over real ZeroMQ sockets on loopback: the trainers
together get exactly DistributedSampler's indices each epoch, padding included; a client without the
attempt's key gets nothing; a batch is read back from raw frames and checked, never unpickled."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hpcjob.backends.local import free_port
from hpctorch.data import (
    DataServiceError,
    Layout,
    RemoteBatches,
    ServeStats,
    batch_frames,
    serve,
    tensors_of,
    wait_for_endpoint,
)
from torch.utils.data import Dataset, DistributedSampler

pytest.importorskip("zmq")


class Numbered(Dataset[tuple[torch.Tensor, int]]):
    """Sample i is a small image whose label is i: what a trainer got says which indices it got."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((1, 2, 2), float(index)), index


def start_data_nodes(
    layout: Layout, dataset: Dataset[Any], batch_size: int, said: list[str] | None = None
) -> list[threading.Thread]:
    """Each data node of the layout serving in a thread of its own, all asked for the same port, as on
    one host: the second finds it taken and serves on another (`said` gets their lines)."""
    results: list[ServeStats] = []
    threads = []
    port = free_port()
    lines = said if said is not None else []
    for node in layout.nodes:
        thread = threading.Thread(
            target=lambda node=node: results.append(
                serve(
                    dataset,
                    layout,
                    node,
                    "127.0.0.1",
                    batch_size=batch_size,
                    seed=7,
                    workers=0,
                    prefetch=2,
                    port=port,
                    log=lines.append,
                )
            ),
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    return threads


@pytest.mark.parametrize(("length", "clients", "data_nodes"), [(23, 2, 1), (23, 4, 2), (5, 3, 2)])
def test_the_trainers_get_exactly_distributed_sampler_s_indices(
    tmp_path: Path, length: int, clients: int, data_nodes: int
) -> None:
    """23 samples for 2 and 4 ranks, 5 for 3: padded (the first indices again) as DistributedSampler
    pads them, each rank its strided share, two epochs shuffled differently."""
    names = tuple(f"DATA{i}" for i in range(1, data_nodes + 1))
    layout = Layout(names, 0, 20.0, tmp_path / "data", clients)
    said: list[str] = []
    threads = start_data_nodes(layout, Numbered(length), batch_size=3, said=said)
    got: dict[tuple[int, int], list[int]] = {}
    trainers = [RemoteBatches(layout, rank, batch_size=3, seed=7, prefetch=2) for rank in range(clients)]
    for epoch in (0, 1):
        for trainer in trainers:
            trainer.set_epoch(epoch)
            labels = [int(label) for _, batch in trainer for label in batch]
            got[(epoch, trainer.rank)] = labels
    for trainer in trainers:
        served = trainer.close()
        assert served is not None and served["node"] == layout.node_of(trainer.rank)
    for thread in threads:
        thread.join(timeout=20)
        assert not thread.is_alive(), "a data node did not end once every rank it serves was done"
    taken = [line for line in said if " is taken on 127.0.0.1: serving on " in line]
    assert len(taken) == data_nodes - 1  # one host: the first took the port, the other another
    for (epoch, rank), labels in got.items():
        sampler = DistributedSampler(range(length), num_replicas=clients, rank=rank, shuffle=True, seed=7)
        sampler.set_epoch(epoch)
        assert labels == list(sampler), (epoch, rank)
    assert got[(0, 0)] != got[(1, 0)]  # each epoch its own shuffle
    everyone = sorted(i for (epoch, _), labels in got.items() if epoch == 0 for i in labels)
    assert set(everyone) == set(range(length)) and len(everyone) >= length  # all, padded to a multiple


def test_an_epoch_left_early_leaves_no_answer_for_the_next(tmp_path: Path) -> None:
    """A trainer that stops after two batches (--max-steps-per-epoch) with requests still out: the next
    epoch and the last word get their own answers, not those left over."""
    layout = Layout(("DATA1",), 0, 20.0, tmp_path / "data", 1)
    threads = start_data_nodes(layout, Numbered(40), batch_size=2)
    trainer = RemoteBatches(layout, 0, batch_size=2, seed=7, prefetch=4)
    trainer.set_epoch(0)
    batches = iter(trainer)
    first = [int(label) for _ in range(2) for label in next(batches)[1]]
    del batches  # the epoch left early
    trainer.set_epoch(1)
    labels = [int(label) for _, batch in trainer for label in batch]
    sampler = DistributedSampler(range(40), num_replicas=1, rank=0, shuffle=True, seed=7)
    assert first == list(sampler)[:4]
    sampler.set_epoch(1)
    assert labels == list(sampler)
    served = trainer.close()
    assert served is not None and served["node"] == "DATA1"
    threads[0].join(timeout=20)
    assert not threads[0].is_alive()


def test_a_client_without_the_attempt_s_key_gets_nothing(tmp_path: Path) -> None:
    import zmq

    layout = Layout(("DATA1",), 0, 10.0, tmp_path / "data", 1)
    threads = start_data_nodes(layout, Numbered(8), batch_size=4)
    endpoint = wait_for_endpoint(layout.folder, "DATA1", 10.0)
    assert (layout.folder / "DATA1.json").stat().st_mode & 0o077 == 0  # the owner's alone
    context = zmq.Context()
    try:
        for keys in ("another pair", "none"):
            intruder = context.socket(zmq.DEALER)
            intruder.linger = 0
            if keys == "another pair":  # knows the server's public key, not the client's secret one
                public, secret = zmq.curve_keypair()
                intruder.curve_secretkey, intruder.curve_publickey = secret, public
                intruder.curve_serverkey = endpoint.server_public
            intruder.connect(f"tcp://{endpoint.address}:{endpoint.port}")
            intruder.send(b'{"op": "epoch", "epoch": 0, "rank": 0, "world_size": 1, "batch_size": 4}')
            assert intruder.poll(1500) == 0, f"a client with {keys} got an answer"
            intruder.close()
    finally:
        context.term()
    trainer = RemoteBatches(layout, 0, batch_size=4, seed=7)  # the job's own trainer is served
    trainer.set_epoch(0)
    assert sum(len(labels) for _, labels in trainer) == 8
    trainer.close()
    threads[0].join(timeout=20)
    assert not threads[0].is_alive()


def test_a_batch_is_read_back_from_raw_frames_and_checked() -> None:
    images = torch.randn(3, 1, 2, 2).to(torch.bfloat16)
    labels = torch.tensor([4, 5, 6])
    frames = [bytes(frame) for frame in batch_frames(images, labels)]
    back_images, back_labels = tensors_of(frames)
    assert torch.equal(back_images, images) and torch.equal(back_labels, labels)
    with pytest.raises(DataServiceError, match="bytes, not the"):
        tensors_of([frames[0], frames[1][:-2], frames[2]])
    with pytest.raises(DataServiceError, match="unknown kind"):
        tensors_of([frames[0].replace(b"bfloat16", b"object"), frames[1], frames[2]])


def test_a_data_node_that_never_comes_up_is_one_line_after_the_wait(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(DataServiceError) as raised:
        wait_for_endpoint(tmp_path, "CPUNODE007", 0.5, poll_s=0.05)
    assert time.monotonic() - started < 5
    message = str(raised.value)
    assert message.startswith("data node CPUNODE007 did not come up within 0.5 s (--data-wait)")
    assert "\n" not in message


def test_a_keyed_client_s_malformed_requests_are_refused_and_the_node_serves_on(tmp_path: Path) -> None:
    """Whoever holds the attempt's key (the job's own trainer gone wrong, or a copy of its file) sends
    what a trainer never does: each is refused (or, past ZeroMQ's limit, dropped unread), the data node
    does not crash, and the trainer is served after them; a trainer of another seed is refused."""
    import zmq

    layout = Layout(("DATA1",), 0, 10.0, tmp_path / "data", 1)
    threads = start_data_nodes(layout, Numbered(8), batch_size=4)
    endpoint = wait_for_endpoint(layout.folder, "DATA1", 10.0)
    context = zmq.Context()
    keyed = context.socket(zmq.DEALER)
    keyed.linger = 0
    keyed.curve_secretkey, keyed.curve_publickey = endpoint.client_secret, endpoint.client_public
    keyed.curve_serverkey = endpoint.server_public
    keyed.connect(f"tcp://{endpoint.address}:{endpoint.port}")
    epoch = b'"op": "epoch", "epoch": 0, "world_size": 1, "batch_size": 4, "seed": 7'
    bad = {
        "two frames": [b'{"op": "next", "rank": 0}', b"more"],
        "an infinite number": [b'{"op": "epoch", "rank": 1e999, ' + epoch[1:] + b"}"],
        "NaN": [b'{"op": "done", "rank": NaN}'],
        "a huge number": [b'{"op": "done", "rank": ' + b"9" * 4000 + b"}"],
        "deep JSON": [b"[" * 30000 + b"]" * 30000],
        "not JSON": [b"\xff\xfe"],
        "another seed": [b'{"rank": 0, ' + epoch.replace(b'"seed": 7', b'"seed": 8') + b"}"],
    }
    try:
        for what, frames in bad.items():
            keyed.send_multipart(frames)
            assert keyed.poll(5000), f"{what}: no answer"
            [answer] = keyed.recv_multipart()
            assert b'"refused"' in answer, (what, answer)
            if what == "another seed":
                assert b"seed 8 is not this data node's, 7" in answer
        keyed.send(b"{" + b" " * (200 << 20) + b"}")  # 200 MiB: past the limit, its connection dropped
        assert keyed.poll(1500) == 0
    finally:
        keyed.close()
        context.term()
    trainer = RemoteBatches(layout, 0, batch_size=4, seed=7)
    trainer.set_epoch(0)
    assert sum(len(labels) for _, labels in trainer) == 8
    served = trainer.close()
    assert served is not None and served["refused"] == len(bad)
    threads[0].join(timeout=20)
    assert not threads[0].is_alive()


@pytest.mark.parametrize(
    ("frames", "said"),
    [
        ([b"not json", b"", b""], "a message that is not JSON"),
        ([b"[1]", b"", b""], "a message that is not a JSON object"),
        ([b'{"tensors": [["float32", [2]]]}', b"", b""], "other than two tensors"),
        ([b'{"tensors": [["float32", [1e999]], ["int64", [1]]]}', b"", b""], "not a list of sizes"),
        ([b'{"tensors": [["float32", [-1]], ["int64", [1]]]}', b"", b""], "not a list of sizes"),
        ([b'{"tensors": [["float32", [2]], "x"]}', bytes(8), b""], "[dtype, shape]"),
        ([b'{"tensors": []}'], "1 frame(s), not a header and two tensors"),
    ],
)
def test_every_bad_batch_a_trainer_gets_is_one_line(frames: list[bytes], said: str) -> None:
    with pytest.raises(DataServiceError) as raised:
        tensors_of(frames)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_a_node_without_pyzmq_says_which_package_and_where(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "zmq", None)  # import zmq raises ImportError
    with pytest.raises(
        DataServiceError, match=r"^the data service needs pyzmq on the nodes: add pyzmq to the"
    ):
        RemoteBatches(Layout(("DATA1",), 0, 1.0, "/nonexistent", 1), 0, batch_size=4, seed=7)
