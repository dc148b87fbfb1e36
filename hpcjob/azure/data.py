"""The package's Azure data (hpcjob/azure/arm/): the GPU sizes hpcjob knows and the template's
parameters file, read from the installed package."""

from __future__ import annotations

from hpcjob.azure.template import SizeTable

# The size table and onboarding's parameters template: package data (hpcjob/azure/arm/), so an installed
# hpcjob has them.
ARM_PACKAGE, ARM_DIR = "hpcjob.azure", "arm"


def size_table() -> SizeTable:
    """The Azure GPU sizes hpcjob knows (hpcjob/azure/arm/sizes.json): onboarding's, and doctor's marks."""
    import json
    from importlib import resources

    sizes = resources.files(ARM_PACKAGE) / ARM_DIR / "sizes.json"
    return SizeTable.from_data(json.loads(sizes.read_text(encoding="utf-8")))
