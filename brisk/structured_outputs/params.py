"""``StructuredOutputsParams``: what a request's output must match (vLLM's field names).

Exactly one constraint is given. Its syntax is checked when the params are built, without the tokenizer, so that a
bad schema, regex or grammar is an error naming the field before the request reaches the engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_SOURCE_PREFIX = re.compile(r"^\S+\.(?:cc|cpp|h):\d+:\s*")  # xgrammar's "file.cc:94: " before its message
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None  # a JSON schema (as a dict or its JSON text)
    regex: str | None = None
    choice: list[str] | None = None  # the output is exactly one of these strings
    grammar: str | None = None  # EBNF (GBNF) grammar whose start rule is ``root``
    json_object: bool | None = None  # any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)
    structural_tag: str | None = None  # not supported: an error
    disable_any_whitespace: bool = False  # JSON without free whitespace between tokens
    disable_fallback: bool = False  # accepted: brisk has one grammar engine, so there is nothing to fall back to
    disable_additional_properties: bool = False  # JSON schemas: objects take only the properties they list
    whitespace_pattern: str | None = None  # not supported: an error

    def __post_init__(self) -> None:
        given = [name for name in CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"StructuredOutputsParams takes exactly one of {', '.join(CONSTRAINTS)}, got "
                f"{', '.join(given) if given else 'none'}."
            )
        for name in ("structural_tag", "whitespace_pattern"):
            if getattr(self, name) is not None:
                raise ValueError(f"StructuredOutputsParams.{name} is not supported by brisk.")
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except ValueError as exc:
                raise ValueError(f"StructuredOutputsParams.json is not valid JSON: {exc}.") from None
        if self.json is not None and not isinstance(self.json, dict):
            raise ValueError("StructuredOutputsParams.json must be a JSON schema object.")
        choice = self.choice
        if choice is not None and not (
            isinstance(choice, list) and choice and all(isinstance(c, str) and c for c in choice)
        ):
            raise ValueError("StructuredOutputsParams.choice must be a non-empty list of non-empty strings.")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"StructuredOutputsParams.{name} must be a non-empty string.")
        self.check_syntax()

    @property
    def kind(self) -> str:
        return next(name for name in CONSTRAINTS if getattr(self, name) not in (None, False))

    def schema_text(self) -> str:
        """The JSON schema as xgrammar takes it, with ``disable_additional_properties`` applied."""
        schema = _without_additional_properties(self.json) if self.disable_additional_properties else self.json
        return json.dumps(schema)

    def ebnf(self) -> str:
        """The grammar of ``grammar`` or ``choice`` (each choice a literal alternative of ``root``)."""
        if self.choice is not None:
            return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in self.choice)
        assert self.grammar is not None
        return self.grammar

    def cache_key(self) -> tuple:
        """Equal for constraints that compile to the same grammar."""
        body = self.schema_text() if self.json is not None else self.regex if self.regex is not None else None
        return (self.kind, body if body is not None else self.ebnf() if self.kind != "json_object" else None,
                self.disable_any_whitespace)  # fmt: skip

    def check_syntax(self) -> None:
        """Parse the constraint with xgrammar (no tokenizer needed); a bad one raises ValueError naming the field."""
        import xgrammar as xgr

        kind = self.kind
        try:
            if kind == "json":
                xgr.Grammar.from_json_schema(self.schema_text())
            elif kind == "regex":
                xgr.Grammar.from_regex(self.regex)
            elif kind in ("grammar", "choice"):
                xgr.Grammar.from_ebnf(self.ebnf())
        except RuntimeError as exc:
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            detail = _SOURCE_PREFIX.sub("", lines[-1].split("] ", 1)[-1]) if lines else type(exc).__name__
            raise ValueError(f"StructuredOutputsParams.{kind} is invalid: {detail}") from None


def _without_additional_properties(schema: Any) -> Any:
    """A copy of ``schema`` in which every object schema sets ``additionalProperties: false``."""
    if isinstance(schema, list):
        return [_without_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _without_additional_properties(v) for k, v in schema.items()}
    if out.get("type") == "object" or "properties" in out:
        out["additionalProperties"] = False
    return out
