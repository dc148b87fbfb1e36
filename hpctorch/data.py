"""The data service of CPU data nodes (hpcjob's --data-nodes): the data nodes decode and augment, the GPU
trainers train. hpcjob starts the script on each data node with ``HPCJOB_ROLE=data`` (no torchrun) and
tells every task the data nodes in order (``HPCJOB_DATA_NODES``), their port, the trainers' world size
and a folder private to the job's owner (hpcjob's docs/data-nodes.md).

Why ZeroMQ (pyzmq): a batch goes as frames of raw tensor memory, not copied into a message; ZeroMQ frames
messages itself, and has CURVE: encryption and authentication by key pairs, checked before any message is
delivered. It is one small wheel with no service to run (the nodes need it: `--requirements`).

Who serves whom: trainer rank r reads from data node r mod M, decided in each process from RANK and
WORLD_SIZE. For each epoch a data node builds the very DistributedSampler the trainer would (same length,
world size, rank, seed, epoch, drop_last, padding included), so the trainers together get exactly the
indices they would have read themselves; a resumed run asks for its next epoch. The trainer's seed goes
with each request, and a data node refuses a request whose seed is not its own.

Trust: the data port is reachable by every user of the cluster. Each data node makes its own CURVE key
pairs for the attempt and writes them, with its address, to a file only the job's owner can read
(``HPCJOB_DATA_DIR``); its authenticator admits that one client key and refuses every other connection.
No key is ever on a command line, in the job or in a log. Nothing from the network is unpickled or
evaluated: a request is a small JSON object (ZeroMQ drops a message over REQUEST_LIMIT bytes before it
is read), a batch a small JSON header (shape and dtype, from a fixed list) and raw buffers; a request
that is not what a trainer sends is refused, never a crash of the data node.

Flow: a trainer keeps at most ``prefetch`` requests in flight; a data node's DataLoader workers read at
most ``workers x prefetch`` batches ahead. When every rank it serves has said it is done, a data node
exits 0, and the job ends Finished.

Python 3.6 syntax; torch and pyzmq are imported by the calls that need them.
"""

import json
import os
import socket
import time
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

ROLE_VAR = "HPCJOB_ROLE"
NODES_VAR = "HPCJOB_DATA_NODES"
PORT_VAR = "HPCJOB_DATA_PORT"
WAIT_VAR = "HPCJOB_DATA_WAIT_S"
DIR_VAR = "HPCJOB_DATA_DIR"
CLIENTS_VAR = "HPCJOB_DATA_CLIENTS"
DATA_ROLE, TRAINER_ROLE = "data", "trainer"
# The dtypes a batch may carry: a name from the network is looked up here, never evaluated.
DTYPE_NAMES = ("float32", "float16", "bfloat16", "uint8", "int64", "int32")
MAX_DIMS = 8
REQUEST_LIMIT = 64 << 10  # bytes: a trainer's request is a few dozen
_BIGGEST = 2**62  # a number a request may hold (an epoch, a rank, a seed)


class DataServiceError(RuntimeError):
    """The data service failed: one line that says why (which data node, what it waited for)."""


def _zmq() -> Any:
    try:
        import zmq
    except ImportError:
        raise DataServiceError(
            "the data service needs pyzmq on the nodes: add pyzmq to the job's --requirements (or its image)"
        ) from None
    return zmq


def _dtype(name: object) -> Any:
    import torch

    return getattr(torch, name) if isinstance(name, str) and name in DTYPE_NAMES else None


