"""Grammars that keep a small model's replies parseable (xgrammar).

Two shapes of reply are constrained:
- a tool-call turn: exactly one `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
  block, where `name` is one of the offered tools and `arguments` matches *that* tool's
  parameter schema;
- a structured turn: one JSON document matching a response schema (the configurations).

The grammar fixes syntax only. Every offered tool stays an alternative of equal standing, so
the choice of tool is the model's own. Free-text strings get a length cap because a 135M model
left inside an unbounded string can repeat itself until the token budget is gone. xgrammar's
rule for a capped string admits no JSON escape, so capped text is one line without quotes or
backslashes (every way of widening that rule made token masks far slower:
docs/notes/2026-12-02-x2-top-12-layers-and-three-grammar-mismatches.md). Strings
that must be written verbatim (code, shell commands, excerpts of files: `contentMediaType` in
the schema, see `toolself.tools.base.Verbatim`) keep the full JSON string rule and no cap; the
per-call token budget bounds them. A large model (`scale`) gets no caps at all (`max_string`
None): it closes its strings, and every string keeps the full JSON rule.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from typing import Any

DEFAULT_MAX_STRING = 400
DEFAULT_MAX_ITEMS = 16
_FREE_STRING_KEYS = ("maxLength", "enum", "const", "pattern", "format", "contentMediaType")


def tool_name(tool: dict[str, Any]) -> str:
    """The name of a tool given as an OpenAI function schema or as a bare function object."""
    return (tool.get("function") or tool)["name"]


def tool_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """The parameter schema of a tool; a tool without one takes an empty object."""
    params = (tool.get("function") or tool).get("parameters") or {}
    params = dict(params)
    params.setdefault("type", "object")
    if params.get("type") == "object":
        params.setdefault("properties", {})
    return params


def cap_strings(schema: Any, max_length: int = DEFAULT_MAX_STRING) -> Any:
    """A copy of `schema` where every free string (no maxLength, enum, const, pattern, format
    or contentMediaType) gets `maxLength: max_length`, and every array without maxItems gets
    one (the number of choices for an array of enumerated values, which is how a model picking
    a toolbox stops repeating a name; else DEFAULT_MAX_ITEMS). Nested objects, arrays and
    unions are followed."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        is_string = kind == "string" or (isinstance(kind, list) and "string" in kind)
        if is_string and not any(k in node for k in _FREE_STRING_KEYS):
            node["maxLength"] = max_length
        is_array = kind == "array" or (isinstance(kind, list) and "array" in kind)
        if is_array and "maxItems" not in node:
            items = node.get("items")
            choices = items.get("enum") if isinstance(items, dict) else None
            node["maxItems"] = len(choices) if choices else DEFAULT_MAX_ITEMS
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions", "patternProperties"):
                if isinstance(value, dict):
                    for sub in value.values():
                        walk(sub)
            elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "prefixItems", "not",
                         "if", "then", "else", "contains"):
                walk(value)

    walk(schema)
    return schema


def capped(schema: Any, max_length: int | None) -> Any:
    """`cap_strings(schema, max_length)`, or `schema` as it is when `max_length` is None."""
    return schema if max_length is None else cap_strings(schema, max_length)


def tool_call_schema(tools: list[dict[str, Any]], max_string: int | None = DEFAULT_MAX_STRING) -> dict[str, Any]:
    """The JSON schema of the object inside `<tool_call>`: one alternative per tool, each with
    its name as a constant and its own parameters (string-capped unless `max_string` is None)."""
    if not tools:
        raise ValueError("a tool-call grammar needs at least one tool")
    options = []
    for tool in tools:
        options.append({
            "type": "object",
            "properties": {
                "name": {"const": tool_name(tool)},
                "arguments": capped(tool_parameters(tool), max_string),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    return options[0] if len(options) == 1 else {"anyOf": options}


def _json_grammar(schema: dict[str, Any]):
    import xgrammar as xgr

    # One fixed layout (json.dumps's separators, no free whitespace): a small model cannot
    # wander off into whitespace, and the text matches how the protocol renders past calls.
    return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "),
                                        strict_mode=True)


def _literal(text: str):
    import xgrammar as xgr

    return xgr.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")


def tool_call_grammar(tools: list[dict[str, Any]], max_string: int | None = DEFAULT_MAX_STRING):
    """The grammar of a reply made of exactly one text-protocol tool call."""
    import xgrammar as xgr

    return xgr.Grammar.concat(_literal("<tool_call>\n"), _json_grammar(tool_call_schema(tools, max_string)),
                              _literal("\n</tool_call>"))


def response_grammar(schema: dict[str, Any], max_string: int | None = DEFAULT_MAX_STRING):
    """The grammar of a reply made of one JSON document matching `schema`."""
    return _json_grammar(capped(schema, max_string))


def grammar_key(tools: list[dict[str, Any]] | None, schema: dict[str, Any] | None) -> str | None:
    """A cache key for the constraint of one call, or None when the call is unconstrained."""
    if schema is not None:
        return "schema:" + json.dumps(schema, sort_keys=True)
    if tools:
        return "tools:" + json.dumps(tools, sort_keys=True)
    return None


class GrammarCache:
    """Compiles constraints for one tokenizer and keeps the most recent ones, because an agent
    offers the same toolbox and the same configuration schema over and over and compiling
    takes tens of milliseconds to seconds. `tokenizer` is a Hugging Face tokenizer or an
    `xgrammar.TokenizerInfo`; `max_string`: the cap on free strings, None for none."""

    def __init__(self, tokenizer: Any, vocab_size: int, *, max_string: int | None = DEFAULT_MAX_STRING,
                 capacity: int = 64, stop_token_ids: list[int] | None = None):
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self.max_string = max_string
        self.capacity = capacity
        if isinstance(tokenizer, xgr.TokenizerInfo):
            self.tokenizer_info = tokenizer
        else:
            self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                                     stop_token_ids=stop_token_ids)
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=2, cache_enabled=False)
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def compiled(self, tools: list[dict[str, Any]] | None, schema: dict[str, Any] | None):
        """The compiled grammar for a call, or None when the call is unconstrained."""
        key = grammar_key(tools, schema)
        if key is None:
            return None
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
        grammar = response_grammar(schema, self.max_string) if schema is not None \
            else tool_call_grammar(tools or [], self.max_string)
        compiled = self.compiler.compile_grammar(grammar)
        with self._lock:
            self._compiled[key] = compiled
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return compiled

    def matcher(self, tools: list[dict[str, Any]] | None, schema: dict[str, Any] | None):
        """A fresh matcher for one reply, or None when the call is unconstrained."""
        import xgrammar as xgr

        compiled = self.compiled(tools, schema)
        return None if compiled is None else xgr.GrammarMatcher(compiled)
