"""`code_interpreter`: a persistent Python session per attempt, like a notebook kernel.

State (variables, imports, open files) survives between calls because data analysis in an
agent is incremental. The session is a separate process under the attempt's sandbox
(toolself.tools.sandbox): working directory = the workspace, resource limits, a scrubbed
environment, and when the host runs as root, an unprivileged uid of its own. Each call
returns stdout, stderr, the value of a final expression (as a REPL shows it) and the
traceback of an exception, all size-capped. A timeout kills the session's whole process
tree; the observation says that its state was lost and the next call starts afresh.
"""

from __future__ import annotations

import json
from typing import Any

from toolself.tools.base import Observation, ToolContext, ToolError, Verbatim, tool
from toolself.tools.sandbox import LIMITS_PRELUDE, CallResult, Limits, SandboxedProcess, SandboxUser, limits_for

# The child's main loop. It is passed with -c, so it needs nothing but the standard library
# and works under an interpreter that cannot import toolself.
DRIVER = LIMITS_PRELUDE + r'''
import ast, linecache, site, sys, traceback
for _d in json.loads(os.environ.pop("TOOLSELF_SITE_DIRS", "[]")):
    site.addsitedir(_d)
_ctl_in = os.fdopen(int(os.environ.pop("TOOLSELF_CTL_IN")), "rb", buffering=0)
_ctl_out = int(os.environ.pop("TOOLSELF_CTL_OUT"))
_mark = os.environ.pop("TOOLSELF_MARK").encode()
_value_cap = int(os.environ.pop("TOOLSELF_VALUE_CHARS"))
_error_cap = 2 * _value_cap
_pid = os.getpid()
if sys.path[:1] != [""]:
    sys.path.insert(0, "")
_ns = {"__name__": "__main__", "__builtins__": __builtins__}


def _run(code, cell):
    name = f"<cell {cell}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), _ns)
    if last is not None:
        value = eval(compile(last, name, "eval"), _ns)
        if value is not None:
            _ns["_"] = value
            text = repr(value)
            if len(text) > _value_cap:
                text = text[:_value_cap] + f"... [{len(text) - _value_cap:,} characters of the value cut]"
            return text
    return None


def _format(exc):
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _last(text, cap):
    if len(text) <= cap:
        return text
    return f"[... the first {len(text) - cap:,} characters of the error cut ...]\n" + text[-cap:]


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


_buffer = b""
while True:
    while b"\n" not in _buffer:
        _chunk = _ctl_in.read(1 << 16)
        if not _chunk:
            os._exit(0)
        _buffer += _chunk
    _line, _buffer = _buffer.split(b"\n", 1)
    _request = json.loads(_line)
    _id = _request.pop("id").encode()
    _value = _error = None
    try:
        _value = _run(_request["code"], _request["cell"])
    except SystemExit as _exc:
        _error = f"SystemExit({_exc.code!r}) was caught: the session goes on (restarting it is not needed)."
    except BaseException as _exc:
        try:
            _error = _format(_exc)
        except BaseException:
            _error = f"{type(_exc).__name__}: {_exc}"
    finally:
        if os.getpid() != _pid:  # a fork of the session returned here: it must not answer
            os._exit(0)
    for _stream, _fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            _stream.flush()
        except BaseException:
            pass
        try:
            _write_all(_fd, _mark)
        except OSError:
            pass
    _error = _last(_error, _error_cap) if _error else _error
    _write_all(_ctl_out, b"\n" + _id + b" " + (json.dumps({"value": _value, "error": _error}) + "\n").encode())
'''


class PythonSession:
    """The attempt's Python kernel; restarted transparently after a timeout or a crash."""

    def __init__(self, user: SandboxUser, limits: Limits):
        interpreter = user.interpreter
        self.limits = limits
        self.cell = 0
        self.process = SandboxedProcess(
            "Python session", [interpreter.executable, "-u", "-c", DRIVER], user, limits,
            extra_env={"TOOLSELF_SITE_DIRS": json.dumps(list(interpreter.site_dirs)),
                       "TOOLSELF_VALUE_CHARS": str(max(200, limits.output_chars // 2))},
        )

    @classmethod
    def for_context(cls, ctx: ToolContext) -> "PythonSession":
        session = ctx.resources.get("python")
        if session is None:
            session = cls(SandboxUser.for_context(ctx), limits_for(ctx))
            ctx.resources["python"] = session
        return session

    def run(self, code: str, timeout_s: float | None = None) -> CallResult:
        self.cell += 1
        cell = self.cell
        return self.process.call(lambda call_id: json.dumps({"id": call_id, "code": code, "cell": cell}).encode() + b"\n",
                                 timeout_s)

    def close(self) -> None:
        self.process.close()


def format_python_result(result: CallResult) -> Observation:
    parts: list[str] = []
    reply: dict[str, Any] = {}
    if result.reply:
        try:
            reply = json.loads(result.reply)
        except ValueError:
            reply = {"error": "the session's reply was unreadable: " + result.reply[:200]}
    if result.stdout.strip():
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr.strip():
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if reply.get("value") is not None:
        parts.append("[value]\n" + reply["value"])
    if reply.get("error"):
        parts.append("[error]\n" + reply["error"].rstrip("\n"))
    for note in result.notes:
        parts.append(f"[note] {note}")
    if not parts:
        parts.append("(no output)")
    failed = result.status != "ok" or bool(reply.get("error"))
    return Observation("\n".join(parts), is_error=failed, metadata={"status": result.status, "seconds": round(result.seconds, 3)})


@tool
def code_interpreter(code: Verbatim, ctx: ToolContext) -> Observation:
    """Run Python in a persistent session in the task's workspace (state is kept between calls, like a notebook).

    Returns what was printed, the value of the last expression, and any traceback.

    Args:
        code: Python source to execute.
    """
    if ctx is None:
        raise ToolError("code_interpreter needs a task context (a workspace)")
    if not code.strip():
        raise ToolError("the code is empty")
    return format_python_result(PythonSession.for_context(ctx).run(code))
