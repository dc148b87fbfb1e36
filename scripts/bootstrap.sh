#!/usr/bin/env bash
# Sets up .venv for hpcjob: the package with its training (torch, torchvision), REST, share and
# development extras. Safe to run again: it does nothing when pyproject.toml has not changed.
#   --test   also install what the multi-host tests need from the system (samba, smbclient), and the
#            local disks' tests (mdadm), with apt-get, when running as root and they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--test" ] && { ! command -v smbd >/dev/null || ! command -v mdadm >/dev/null; }; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "bootstrap: installing samba, smbclient and mdadm for the multi-host and local disks' tests" >&2
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq samba smbclient mdadm >/dev/null
    else
        echo "bootstrap: samba is missing and cannot be installed here: the multi-host tests will be skipped" >&2
    fi
fi

# Azurite, Microsoft's emulator of Blob Storage, pinned, for the tests of Blob datasets (tests/azurite.py).
if [ "${1:-}" = "--test" ] && [ ! -x .tools/azurite/node_modules/.bin/azurite-blob ]; then
    if command -v npm >/dev/null; then
        echo "bootstrap: installing azurite@3.37.0 into .tools/azurite for the Blob tests" >&2
        npm install --silent --no-audit --no-fund --prefix .tools/azurite azurite@3.37.0 >/dev/null 2>&1 \
            || echo "bootstrap: npm could not install azurite: the Blob tests will be skipped" >&2
    else
        echo "bootstrap: npm is missing: the Blob tests will be skipped" >&2
    fi
fi

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "bootstrap: hpcjob needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi
stamp=.venv/.hpcjob-installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
    exit 0
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
echo "bootstrap: installing hpcjob with torch and the test tools into .venv (a few minutes the first time)" >&2
# torch/torchvision are pinned in pyproject.toml: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[train,gpu,rest,share,winrm,emulator,plot,blob,dev]" 2>&1 \
    | grep -v "^WARNING: Location .* is ignored" >&2 || true
.venv/bin/python -c 'import hpcjob, torch, torchvision, smbclient, requests, pytest, matplotlib' \
    || { echo "bootstrap: the install failed, see above" >&2; exit 1; }
echo "$wanted" > "$stamp"