class Layout:
    """The data service of a job, as the task's environment tells it."""

    def __init__(self, nodes: Tuple[str, ...], port: int, wait_s: float, folder: str, clients: int) -> None:
        self.nodes, self.port, self.wait_s, self.folder, self.clients = nodes, port, wait_s, folder, clients

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Optional["Layout"]:
        """None where the job has no data nodes."""
        names = tuple(n for n in environ.get(NODES_VAR, "").split(",") if n)
        if not names:
            return None
        try:
            return cls(
                names,
                int(environ[PORT_VAR]),
                float(environ.get(WAIT_VAR, "300")),
                environ[DIR_VAR],
                int(environ[CLIENTS_VAR]),
            )
        except (KeyError, ValueError) as exc:
            raise DataServiceError(
                "the job names data nodes but not its data service's {}".format(exc)
            ) from None

    def node_of(self, rank: int) -> str:
        """The data node that serves trainer `rank`."""
        return self.nodes[rank % len(self.nodes)]

    def ranks_of(self, node: str) -> List[int]:
        """The trainer ranks `node` serves."""
        index = [n.upper() for n in self.nodes].index(node.upper())
        return [rank for rank in range(self.clients) if rank % len(self.nodes) == index]


def role(environ: Mapping[str, str]) -> str:
    """The task's role: "data" on a data node (HPCJOB_ROLE=data, on its command line), "trainer" on any
    other task of a job with data nodes, "" in a job without them."""
    return environ.get(ROLE_VAR) or (TRAINER_ROLE if environ.get(NODES_VAR) else "")


def epoch_indices(
    length: int, world_size: int, rank: int, seed: int, epoch: int, drop_last: bool
) -> List[int]:
    """The indices DistributedSampler gives `rank` in `epoch` (shuffled): built by it, not copied."""
    from torch.utils.data import DistributedSampler

    sampler: Any = DistributedSampler(
        range(length),  # type: ignore[arg-type]  # only its length is read
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        drop_last=drop_last,
    )
    sampler.set_epoch(epoch)
    return list(sampler)


# The wire: one JSON frame, or a batch as a header frame and one raw frame per tensor.


def batch_frames(images: Any, labels: Any) -> List[Any]:
    """A batch as frames: its header (each tensor's dtype and shape), then each tensor's raw bytes."""
    import torch

    tensors = [images.contiguous(), labels.contiguous()]
    names = {getattr(torch, name): name for name in DTYPE_NAMES}
    header = {"op": "batch", "tensors": [[names[t.dtype], list(t.shape)] for t in tensors]}
    # Their bytes, whatever the dtype (bfloat16 has no NumPy twin): views, not copies.
    return [json.dumps(header).encode(), *(t.reshape(-1).view(torch.uint8).numpy() for t in tensors)]


def tensors_of(frames: Sequence[Any]) -> Tuple[Any, Any]:
    """The batch back from its frames, each checked against its header: nothing is evaluated or
    unpickled, and a frame of the wrong size is refused (a DataServiceError, one line)."""
    import torch

    if len(frames) != 3:
        raise DataServiceError("a batch of {} frame(s), not a header and two tensors".format(len(frames)))
    header = _read(frames[0])
    described = header.get("tensors")
    if not isinstance(described, list) or len(described) != 2:
        raise DataServiceError("a batch with other than two tensors")
    tensors = []
    for kind, raw in zip(described, frames[1:]):  # noqa: B905 - both two, checked; 3.6 has no strict=
        if not isinstance(kind, list) or len(kind) != 2:
            raise DataServiceError("a batch tensor described by something other than [dtype, shape]")
        name, shape = kind
        dtype = _dtype(name)
        if dtype is None or not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise DataServiceError("a batch tensor of an unknown kind: {}".format(str(name)[:40]))
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _BIGGEST for d in shape):
            raise DataServiceError("a batch tensor's shape is not a list of sizes")
        size = torch.empty((), dtype=dtype).element_size()
        for dimension in shape:
            size *= dimension
        if len(raw) != size:
            raise DataServiceError(
                "a batch tensor of {} bytes, not the {} its header says".format(len(raw), size)
            )
        if not size:
            tensors.append(torch.empty(shape, dtype=dtype))
            continue
        data = bytearray(raw)  # the frame's memory is the socket's: the tensor gets its own
        tensors.append(torch.frombuffer(data, dtype=dtype).reshape(shape))
    return tensors[0], tensors[1]


