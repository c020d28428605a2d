"""Format headers, schema versions and JSON Schema checking shared by every mlopt file type.

Every file mlopt writes starts with `format` (what it is) and `schema_version` ("MAJOR.MINOR"). Readers
accept any minor version of a major they know, so older mlopt releases read files that only gained
optional fields, and refuse a newer major with a message that says to upgrade.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jsonschema

from mlopt.errors import InputError
from mlopt.formats.io import check_finite


@dataclass(frozen=True)
class FormatSpec:
    name: str  # value of the `format` field
    version: str  # "MAJOR.MINOR" written by this release
    schema: str  # file name under mlopt/formats/schemas/

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])


TOPOLOGY = FormatSpec("mlopt.topology", "1.1", "topology.schema.json")  # 1.1: call_overhead_us, reduce_GBps
TRACE = FormatSpec("mlopt.trace", "1.1", "trace.schema.json")  # 1.1: a permute's comm.pairs
PLAN = FormatSpec("mlopt.plan", "1.0", "plan.schema.json")
PLAN_INDEX = FormatSpec("mlopt.plan-index", "1.0", "plan-index.schema.json")
ALL_FORMATS = (TOPOLOGY, TRACE, PLAN, PLAN_INDEX)


def header(spec: FormatSpec) -> dict[str, str]:
    return {"format": spec.name, "schema_version": spec.version}


def format_of(doc: Any) -> str | None:
    """The `format` field of a document, if it has one."""
    if isinstance(doc, dict) and isinstance(doc.get("format"), str):
        return doc["format"]
    return None


def check_header(doc: Any, spec: FormatSpec, source: str) -> None:
    """Reject documents of another format or of a schema major this release does not know."""
    if not isinstance(doc, dict):
        raise InputError(source, "$", f"expected a JSON object ({spec.name}), found {type(doc).__name__}")
    fmt = doc.get("format")
    if fmt != spec.name:
        found = "no `format` field" if fmt is None else f"format {fmt!r}"
        raise InputError(source, "$.format", f"expected {spec.name!r}, found {found}")
    version = doc.get("schema_version")
    if not isinstance(version, str):
        raise InputError(source, "$.schema_version", "missing or not a string like \"1.0\"")
    parts = version.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise InputError(source, "$.schema_version", f"{version!r} is not of the form MAJOR.MINOR")
    if int(parts[0]) != spec.major:
        newer = int(parts[0]) > spec.major
        hint = "upgrade mlopt to read it" if newer else "regenerate it with this mlopt"
        raise InputError(
            source,
            "$.schema_version",
            f"{spec.name} major version {parts[0]} is not supported (this mlopt reads {spec.major}.x); {hint}",
        )


def load_schema(spec: FormatSpec) -> dict[str, Any]:
    text = resources.files("mlopt.formats").joinpath("schemas", spec.schema).read_text("utf-8")
    return json.loads(text)


def _describe(error: jsonschema.ValidationError) -> tuple[str, str]:
    path = error.json_path
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return f"{path}.{missing}" if path != "$" else f"$.{missing}", "missing required field"
    if error.validator == "additionalProperties":
        return path, error.message.replace("Additional properties are not allowed", "unknown field(s)")
    if error.validator == "type":
        return path, f"expected {error.validator_value}, found {type(error.instance).__name__} {error.instance!r:.60}"
    if error.validator in ("minimum", "exclusiveMinimum"):
        return path, f"must be {'>' if error.validator == 'exclusiveMinimum' else '>='} {error.validator_value}, found {error.instance!r}"
    if error.validator == "enum":
        choices = ", ".join(map(str, error.validator_value))
        return path, f"{error.instance!r} is not one of: {choices}"
    return path, error.message


def validate_schema(doc: Any, spec: FormatSpec, source: str) -> None:
    """Check a document against the committed JSON Schema; report the first (deepest) problem."""
    validate_against(doc, load_schema(spec), source)


@functools.lru_cache(maxsize=None)
def load_schema_file(name: str) -> dict[str, Any]:
    """A committed schema by file name (those of plan payloads have no FormatSpec of their own)."""
    return json.loads(resources.files("mlopt.formats").joinpath("schemas", name).read_text("utf-8"))


def validate_against(doc: Any, schema: dict[str, Any], source: str, prefix: str = "$") -> None:
    """InputError naming the JSON path (under `prefix`, for a part of a document) of the first (deepest)
    place where `doc` breaks `schema`."""
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        path, message = _describe(error)
        raise InputError(source, prefix + path[1:], message)


def check_document(doc: Any, spec: FormatSpec, source: str) -> None:
    """Header first (so version errors are clear), then finite numbers (NaN and Infinity pass a schema's
    `minimum`), then structure."""
    check_header(doc, spec, source)
    check_finite(doc, source)
    validate_schema(doc, spec, source)
