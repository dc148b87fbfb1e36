"""Azure: the HPC Pack ARM template, GPU sizes, and the `az` steps of onboarding."""
