"""The training program's data service (hpcjob issue 34): CPU data nodes decode and augment, the GPU
trainers train. hpcjob starts the script on each data node with ``HPCJOB_ROLE=data`` (no torchrun) and
tells every task the data nodes in order (``HPCJOB_DATA_NODES``), their port, the trainers' world size
and a folder private to the job's owner (docs/data-nodes.md).

Why ZeroMQ (pyzmq): the published example used gRPC, whose messages are protobuf copies with a 4 MiB
default limit, for what is a stream of a few large buffers. ZeroMQ sends a batch as frames of raw
tensor memory without copying them into a message, frames messages itself, and has CURVE: encryption
and authentication by key pairs, checked before any message is delivered. It is one small wheel with
no service to run.

Who serves whom: trainer rank r reads from data node r mod M, decided in each process from RANK and
WORLD_SIZE (ranks come from the rendezvous, not the order of the nodes). For each epoch a data node
builds the very DistributedSampler the trainer would (same length, world size, rank, seed, epoch,
drop_last, padding included), so the trainers together get exactly the indices they would have read
themselves; a resumed run simply asks for the checkpoint's next epoch.

Trust: the data port is reachable by every user of the cluster. Each data node makes its own CURVE key
pairs for the attempt and writes them, with its address, to a file only the job's owner can read
(``HPCJOB_DATA_DIR``, in the owner's job folder on the share, outside the logs); its authenticator
admits that one client key and refuses every other connection. No key is ever on a command line, in
the job or in a log. Nothing from the network is unpickled: a batch is a small JSON header (shape and
dtype, from a fixed list) and raw buffers.

Flow: a trainer keeps at most ``prefetch`` requests in flight (its bounded queue); a data node's
DataLoader workers read at most ``workers x prefetch`` batches ahead (its bounded queue). When every
rank it serves has said it is done, a data node exits 0, and the job ends Finished.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler

ROLE_VAR = "HPCJOB_ROLE"
NODES_VAR = "HPCJOB_DATA_NODES"
PORT_VAR = "HPCJOB_DATA_PORT"
WAIT_VAR = "HPCJOB_DATA_WAIT_S"
DIR_VAR = "HPCJOB_DATA_DIR"
CLIENTS_VAR = "HPCJOB_DATA_CLIENTS"
DATA_ROLE, TRAINER_ROLE = "data", "trainer"
# The dtypes a batch may carry: a name from the network is looked up here, never evaluated.
DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "uint8": torch.uint8,
    "int64": torch.int64,
    "int32": torch.int32,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
MAX_DIMS = 8


class DataServiceError(RuntimeError):
    """The data service failed: one line that says why (which data node, what it waited for)."""


@dataclass(frozen=True)
class Layout:
    """The data service of a job, as the task's environment tells it."""

    nodes: tuple[str, ...]
    port: int
    wait_s: float
    folder: Path
    clients: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Layout | None:
        """None where the job has no data nodes."""
        names = tuple(n for n in environ.get(NODES_VAR, "").split(",") if n)
        if not names:
            return None
        try:
            return cls(
                names,
                int(environ[PORT_VAR]),
                float(environ.get(WAIT_VAR, "300")),
                Path(environ[DIR_VAR]),
                int(environ[CLIENTS_VAR]),
            )
        except (KeyError, ValueError) as exc:
            raise DataServiceError(f"the job names data nodes but not its data service's {exc}") from None

    def node_of(self, rank: int) -> str:
        """The data node that serves trainer `rank`."""
        return self.nodes[rank % len(self.nodes)]

    def ranks_of(self, node: str) -> list[int]:
        """The trainer ranks `node` serves."""
        index = [n.upper() for n in self.nodes].index(node.upper())
        return [rank for rank in range(self.clients) if rank % len(self.nodes) == index]


def role(environ: Mapping[str, str]) -> str:
    """The task's role: "data" on a data node (HPCJOB_ROLE=data, on its command line), "trainer" on any
    other task of a job with data nodes, "" in a job without them."""
    return environ.get(ROLE_VAR) or (TRAINER_ROLE if environ.get(NODES_VAR) else "")


def epoch_indices(
    length: int, world_size: int, rank: int, seed: int, epoch: int, drop_last: bool
) -> list[int]:
    """The indices DistributedSampler gives `rank` in `epoch` (shuffled): built by it, not copied."""
    sampler: DistributedSampler[int] = DistributedSampler(
        range(length),  # type: ignore[arg-type]  # only its length is read
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        drop_last=drop_last,
    )
    sampler.set_epoch(epoch)
    return list(sampler)