def _message(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def _read(frame: Any) -> Dict[str, Any]:
    """A JSON object from a frame: anything else (not JSON, nested past Python's depth, numbers past
    what a float holds) is a DataServiceError."""
    try:
        value = json.loads(bytes(frame), parse_constant=_no_constant)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise DataServiceError("a message that is not JSON") from None
    if not isinstance(value, dict):
        raise DataServiceError("a message that is not a JSON object")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError("{} is not a number a request holds".format(name))  # NaN, Infinity


def _number(request: Mapping[str, Any], key: str) -> int:
    """A whole number of a request, within bounds; ValueError otherwise."""
    value = request.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not -_BIGGEST < value < _BIGGEST:
        raise ValueError(key)
    return value


# Where a data node is: published to the owner's folder, with the attempt's keys.


class Endpoint:
    def __init__(
        self,
        node: str,
        address: str,
        port: int,
        server_public: bytes,
        client_public: bytes,
        client_secret: bytes,
    ) -> None:
        self.node, self.address, self.port = node, address, port
        self.server_public, self.client_public, self.client_secret = (
            server_public,
            client_public,
            client_secret,
        )

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
    def from_json(cls, text: str) -> "Endpoint":
        data = json.loads(text)
        return cls(
            str(data["node"]),
            str(data["address"]),
            int(data["port"]),
            str(data["server_public"]).encode(),
            str(data["client_public"]).encode(),
            str(data["client_secret"]).encode(),
        )


def endpoint_file(folder: str, node: str) -> str:
    return os.path.join(folder, "{}.json".format(node.upper()))


def publish(folder: str, endpoint: Endpoint) -> str:
    """Write the endpoint where the job's trainers find it: readable by the owner alone, whole or not at
    all (a trainer polling the folder never reads half a file)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = endpoint_file(folder, endpoint.node)
    partial = os.path.join(folder, ".{}.{}".format(os.path.basename(path), os.getpid()))
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(endpoint.to_json())
    os.replace(partial, path)
    return path


def wait_for_endpoint(folder: str, node: str, wait_s: float, poll_s: float = 0.2) -> Endpoint:
    """The data node's endpoint once it is published, `wait_s` at most; then one line of why not."""
    path = endpoint_file(folder, node)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path, encoding="utf-8") as published:
                return Endpoint.from_json(published.read())
        except FileNotFoundError:
            pass
        except (ValueError, KeyError) as exc:
            raise DataServiceError(
                "data node {}'s endpoint file {} cannot be read: {}".format(node, path, exc)
            ) from None
        if time.monotonic() >= deadline:
            raise DataServiceError(
                "data node {} did not come up within {:g} s (--data-wait): nothing published at {}".format(
                    node, wait_s, path
                )
            )
        time.sleep(poll_s)


# The data node.


