"""The package's Azure data (hpcjob/azure/arm/): the template's parameters file and the pinned template
itself, read from the installed package. The size table is the ground floor's (hpcjob.job.sizes)."""

from __future__ import annotations

from hpcjob.azure.template import TEMPLATE_PATH

# Onboarding's parameters template: package data (hpcjob/azure/arm/), so an installed hpcjob has it.
ARM_PACKAGE, ARM_DIR = "hpcjob.azure", "arm"
# The pinned template, byte for byte (Azure/hpcpack-template at TEMPLATE_COMMIT, MIT: its licence is
# hpcpack-template-LICENSE beside it): onboarding checks a request against it with no network.
TEMPLATE_FILE = TEMPLATE_PATH.rsplit("/", 1)[-1]


def packaged_template(name: str = TEMPLATE_FILE) -> tuple[str, bytes]:
    """A pinned template as the package holds it (the cluster's, else `name`, such as the add-nodes
    template's file name): where it is (for messages) and its bytes, unchecked
    (hpcjob.azure.az.load_template checks its SHA-256)."""
    from importlib import resources

    copy = resources.files(ARM_PACKAGE) / ARM_DIR / name
    return str(copy), copy.read_bytes()