# --------------------------------------------------------------------------------------------------
# The wire: one JSON frame, or a batch as a header frame and one raw frame per tensor
# --------------------------------------------------------------------------------------------------


def batch_frames(images: Tensor, labels: Tensor) -> list[Any]:
    """A batch as frames: its header (each tensor's dtype and shape), then each tensor's raw bytes."""
    tensors = [images.contiguous(), labels.contiguous()]
    header = {"op": "batch", "tensors": [[_NAMES[t.dtype], list(t.shape)] for t in tensors]}
    # Their bytes, whatever the dtype (bfloat16 has no NumPy twin): views, not copies.
    return [json.dumps(header).encode(), *(t.reshape(-1).view(torch.uint8).numpy() for t in tensors)]


def tensors_of(frames: Sequence[bytes | memoryview]) -> tuple[Tensor, Tensor]:
    """The batch back from its frames, each checked against its header: nothing is evaluated or
    unpickled, and a frame of the wrong size is refused."""
    header = json.loads(bytes(frames[0]))
    described = header.get("tensors")
    if not isinstance(described, list) or len(described) != 2 or len(frames) != 3:
        raise DataServiceError("a batch with other than two tensors")
    tensors = []
    for (name, shape), raw in zip(described, frames[1:], strict=True):
        dtype = DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None or not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise DataServiceError(f"a batch tensor of an unknown kind: {str(name)[:40]}")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise DataServiceError("a batch tensor's shape is not a list of sizes")
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if len(raw) != size:
            raise DataServiceError(f"a batch tensor of {len(raw)} bytes, not the {size} its header says")
        if not size:
            tensors.append(torch.empty(shape, dtype=dtype))
            continue
        data = bytearray(raw)  # the frame's memory is the socket's: the tensor gets its own
        tensors.append(torch.frombuffer(data, dtype=dtype).reshape(shape))
    return tensors[0], tensors[1]


