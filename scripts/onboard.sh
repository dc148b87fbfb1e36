#!/usr/bin/env bash
# Deploy a GPU cluster from HPC Pack's ARM template: a thin entry over `hpcjob cluster onboard`.
#   scripts/onboard.sh gpu1 --resource-group rg-gpu1 --location eastus \
#       --vm-size Standard_NC24ads_A100_v4 --nodes 2
# The secrets are never arguments: HPCJOB_ADMIN_PASSWORD (else a prompt) and HPCJOB_AUTH_KEY (else a
# new one). Needs the Azure CLI, logged in. See hpcjob/azure/arm/README.md.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -x "$repo/.venv/bin/hpcjob" ]; then
    "$repo/scripts/bootstrap.sh"
fi
exec "$repo/.venv/bin/hpcjob" cluster onboard "$@"
