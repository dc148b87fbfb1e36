"""The NCCL settings Azure's HPC images give each GPU VM size, for jobs that do not run on the image's
own /etc/nccl.conf (a container sees none of it) and for `render` to show.

Azure/azhpc-images @8e9d055fb9e1f7385da734969793861c447958a1: at boot, the image's
`setup_sku_customizations.sh` (components/setup_sku_customizations.sh L27-38) maps the VM size to a
topology family, and the family's script (components/customizations/<family>.sh L11-16) writes
/etc/nccl.conf and links the family's topology (and graph) files into /opt/microsoft/<family>/. The
sizes with no family get nothing. The Ubuntu_22.04_HPC_Gen2 image that onboarding deploys is that
image (docs/facts/azure-gpu-fabric-and-nccl.md §3 and §6). A size of hpcjob's table has its family there
(hpcjob.job.sizes: nccl_family); the image's own patterns answer for a size the table does not hold.
Pure: no I/O.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from hpcjob.job.sizes import size_table

# Where the images keep the topology files: containers get it read-only (plan.docker_env).
TOPOLOGY_FOLDER = "/opt/microsoft"

# The image's `case $vmSize in` patterns, on the lower-cased size, in its order (the first match wins):
# for sizes the table does not hold (a test holds the table's families to them).
IMAGE_FAMILIES = (
    ("standard_nc96ads_a100_v4", "ncv4"),
    ("standard_nd*v4", "ndv4"),
    ("standard_nd40rs_v2", "ndv2"),
    ("standard_nc80adis_h100_v5", "ncv5"),
    ("standard_nd96is*_h[1-2]00_v5", "ndv5"),
)

# What each family's script writes to /etc/nccl.conf (ncv5's writes none).
_NCCL = {
    "ndv5": (
        ("NCCL_IB_PCI_RELAXED_ORDERING", "1"),
        ("NCCL_TOPO_FILE", f"{TOPOLOGY_FOLDER}/ndv5/topo.xml"),
        ("NCCL_IGNORE_CPU_AFFINITY", "1"),
    ),
    "ndv4": (
        ("NCCL_IB_PCI_RELAXED_ORDERING", "1"),
        ("NCCL_TOPO_FILE", f"{TOPOLOGY_FOLDER}/ndv4/topo.xml"),
        ("NCCL_IGNORE_CPU_AFFINITY", "1"),
    ),
    "ndv2": (
        ("NCCL_TOPO_FILE", f"{TOPOLOGY_FOLDER}/ndv2/topo.xml"),
        ("NCCL_IGNORE_CPU_AFFINITY", "1"),
    ),
    "ncv4": (
        ("NCCL_TOPO_FILE", f"{TOPOLOGY_FOLDER}/ncv4/topo.xml"),
        ("NCCL_GRAPH_FILE", f"{TOPOLOGY_FOLDER}/ncv4/graph.xml"),
        ("NCCL_IGNORE_CPU_AFFINITY", "1"),
    ),
}


def topology_family(vm_size: str) -> str | None:
    """The size's family as the image names it (ndv5, ndv4, ...), or None: no customisation. The size
    table's for its sizes, else the image's patterns."""
    known = size_table().find(vm_size)
    if known is not None:
        return known.nccl_family
    return image_family(vm_size)


def image_family(vm_size: str) -> str | None:
    """The family the image's own patterns give the size."""
    size = vm_size.lower()
    return next((family for pattern, family in IMAGE_FAMILIES if fnmatchcase(size, pattern)), None)


def nccl_env(vm_size: str | None) -> tuple[tuple[str, str], ...]:
    """The NCCL variables the image sets for nodes of `vm_size` (none for a size it does not customise,
    or no size)."""
    family = topology_family(vm_size) if vm_size else None
    return _NCCL.get(family or "", ())
