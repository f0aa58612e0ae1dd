"""JSON Schema to a regex (a documented subset), so a schema constrains generation like any regex.

The approach of outlines (Willard & Louf 2023): a schema whose documents are a regular
language is written as one regex, which `labkit.sampling.regex_dfa` compiles. Whitespace is
bounded: none inside arrays and objects except one optional space after `:` and `,`, so the
model cannot spend its tokens on blank lines.

| keyword | supported as |
|---|---|
| `type` | "object", "array", "string", "integer", "number", "boolean", "null", or a list of them |
| `properties`, `required` | the properties in the order given; optional ones may be left out; no others |
| `additionalProperties` | only `false` (or absent, which generates declared properties only) |
| `items`, `minItems`, `maxItems` | arrays of one item schema |
| `minLength`, `maxLength` | string length in characters |
| `enum`, `const` | the JSON texts of the values |
| `anyOf` | alternation |
| `title`, `description`, `$schema` | ignored (they do not constrain) |

Numbers are bounded too: at most 16 digits before and after the point and 3 in the exponent
(a sampled model that likes the token "1" would otherwise write digits until `max_tokens`).

Anything else (`pattern`, `format`, `minimum`, `$ref`, `oneOf`, ...) raises ValueError naming
it: a keyword ignored would give documents that do not validate.

`JSON_OBJECT` is "any JSON object" (the API's `json_object` mode) as a regex of bounded depth
(`ANY_DEPTH` levels of objects and arrays, the outer object included): a DFA cannot count
brackets, and a pushdown automaton would need a stack in its state, which the mask index
(one row per state) cannot precompute. Three levels cover what a model is asked for in
practice and keep the automaton at about 2,000 states (four would be 8,000).

    >>> schema_to_regex({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    '\\\\{"ok":[ ]?(true|false)\\\\}'
"""
from __future__ import annotations

import json

__all__ = ["schema_to_regex", "json_object_regex", "JSON_OBJECT", "ANY_DEPTH", "escape"]

SEP, COLON = ",[ ]?", ":[ ]?"
STRING_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt])'
STRING = f'"{STRING_CHAR}*"'
INTEGER = r"-?(0|[1-9][0-9]{0,15})"   # at most 16 digits: a model at temperature 1 would otherwise never stop
NUMBER = INTEGER + r"(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?"
ANY_DEPTH = 3
_SCALARS = {"string": STRING, "integer": INTEGER, "number": NUMBER, "boolean": "(true|false)", "null": "null"}
_KNOWN = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
          "maxLength", "enum", "const", "anyOf", "title", "description", "$schema"}


def escape(text: str) -> str:
    """`text` as a regex that matches it literally."""
    return "".join("\\" + c if c in ".[]{}()*+?|^$\\" else c for c in text)


def _value(depth: int) -> str:
    if depth == 0:
        return "(" + "|".join([STRING, NUMBER, "true", "false", "null"]) + ")"
    inner = _value(depth - 1)
    obj = rf"\{{({STRING}{COLON}{inner}({SEP}{STRING}{COLON}{inner})*)?\}}"
    arr = rf"\[({inner}({SEP}{inner})*)?\]"
    return "(" + "|".join([STRING, NUMBER, "true", "false", "null", obj, arr]) + ")"


def json_object_regex(depth: int = ANY_DEPTH) -> str:
    """Any JSON object with at most `depth` levels of objects and arrays, the outer object included."""
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
    inner = _value(depth - 1) if depth > 0 else "(" + "|".join([STRING, NUMBER, "true", "false", "null"]) + ")"
    return rf"\{{({STRING}{COLON}{inner}({SEP}{STRING}{COLON}{inner})*)?\}}"


JSON_OBJECT = json_object_regex()


def _repeat(item: str, lo: int, hi: int | None) -> str:
    """`lo` to `hi` copies of `item` separated by commas."""
    if hi is not None and hi < lo:
        raise ValueError(f"minItems {lo} is more than maxItems {hi}: no array can match")
    if hi == 0:
        return ""
    rest = "*" if hi is None else f"{{{max(lo - 1, 0)},{hi - 1}}}"
    body = f"{item}({SEP}{item}){rest}"
    return body if lo >= 1 else f"({body})?"


def _object(schema: dict, path: str) -> str:
    props = schema.get("properties")
    if props is None:
        return json_object_regex()
    if not isinstance(props, dict):
        raise ValueError(f"{path}.properties must be an object, got {props!r}")
    extra = schema.get("additionalProperties", False)
    if extra not in (False, True):
        raise ValueError(f"{path}.additionalProperties: only true or false is supported, got a schema")
    required = schema.get("required", [])
    missing = [r for r in required if r not in props]
    if missing:
        raise ValueError(f"{path}.required names {missing}, which are not in its properties")
    names = list(props)
    items = [escape(json.dumps(n)) + COLON + schema_to_regex(props[n], f"{path}.properties.{n}") for n in names]

    def rest(i: int, first: bool) -> str:  # the properties from i on, in order, optional ones maybe left out
        if i == len(names):
            return ""
        sep = "" if first else SEP
        if names[i] in required:
            return sep + items[i] + rest(i + 1, False)
        if first:
            return f"({items[i]}{rest(i + 1, False)}|{rest(i + 1, True)})"
        return f"({sep}{items[i]})?" + rest(i + 1, False)

    return r"\{" + rest(0, True) + r"\}"


def schema_to_regex(schema, path: str = "schema") -> str:
    """The regex of the JSON texts that `schema` (the subset in the module docstring) accepts."""
    if schema is True or schema == {}:
        return _value(ANY_DEPTH)
    if not isinstance(schema, dict):
        raise ValueError(f"{path} must be a JSON Schema object, got {schema!r:.80}")
    unknown = sorted(set(schema) - _KNOWN)
    if unknown:
        raise ValueError(f"{path}: the keyword {unknown[0]!r} is not supported by labkit's JSON Schema subset")
    if "const" in schema:
        return escape(json.dumps(schema["const"]))
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise ValueError(f"{path}.enum must be a non-empty list: an empty enum matches nothing")
        return "(" + "|".join(escape(json.dumps(v)) for v in values) + ")"
    if "anyOf" in schema:
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            raise ValueError(f"{path}.anyOf must be a non-empty list")
        return "(" + "|".join(schema_to_regex(s, f"{path}.anyOf.{i}") for i, s in enumerate(options)) + ")"
    kind = schema.get("type")
    if isinstance(kind, list):
        return "(" + "|".join(schema_to_regex({**schema, "type": k}, path) for k in kind) + ")"
    if kind in _SCALARS:
        if kind == "string" and ("minLength" in schema or "maxLength" in schema):
            lo, hi = schema.get("minLength", 0), schema.get("maxLength")
            if hi is not None and hi < lo:
                raise ValueError(f"{path}: minLength {lo} is more than maxLength {hi}: no string can match")
            return f'"{STRING_CHAR}{{{lo},{"" if hi is None else hi}}}"'
        return _SCALARS[kind]
    if kind == "array":
        items = schema.get("items", True)
        return r"\[" + _repeat(schema_to_regex(items, f"{path}.items"), schema.get("minItems", 0),
                               schema.get("maxItems")) + r"\]"
    if kind == "object":
        return _object(schema, path)
    raise ValueError(f"{path}.type must be one of {sorted(_SCALARS) + ['array', 'object']}, got {kind!r}")