class _Indices:
    """A sampler whose indices change each epoch: one DataLoader, its workers kept, serves a trainer's
    every epoch (the indices are read in this process, the samples made in the workers)."""

    def __init__(self) -> None:
        self.indices: List[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class _Stream:
    """One trainer's batches: its loader, and the epoch's batches as the loader makes them."""

    def __init__(self, rank: int, indices: _Indices, loader: Any) -> None:
        self.rank, self.indices, self.loader = rank, indices, loader
        self.batches: Optional[Iterator[Tuple[Any, Any]]] = None


class ServeStats:
    """What a data node served: its samples a second over the time the trainers drew from it (from the
    first epoch asked for to the latest batch sent), not over its start-up."""

    def __init__(self) -> None:
        self.samples = 0
        self.batches = 0
        self.busy_s = 0.0  # in the DataLoader: decoding, augmenting, waiting for its workers
        self.first: Optional[float] = None
        self.last: Optional[float] = None
        self.refused = 0  # requests refused: malformed, another seed, a rank not served here

    def as_dict(self, node: str) -> Dict[str, Any]:
        serving = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        return {
            "node": node,
            "samples": self.samples,
            "batches": self.batches,
            "serving_s": round(serving, 3),
            "busy_s": round(self.busy_s, 3),  # of it, waiting for its loader workers' batches
            "samples_per_sec": round(self.samples / serving, 1) if serving > 0 else None,
            "refused": self.refused,
        }


def serve(
    dataset: Any,
    layout: Layout,
    node: str,
    address: str,
    batch_size: int,
    seed: int,
    workers: int,
    prefetch: int,
    drop_last: bool = False,
    port: Optional[int] = None,
    log: Callable[[str], object] = print,
) -> ServeStats:
    """Serve `dataset`'s training batches to the trainer ranks this data node serves until each has
    said it is done: bind `address`:`port` (the layout's), publish the endpoint with fresh keys, admit
    only the holder of the client key. Its figures, once every rank is done."""
    zmq = _zmq()
    from torch.utils.data import DataLoader
    from zmq.auth.thread import ThreadAuthenticator

    ranks = layout.ranks_of(node)
    stats = ServeStats()
    if not ranks:
        log(
            "data node {}: no trainer rank to serve ({} ranks, {} nodes)".format(
                node, layout.clients, len(layout.nodes)
            )
        )
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
    router.setsockopt(zmq.MAXMSGSIZE, REQUEST_LIMIT)  # a bigger message drops its connection, unread
    router.linger = 1000
    try:
        bound = _bind(router, address, port or layout.port, log)
        publish(layout.folder, Endpoint(node, address, bound, server_public, client_public, client_secret))
        log(
            "data node {}: serving ranks {} at {}:{}".format(node, ", ".join(map(str, ranks)), address, bound)
        )
        streams: Dict[bytes, _Stream] = {}
        done: Set[int] = set()
        while len(done) < len(ranks):
            frames = router.recv_multipart()
            identity = frames[0]
            refuse = partial(_refuse, router, identity, stats)
            if len(frames) != 2:
                refuse("a request of {} frame(s), not one".format(len(frames) - 1))
                continue
            try:
                request = _read(frames[1])
                op = request.get("op")
                rank = _number(request, "rank")
            except (DataServiceError, ValueError):  # never the job's own trainer: refused, and served on
                refuse("a malformed request")
                continue
            if op == "epoch":
                try:
                    epoch, world, asked_seed = (_number(request, k) for k in ("epoch", "world_size", "seed"))
                except ValueError:
                    refuse("a malformed request")
                    continue
                stats.first = stats.first or time.perf_counter()
                if rank not in ranks or world != layout.clients:
                    refuse("rank {} of {} is not served here".format(rank, world))
                    continue
                if asked_seed != seed:
                    refuse(
                        "seed {} is not this data node's, {}: run the same script on both".format(
                            asked_seed, seed
                        )
                    )
                    continue
                stream = streams.get(identity)
                if stream is None:
                    indices = _Indices()
                    loader = DataLoader(
                        dataset,
                        batch_size=batch_size,
                        sampler=indices,  # any sized iterable of indices
                        num_workers=workers,
                        prefetch_factor=prefetch if workers else None,
                        persistent_workers=workers > 0,
                    )
                    stream = streams[identity] = _Stream(rank, indices, loader)
                length = len(dataset)
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
                reply = {"op": "stats"}
                reply.update(stats.as_dict(node))
                router.send_multipart([identity, _message(reply)])
            else:
                refuse("unknown request")
        log("data node {}: every rank it serves is done: {}".format(node, json.dumps(stats.as_dict(node))))
        return stats
    finally:
        router.close(linger=1000)
        authenticator.stop()
        context.term()


def _refuse(router: Any, identity: bytes, stats: ServeStats, why: str) -> None:
    """A request that is not what the job's trainers send, answered so, and counted."""
    stats.refused += 1
    router.send_multipart([identity, _message({"op": "refused", "why": why})])


def _bind(router: Any, address: str, port: int, log: Callable[[str], object]) -> int:
    """Listen on `port`, or where it is taken (several data nodes on one host: a local run, the
    emulator), on a free port, said: the trainers read the port from the endpoint file either way."""
    zmq = _zmq()
    try:
        router.bind("tcp://{}:{}".format(address, port))
        return port
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRINUSE:
            raise DataServiceError("cannot listen on {}:{}: {}".format(address, port, exc)) from None
    taken = int(router.bind_to_random_port("tcp://{}".format(address)))
    log("data node: port {} is taken on {}: serving on {} instead".format(port, address, taken))
    return taken


class _OneKey:
    """The authenticator's callback: the attempt's client key, and no other."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.key  # pyzmq hands it Z85-encoded, as curve_keypair made it


# The trainer.


class RemoteBatches:
    """A trainer's training batches from its data node, in the DataLoader's place: `set_epoch(e)`, then
    iterate. At most `prefetch` batches are asked for ahead. A data node that sends nothing for the
    layout's wait is an error that names it; so is every answer that is not what a data node sends."""

    def __init__(self, layout: Layout, rank: int, batch_size: int, seed: int, prefetch: int = 4) -> None:
        zmq = _zmq()
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
        self.socket.connect("tcp://{}:{}".format(endpoint.address, endpoint.port))
        self.epoch = 0
        self.data_wait_s = 0.0  # blocked on the data node, over all epochs
        self.served: Optional[Dict[str, Any]] = None
        # Requests whose answers have not been read: an epoch left early leaves some, read off before the
        # next question, so that no answer is taken for another's.
        self.in_flight = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _receive(self) -> List[Any]:
        if not self.socket.poll(int(self.layout.wait_s * 1000)):
            raise DataServiceError(
                "data node {} sent nothing for {:g} s (--data-wait)".format(self.node, self.layout.wait_s)
            )
        frames: List[Any] = self.socket.recv_multipart(copy=False)
        return frames

    def _answer(self) -> Dict[str, Any]:
        """A one-frame answer of the data node, read as a JSON object."""
        frames = self._receive()
        if len(frames) != 1:
            raise DataServiceError(
                "data node {} answered in {} frames, not one".format(self.node, len(frames))
            )
        return _read(frames[0].buffer)

    def _ask(self, payload: Mapping[str, Any]) -> None:
        self.socket.send(_message(payload))

    def _drain(self) -> None:
        while self.in_flight:
            self._receive()
            self.in_flight -= 1

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        self._drain()
        self._ask(
            {
                "op": "epoch",
                "epoch": self.epoch,
                "rank": self.rank,
                "world_size": self.layout.clients,
                "batch_size": self.batch_size,
                "seed": self.seed,
            }
        )
        reply = self._answer()
        if reply.get("op") != "ready":
            raise DataServiceError(
                "data node {} refused rank {}: {}".format(self.node, self.rank, str(reply.get("why"))[:200])
            )
        for _ in range(self.prefetch):
            self._ask({"op": "next", "rank": self.rank})
            self.in_flight += 1
        while True:
            began = time.perf_counter()
            frames = self._receive()
            self.data_wait_s += time.perf_counter() - began
            self.in_flight -= 1
            if len(frames) == 1:
                answer = _read(frames[0].buffer)
                if answer.get("op") != "end":
                    raise DataServiceError(
                        "data node {}: {}".format(self.node, str(answer.get("why") or answer.get("op"))[:200])
                    )
                self._drain()  # the requests still out are answered "end" too
                return
            batch = tensors_of([f.buffer for f in frames])
            self._ask({"op": "next", "rank": self.rank})
            self.in_flight += 1
            yield batch

    def close(self) -> Optional[Dict[str, Any]]:
        """Tell the data node this rank is done; its figures (None if it did not answer in time)."""
        try:
            self._drain()
            self._ask({"op": "done", "rank": self.rank})
            reply = self._answer()
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
