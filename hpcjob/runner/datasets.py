"""A job's `--dataset` sources checked before anything is submitted, where this machine can tell: a share
folder that is not there or holds nothing, a Blob container or prefix that does not exist or holds nothing,
or a credential the account refuses (with the job's own credential, from its --secret values); for a local
run, a source larger than the local node's free space. What only the nodes can tell (a managed identity's
rights, a node's own disk) their tasks say, in one line naming the node."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hpcjob.job.datasets import BLOB, CONNECTION_STRING, SAS_TOKEN, Dataset, parse_datasets, size_text
from hpcjob.job.spec import SpecError

if TYPE_CHECKING:
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.share import ShareFolder


def check_datasets(
    spec: JobSpec,
    plan: JobPlan,
    folder: ShareFolder | None,
    secrets: Mapping[str, str],
    *,
    local: bool,
) -> None:
    """Refuse, in one line, a source this machine can see is missing or empty (SpecError)."""
    for dataset in parse_datasets(spec.datasets):
        if dataset.kind == BLOB:
            _check_blob(dataset, secrets)
        elif folder is not None:
            size = _check_share_folder(dataset, folder, walk=local)
            if local:
                _check_free_space(dataset, size, plan)


def _check_share_folder(dataset: Dataset, folder: ShareFolder, *, walk: bool) -> int:
    """The folder is there and holds something; with `walk` (a local run's: this machine's files), its
    size, else 0 (a share's whole tree is the nodes' to read, not the client's over SMB)."""
    try:
        names = folder.listdir(dataset.prefix)
    except FileNotFoundError:
        raise SpecError(f"--dataset {dataset.text}: no such folder on the share") from None
    except OSError as exc:
        raise SpecError(f"--dataset {dataset.text}: cannot read it on the share: {exc}") from None
    if not names:
        raise SpecError(f"--dataset {dataset.text}: the folder on the share holds no files")
    from hpcjob.store.share import LocalFolder

    if not walk or not isinstance(folder, LocalFolder):
        return 0
    total = 0
    for path in (folder.root / dataset.prefix).rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def _check_free_space(dataset: Dataset, size: int, plan: JobPlan) -> None:
    """A local run: each local node's folder (on this machine's disk) has room for the source."""
    from hpcjob.backends.local import local_node_folder

    for node in (*plan.nodes, *plan.data_node_names):
        place = local_node_folder(node)
        while not place.exists():
            place = place.parent
        free = shutil.disk_usage(place).free
        if size > free:
            raise SpecError(
                f"--dataset {dataset.text}: {node} has {size_text(free)} free at {place}, the dataset is "
                f"{size_text(size)}"
            )


def _check_blob(dataset: Dataset, secrets: Mapping[str, str]) -> None:
    """With the job's own credential (a connection string or a SAS among its --secret values) and the SDK
    here: the container is there, the prefix holds a blob, and the account takes the credential."""
    if not secrets.get(CONNECTION_STRING) and not secrets.get(SAS_TOKEN):
        import warnings

        from hpcjob.runner.access import HpcjobWarning

        warnings.warn(
            f"--dataset {dataset.text}: read with the nodes' managed identity, which only they hold: not "
            "checked from here (a node that cannot read it says so)",
            HpcjobWarning,
            stacklevel=2,
        )
        return
    try:
        from azure.core.exceptions import (
            AzureError,
            ClientAuthenticationError,
            HttpResponseError,
            ResourceNotFoundError,
        )
        from azure.storage.blob import BlobServiceClient, ContainerClient
    except ImportError:
        return  # the SDK is the nodes' (the job's environment), not necessarily this machine's
    try:
        if secrets.get(CONNECTION_STRING):
            service = BlobServiceClient.from_connection_string(secrets[CONNECTION_STRING])
            if service.url.rstrip("/") != dataset.endpoint:
                service = BlobServiceClient(dataset.endpoint, credential=service.credential)
            container = service.get_container_client(dataset.container)
        else:
            container = ContainerClient(dataset.endpoint, dataset.container, credential=secrets[SAS_TOKEN])
        first = next(iter(container.list_blobs(name_starts_with=dataset.prefix, results_per_page=1)), None)
    except ResourceNotFoundError:
        raise SpecError(f"--dataset {dataset.text}: no such container (or account)") from None
    except (ClientAuthenticationError, HttpResponseError) as exc:
        if isinstance(exc, ClientAuthenticationError) or exc.status_code in (401, 403):
            raise SpecError(f"--dataset {dataset.text}: the account refused the job's credential") from None
        said = " ".join(str(exc).split())[:200]
        raise SpecError(f"--dataset {dataset.text}: cannot list it: {said}") from None
    except (AzureError, ValueError) as exc:
        said = " ".join(str(exc).split())[:200]
        raise SpecError(f"--dataset {dataset.text}: cannot list it: {type(exc).__name__}: {said}") from None
    if first is None:
        raise SpecError(f"--dataset {dataset.text}: no blobs below {dataset.container}/{dataset.prefix}")
