"""Tools: typed Python functions whose schema is derived from the code, never written twice.

`@tool` reads the signature's type hints and the `Args:` section of the docstring, builds a
pydantic model of the arguments, and from it both the JSON schema shown to the model and the
validation applied to what the model sends. A tool never raises into the agent: every
failure becomes an observation that names the problem, so the model can act on it.
"""

from __future__ import annotations

import inspect
import os
import re
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Callable, get_type_hints

import pydantic

from toolself.tools.errors import ToolArgumentError, ToolError
from toolself.tools.workspace import make_workspace, open_directory, remove_workspace


Verbatim = Annotated[str, pydantic.Field(json_schema_extra={"contentMediaType": "text/plain"})]
"""A string argument used exactly as written: code, a shell command, an excerpt of a file. Its
schema says so with `contentMediaType`, and the embedded model's grammar then lets it hold line
breaks, quotes and backslashes, and leaves its length to the per-call token budget, where other
free text is kept to one capped line (see toolself.models.grammar)."""


@dataclass
class Observation:
    """What a tool call returns to the model, and whether it was an error."""

    content: str
    is_error: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolContext:
    """Per-attempt state a tool may need: the private workspace, the document collection, the
    policy model (for goal-directed reading), and long-lived resources such as a Python
    session, closed when the attempt ends."""

    workspace: Path
    collection: Any = None
    model: Any = None
    resources: dict[str, Any] = field(default_factory=dict)
    _owns_workspace: bool = False
    _root_fd: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if os.path.isdir(self.workspace):
            self.root_fd  # noqa: B018 - taken now, before any code of the attempt has run

    @classmethod
    def temporary(cls, collection: Any = None, model: Any = None) -> "ToolContext":
        """A context with a fresh workspace of its own (`make_workspace`), deleted at `close()`."""
        return cls(workspace=make_workspace(), collection=collection, model=model, _owns_workspace=True)

    @property
    def root_fd(self) -> int:
        """The workspace's directory descriptor, through which host-side tools reach its files
        (see toolself.tools.workspace). Taken once, when the context is made (or on first use
        if the folder did not exist yet), so that renaming the folder and putting a link in its
        place later moves nothing the host touches."""
        if self._root_fd is None:
            self._root_fd = open_directory(self.workspace)
        return self._root_fd

    def relative(self, text: str) -> str:
        """`text` with the workspace's own path written as `.`, so that a traceback reads
        `File "./tests/test_units.py"`. Where a run keeps its workspaces is the host's business:
        the absolute path costs the model context tokens, names the machine in trajectories and
        training data, and its random suffix would make the same attempt read differently on
        every run."""
        for root in _spellings(self.workspace):
            text = re.sub(re.escape(root) + r"(?![\w-]|\.[\w-])", ".", text)
        return text

    def close(self) -> None:
        for resource in list(self.resources.values()):
            close = getattr(resource, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # a resource that fails to close must not hide the result
                    pass
        self.resources.clear()
        self._close_root()
        if self._owns_workspace:
            remove_workspace(self.workspace)

    def _close_root(self) -> None:
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None

    def __del__(self) -> None:
        self._close_root()


def _spellings(workspace: Path) -> list[str]:
    """The workspace's absolute path as given and as resolved (a link in its path, such as
    macOS's /tmp), longest first so that one is never replaced inside the other."""
    return sorted({str(workspace.absolute()), str(workspace.resolve())}, key=len, reverse=True)


_ARGS_SECTION = re.compile(r"^\s*Args:\s*$", re.MULTILINE)
_SECTION_END = re.compile(r"^\s*(Returns|Raises|Yields|Examples?|Notes?):\s*$", re.MULTILINE)
_ARG_LINE = re.compile(r"^\s{0,8}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into the description and per-argument help."""
    doc = inspect.cleandoc(doc or "")
    match = _ARGS_SECTION.search(doc)
    if not match:
        return re.sub(r"(?<!\n)\n(?!\n)", " ", doc), {}
    description = re.sub(r"(?<!\n)\n(?!\n)", " ", doc[: match.start()].strip())
    rest = doc[match.end():]
    end = _SECTION_END.search(rest)
    if end:
        rest = rest[: end.start()]
    args: dict[str, str] = {}
    current: str | None = None
    for line in rest.splitlines():
        m = _ARG_LINE.match(line)
        if m and len(line) - len(line.lstrip()) <= 8 and (current is None or not line.startswith(" " * 12)):
            current = m.group(1)
            args[current] = m.group(2).strip()
        elif current and line.strip():
            args[current] = (args[current] + " " + line.strip()).strip()
    return description, args


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Inline `$defs` so that every backend (and grammar compiler) sees a flat schema."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node and node["$ref"].startswith("#/$defs/"):
                return walk(dict(defs[node["$ref"].split("/")[-1]]))
            options = node.get("anyOf")
            if options and len(options) == 2 and {"type": "null"} in options and node.get("default", 0) is None:
                # An optional argument is shown as its plain type and left out of `required`:
                # simpler for models and for grammar compilers than a union with null.
                rest = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
                return walk({**next(o for o in options if o != {"type": "null"}), **rest})
            return {k: walk(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


class Tool:
    """A callable the model may use. Built by `@tool` or directly from a function."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None, description: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        doc_description, arg_help = parse_docstring(fn.__doc__)
        self.description = description or doc_description or self.name
        hints = get_type_hints(fn, include_extras=True)
        signature = inspect.signature(fn)
        self.wants_context = False
        fields: dict[str, Any] = {}
        for pname, param in signature.parameters.items():
            if pname == "ctx" or hints.get(pname) is ToolContext:
                self.wants_context = True
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {self.name}: *args and **kwargs have no schema")
            if pname not in hints:
                raise TypeError(f"tool {self.name}: argument {pname!r} needs a type hint")
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (hints[pname], pydantic.Field(default, description=arg_help.get(pname)))
        self.arguments_model = pydantic.create_model(
            f"{self.name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
        schema = _inline_refs(self.arguments_model.model_json_schema())
        schema.pop("title", None)
        schema.setdefault("properties", {})
        schema.pop("additionalProperties", None)
        self.parameters: dict[str, Any] = schema

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool schema."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                  "parameters": self.parameters}}

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Return validated keyword arguments or raise `ToolArgumentError` naming each problem."""
        try:
            parsed = self.arguments_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            problems = []
            for err in exc.errors():
                where = ".".join(str(p) for p in err["loc"]) or "arguments"
                problems.append(f"{where}: {err['msg']}")
            expected = ", ".join(
                f"{k}{'' if k in self.parameters.get('required', []) else '?'}" for k in self.parameters["properties"]
            )
            raise ToolArgumentError(
                f"invalid arguments for {self.name}: " + "; ".join(problems) + f". Expected arguments: {expected}."
            ) from None
        return {name: getattr(parsed, name) for name in self.arguments_model.model_fields}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`tool(arguments, ctx)`, as the agent calls it: validate and run; every failure comes
        back as an error observation, and the workspace appears in it as `.`
        (`ToolContext.relative`). Called as the function it wraps (`add(amount=3)`: keyword
        arguments, or a first positional argument that is not a dict), it is that function, so
        decorating a function does not take it away from the rest of a program."""
        agent_call = (not kwargs and 1 <= len(args) <= 2 and isinstance(args[0], dict)
                      and (len(args) == 1 or args[1] is None or isinstance(args[1], ToolContext)))
        if not agent_call:
            return self.fn(*args, **kwargs)
        arguments, ctx = args[0], (args[1] if len(args) == 2 else None)
        observation = self._run(arguments, ctx)
        if ctx is None:
            return observation
        return replace(observation, content=ctx.relative(observation.content))

    def _run(self, arguments: dict[str, Any], ctx: ToolContext | None) -> Observation:
        try:
            kwargs = self.validate(arguments)
        except ToolArgumentError as exc:
            return Observation(str(exc), is_error=True)
        if self.wants_context:
            kwargs["ctx"] = ctx
        try:
            result = self.fn(**kwargs)
        except ToolError as exc:
            return Observation(f"{self.name} failed: {exc}", is_error=True)
        except Exception as exc:
            last = traceback.extract_tb(exc.__traceback__)[-1]
            return Observation(
                f"{self.name} failed: {type(exc).__name__}: {exc} (at {Path(last.filename).name}:{last.lineno})",
                is_error=True,
            )
        if isinstance(result, Observation):
            return result
        return Observation(result if isinstance(result, str) else str(result))

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None):
    """Turn a typed function into a `Tool`. Usable bare (`@tool`) or with options."""
    if fn is None:
        return lambda f: Tool(f, name=name, description=description)
    return Tool(fn, name=name, description=description)


class ToolPool:
    """The global pool T_all: every tool an agent could be given, by name."""

    def __init__(self, tools: list[Tool] | None = None):
        self._tools: dict[str, Tool] = {}
        for t in tools or []:
            self.add(t)

    def add(self, t: Tool) -> None:
        if t.name in self._tools:
            raise ValueError(f"a tool named {t.name!r} is already in the pool")
        self._tools[t.name] = t

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self):
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def replace(self, t: Tool) -> None:
        """Put `t` in the place of the tool of the same name (a built-in bound to a run's settings)."""
        if t.name not in self._tools:
            raise KeyError(f"no tool named {t.name!r} in the pool")
        self._tools[t.name] = t

    def subset(self, names: list[str]) -> list[Tool]:
        return [self._tools[n] for n in names if n in self._tools]

    def schemas(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        return [t.schema for t in (self.subset(names) if names is not None else self)]

    def catalogue(self) -> str:
        """The tool catalogue as shown in a configuration-generation spec: name, purpose, arguments."""
        lines = []
        for t in self:
            args = ", ".join(
                f"{k}: {v.get('type', 'any')}{'' if k in t.parameters.get('required', []) else ' (optional)'}"
                for k, v in t.parameters["properties"].items()
            )
            lines.append(f"- {t.name}({args}): {t.description.splitlines()[0] if t.description else ''}")
        return "\n".join(lines)
