"""Check an HTTP answer against the HPC Pack REST spec (Swagger 2.0) for its path, method and status.

The 2019 spec (reference/hpcpack-rest-api/hpcpack.yaml) covers everything but ``/nodes*``, which only
the 2016 spec has. Success statuses must be declared for the operation and the body must match the
declared schema (types, enums, array items, object properties; a null property counts as absent). The
spec declares no error responses: an error must carry a non-empty message.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "hpcpack-rest-api"
BASE = "/hpc"


class SpecMismatch(AssertionError):
    pass


@cache
def _spec(name: str) -> dict[str, Any]:
    path = REFERENCE / name
    return yaml.safe_load(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _templates(spec: dict[str, Any]) -> list[tuple[re.Pattern[str], str]]:
    found = []
    for template in spec["paths"]:
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
        found.append((re.compile(pattern + "/?", re.IGNORECASE), template))
    # A literal segment wins over a parameter: /jobs/jobFile before /jobs/{jobId}.
    found.sort(key=lambda item: item[1].count("{"))
    return found


def operation(method: str, path: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(spec, path template, operation) for a request path such as /hpc/jobs/3/tasks."""
    if not path.startswith(BASE):
        raise SpecMismatch(f"{path} is not under the base path {BASE}")
    rest = path[len(BASE) :]
    name = "2016/hpcpack.yaml" if rest.lower().startswith("/nodes") else "hpcpack.yaml"
    spec = _spec(name)
    for pattern, template in _templates(spec):
        if pattern.fullmatch(rest):
            op = spec["paths"][template].get(method.lower())
            if op is None:
                raise SpecMismatch(f"{method} {template} is not in {name}")
            return spec, template, op
    raise SpecMismatch(f"{path} matches no path of {name}")


def check(method: str, path: str, status: int, body: bytes, content_type: str = "") -> None:
    """Raise SpecMismatch when the answer does not fit the spec."""
    spec, template, op = operation(method, path)
    where = f"{method} {template} -> {status}"
    if status >= 400:
        if not body.strip():
            raise SpecMismatch(f"{where}: an error answer without a message")
        return
    responses = {int(code): value for code, value in op["responses"].items()}
    if status not in responses:
        raise SpecMismatch(f"{where}: the spec declares only {sorted(responses)}")
    schema = responses[status].get("schema")
    if schema is None:
        if body.strip():
            raise SpecMismatch(f"{where}: the spec declares no body, got {body[:100]!r}")
        return
    if "json" not in content_type.lower():
        raise SpecMismatch(f"{where}: Content-Type {content_type!r} is not JSON")
    validate(json.loads(body), schema, spec, where)


def validate(value: Any, schema: dict[str, Any], spec: dict[str, Any], where: str = "$") -> None:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = spec["definitions"][name]
    kind = schema.get("type")
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    if kind is not None and not checks[kind](value):
        raise SpecMismatch(f"{where}: expected {kind}, got {type(value).__name__} {value!r:.80}")
    if "enum" in schema and value not in schema["enum"]:
        raise SpecMismatch(f"{where}: {value!r} is not one of {schema['enum']}")
    if kind == "array":
        for index, item in enumerate(value):
            validate(item, schema.get("items", {}), spec, f"{where}[{index}]")
    if kind == "object":
        for name, sub in schema.get("properties", {}).items():
            if value.get(name) is not None:
                validate(value[name], sub, spec, f"{where}.{name}")
        for name in schema.get("required", []):
            if name not in value:
                raise SpecMismatch(f"{where}: required property {name} is missing")
