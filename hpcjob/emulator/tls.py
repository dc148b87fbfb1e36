"""A self-signed certificate for the emulated head node, made with the ``openssl`` command line."""

from __future__ import annotations

import os
import shutil
import subprocess


def make_certificate(directory: str, days: int = 7) -> tuple[str, str]:
    """Write ``head.crt`` (PEM, also the CA file clients verify with) and ``head.key``; return both paths.

    The certificate is valid for ``localhost``, 127.0.0.1 and ::1 (subjectAltName), is its own CA
    (``CA:TRUE``, keyCertSign) and is a server certificate (serverAuth), so a client can pass it as
    ``verify=`` without turning verification off.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the HPC Pack emulator needs the openssl command line to make its certificate")
    cert = os.path.join(directory, "head.crt")
    key = os.path.join(directory, "head.key")
    command = [
        openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", cert, "-days", str(days), "-subj", "/CN=hpcjob HPC Pack emulator",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,digitalSignature,keyCertSign",
        "-addext", "extendedKeyUsage=serverAuth",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl could not make the emulator's certificate: {result.stderr.strip()}")
    os.chmod(key, 0o600)
    return cert, key
