"""Values on the command line: writing a Python value in Hydra's override grammar
(`hydra_value`, used by the dialects to emit verl overrides), and reading a JSON object or list
written where Hydra expects its own grammar (`json_values`): SkyRL's launch scripts pass
`engine_init_kwargs='{"key": value}'`, which Hydra's parser cannot read (quoted dict keys).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

# Hydra's grammar takes dict keys unquoted (letters, digits, `_ . - /`, inner spaces).
_DICT_KEY = re.compile(r"[A-Za-z_][\w.\-/ ]*\Z")


def hydra_value(value: Any) -> str:
    """`value` in Hydra's override grammar, so that `key=<this>` parses back to `value`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        # Quoted, so numbers, `null`, commas and spaces stay a string; `${` stays literal.
        text = value.replace("${", "\\${")
        text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
        text = re.sub(r"(\\+)\Z", lambda m: m.group(1) * 2, text)
        return f"'{text}'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            if not _DICT_KEY.match(str(k)) or str(k) != str(k).strip():
                raise TypeError(f"cannot write the dict key {k!r} in a Hydra override")
            items.append(f"{k}:{hydra_value(v)}")
        return "{" + ",".join(items) + "}"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as a Hydra override value")


def json_values(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the overrides with each JSON object or list value that Hydra cannot parse rewritten in
    Hydra's grammar, one line per value that is neither), for `key=value` and `+key=value`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    result, problems = [], []
    for raw in overrides:
        key, sep, value = raw.partition("=")
        if not sep or not value.lstrip().startswith(("{", "[")):
            result.append(raw)
            continue
        try:
            parser.parse_override(raw)
            result.append(raw)
            continue
        except HydraException as err:
            hydra_error = str(err).splitlines()[0]
        try:
            parsed = json.loads(value)
            result.append(f"{key}={hydra_value(parsed)}")
        except (ValueError, TypeError) as err:
            problems.append(
                f"{key}: the value {value!r} is neither Hydra's grammar ({hydra_error}) nor JSON ({err}); write it "
                "as JSON with double-quoted keys or as {key: value, ...}"
            )
    return result, problems


__all__ = ["hydra_value", "json_values"]