def _message(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def _read(frame: bytes | memoryview) -> dict[str, Any]:
    try:
        value = json.loads(bytes(frame))
    except ValueError:
        raise DataServiceError("a message that is not JSON") from None
    if not isinstance(value, dict):
        raise DataServiceError("a message that is not a JSON object")
    return value


# --------------------------------------------------------------------------------------------------
# Where a data node is: published to the owner's folder, with the attempt's keys
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    node: str
    address: str
    port: int
    server_public: bytes
    client_public: bytes
    client_secret: bytes

    def to_json(self) -> str:
        return json.dumps(
            {
                "node": self.node,
                "address": self.address,
                "port": self.port,
                "server_public": self.server_public.decode(),
                "client_public": self.client_public.decode(),
                "client_secret": self.client_secret.decode(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Endpoint:
        data = json.loads(text)
        return cls(
            str(data["node"]),
            str(data["address"]),
            int(data["port"]),
            str(data["server_public"]).encode(),
            str(data["client_public"]).encode(),
            str(data["client_secret"]).encode(),
        )


def endpoint_file(folder: Path, node: str) -> Path:
    return folder / f"{node.upper()}.json"


def publish(folder: Path, endpoint: Endpoint) -> Path:
    """Write the endpoint where the job's trainers find it: readable by the owner alone, whole or not at
    all (a trainer polling the folder never reads half a file)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = endpoint_file(folder, endpoint.node)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(endpoint.to_json())
    os.replace(partial, path)
    return path


def wait_for_endpoint(folder: Path, node: str, wait_s: float, poll_s: float = 0.2) -> Endpoint:
    """The data node's endpoint once it is published, `wait_s` at most; then one line of why not."""
    path = endpoint_file(folder, node)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return Endpoint.from_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            pass
        except (ValueError, KeyError) as exc:
            raise DataServiceError(f"data node {node}'s endpoint file {path} cannot be read: {exc}") from None
        if time.monotonic() >= deadline:
            raise DataServiceError(
                f"data node {node} did not come up within {wait_s:g} s (--data-wait): nothing published "
                f"at {path}"
            )
        time.sleep(poll_s)


# --------------------------------------------------------------------------------------------------
# The data node
# --------------------------------------------------------------------------------------------------


class _Indices:
    """A sampler whose indices change each epoch: one DataLoader, its workers kept, serves a trainer's
    every epoch (the indices are read in this process, the samples made in the workers)."""

    def __init__(self) -> None:
        self.indices: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


@dataclass
class _Stream:
    """One trainer's batches: its loader, and the epoch's batches as the loader makes them."""

    rank: int
    indices: _Indices
    loader: DataLoader[Any]
    batches: Iterator[tuple[Tensor, Tensor]] | None = None


@dataclass
class ServeStats:
    """What a data node served: its samples a second over the time the trainers drew from it (from the
    first epoch asked for to the latest batch sent), not over its start-up."""

    samples: int = 0
    batches: int = 0
    busy_s: float = 0.0  # in the DataLoader: decoding, augmenting, waiting for its workers
    first: float | None = None
    last: float | None = None

    def as_dict(self, node: str) -> dict[str, Any]:
        serving = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        return {
            "node": node,
            "samples": self.samples,
            "batches": self.batches,
            "serving_s": round(serving, 3),
            "busy_s": round(self.busy_s, 3),  # of it, waiting for its loader workers' batches
            "samples_per_sec": round(self.samples / serving, 1) if serving > 0 else None,
        }


def serve(
    dataset: Dataset[Any],
    layout: Layout,
    node: str,
    address: str,
    *,
    batch_size: int,
    seed: int,
    workers: int,
    prefetch: int,
    drop_last: bool = False,
    port: int | None = None,
    log: Callable[[str], object] = print,
) -> ServeStats:
    """Serve `dataset`'s training batches to the trainer ranks this data node serves until each has
    said it is done: bind `address`:`port` (the layout's), publish the endpoint with fresh keys, admit
    only the holder of the client key. Its figures, once every rank is done."""
    import zmq
    from zmq.auth.thread import ThreadAuthenticator

    ranks = layout.ranks_of(node)
    stats = ServeStats()
    if not ranks:
        log(f"data node {node}: no trainer rank to serve ({layout.clients} ranks, {len(layout.nodes)} nodes)")
        return stats
    context = zmq.Context()
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback("*", credentials_provider=_OneKey(client_public))
    router = context.socket(zmq.ROUTER)
    router.curve_server = True
    router.curve_secretkey = server_secret
    router.curve_publickey = server_public
    router.linger = 1000
    try:
        bound = _bind(router, address, port or layout.port, log)
        publish(layout.folder, Endpoint(node, address, bound, server_public, client_public, client_secret))
        log(f"data node {node}: serving ranks {', '.join(map(str, ranks))} at {address}:{bound}")
        streams: dict[bytes, _Stream] = {}
        done: set[int] = set()
        while len(done) < len(ranks):
            identity, frame = router.recv_multipart()
            try:
                request = _read(frame)
                op = request.get("op")
                rank, epoch, world = (int(request.get(key, -1)) for key in ("rank", "epoch", "world_size"))
            except (DataServiceError, TypeError, ValueError):  # the job's own trainer, gone wrong
                router.send_multipart([identity, _message({"op": "refused", "why": "a malformed request"})])
                continue
            if op == "epoch":
                stats.first = stats.first or time.perf_counter()
                if rank not in ranks or world != layout.clients:
                    why = f"rank {rank} of {world} is not served here"
                    refused = {"op": "refused", "why": why}
                    router.send_multipart([identity, _message(refused)])
                    continue
                stream = streams.get(identity)
                if stream is None:
                    indices = _Indices()
                    loader: DataLoader[Any] = DataLoader(
                        dataset,
                        batch_size=batch_size,
                        sampler=indices,  # type: ignore[arg-type]  # any sized iterable of indices
                        num_workers=workers,
                        prefetch_factor=prefetch if workers else None,
                        persistent_workers=workers > 0,
                    )
                    stream = streams[identity] = _Stream(rank, indices, loader)
                length = len(dataset)  # type: ignore[arg-type]
                stream.indices.indices = epoch_indices(length, layout.clients, rank, seed, epoch, drop_last)
                stream.batches = iter(stream.loader)
                router.send_multipart([identity, _message({"op": "ready", "batches": len(stream.loader)})])
            elif op == "next":
                stream = streams.get(identity)
                if stream is None or stream.batches is None:
                    router.send_multipart([identity, _message({"op": "end"})])
                    continue
                began = time.perf_counter()
                try:
                    images, labels = next(stream.batches)
                except StopIteration:
                    stream.batches = None
                    router.send_multipart([identity, _message({"op": "end"})])
                    continue
                stats.busy_s += time.perf_counter() - began
                stats.samples += int(labels.shape[0])
                stats.batches += 1
                stats.last = time.perf_counter()
                router.send_multipart([identity, *batch_frames(images, labels)], copy=False)
            elif op == "done":
                streams.pop(identity, None)  # its loader's workers end with it
                if rank in ranks:
                    done.add(rank)
                router.send_multipart([identity, _message({"op": "stats", **stats.as_dict(node)})])
            else:
                router.send_multipart([identity, _message({"op": "refused", "why": "unknown request"})])
        log(f"data node {node}: every rank it serves is done: {json.dumps(stats.as_dict(node))}")
        return stats
    finally:
        router.close(linger=1000)
        authenticator.stop()
        context.term()


def _bind(router: Any, address: str, port: int, log: Callable[[str], object]) -> int:
    """Listen on `port`, or where it is taken (several data nodes on one host: a local run, the
    emulator), on a free port, said: the trainers read the port from the endpoint file either way."""
    import zmq

    try:
        router.bind(f"tcp://{address}:{port}")
        return port
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRINUSE:
            raise DataServiceError(f"cannot listen on {address}:{port}: {exc}") from None
    taken = int(router.bind_to_random_port(f"tcp://{address}"))
    log(f"data node: port {port} is taken on {address}: serving on {taken} instead")
    return taken


class _OneKey:
    """The authenticator's callback: the attempt's client key, and no other."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.key  # pyzmq hands it Z85-encoded, as curve_keypair made it


# --------------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------------


class RemoteBatches:
    """A trainer's training batches from its data node, in the DataLoader's place: `set_epoch(e)`, then
    iterate. At most `prefetch` batches are asked for ahead. A data node that sends nothing for the
    layout's wait is an error that names it."""

    def __init__(self, layout: Layout, rank: int, *, batch_size: int, seed: int, prefetch: int = 4) -> None:
        import zmq

        self.layout, self.rank, self.batch_size, self.seed = layout, rank, batch_size, seed
        self.prefetch = max(1, prefetch)
        self.node = layout.node_of(rank)
        endpoint = wait_for_endpoint(layout.folder, self.node, layout.wait_s)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.curve_secretkey = endpoint.client_secret
        self.socket.curve_publickey = endpoint.client_public
        self.socket.curve_serverkey = endpoint.server_public
        self.socket.linger = 0
        self.socket.connect(f"tcp://{endpoint.address}:{endpoint.port}")
        self.epoch = 0
        self.data_wait_s = 0.0  # blocked on the data node, over all epochs
        self.served: dict[str, Any] | None = None
        # Requests whose answers have not been read: an epoch left early (--max-steps-per-epoch) leaves
        # some, read off before the next question, so that no answer is taken for another's.
        self.in_flight = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _receive(self) -> list[Any]:

        if not self.socket.poll(int(self.layout.wait_s * 1000)):
            raise DataServiceError(
                f"data node {self.node} sent nothing for {self.layout.wait_s:g} s (--data-wait)"
            )
        return self.socket.recv_multipart(copy=False)

    def _ask(self, payload: Mapping[str, Any]) -> None:
        self.socket.send(_message(payload))

    def _drain(self) -> None:
        while self.in_flight:
            self._receive()
            self.in_flight -= 1

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        self._drain()
        self._ask(
            {
                "op": "epoch",
                "epoch": self.epoch,
                "rank": self.rank,
                "world_size": self.layout.clients,
                "batch_size": self.batch_size,
            }
        )
        reply = _read(self._receive()[0].buffer)
        if reply.get("op") != "ready":
            raise DataServiceError(f"data node {self.node} refused rank {self.rank}: {reply.get('why')}")
        for _ in range(self.prefetch):
            self._ask({"op": "next"})
            self.in_flight += 1
        while True:
            began = time.perf_counter()
            frames = self._receive()
            self.data_wait_s += time.perf_counter() - began
            self.in_flight -= 1
            if len(frames) == 1 and _read(frames[0].buffer).get("op") == "end":
                self._drain()  # the requests still out are answered "end" too
                return
            batch = tensors_of([f.buffer for f in frames])
            self._ask({"op": "next"})
            self.in_flight += 1
            yield batch

    def close(self) -> dict[str, Any] | None:
        """Tell the data node this rank is done; its figures (None if it did not answer in time)."""
        try:
            self._drain()
            self._ask({"op": "done", "rank": self.rank})
            reply = _read(self._receive()[0].buffer)
            self.served = {k: v for k, v in reply.items() if k != "op"}
        except DataServiceError:
            self.served = None
        finally:
            self.socket.close(linger=0)
            self.context.term()
        return self.served


def node_address(environ: Mapping[str, str]) -> str:
    """This node's address as hpcjob's node helper chose it (HPCJOB_ADDR: the interface of the default
    route, or HPCJOB_IFNAME's), else what the host name resolves to."""
    return environ.get("HPCJOB_ADDR") or socket.gethostbyname(socket.gethostname())
