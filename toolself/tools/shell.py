"""`execute_bash`: one persistent bash per attempt, in the workspace, under the sandbox.

A persistent shell is what an engineer expects: `cd`, exported variables, functions and
activated environments carry over between calls. Each command is run with `eval` by a small
driver loop that reads commands from a private pipe, so a command reading stdin gets end of
file instead of swallowing the next command, and a syntax error costs one call, not the
shell. If the command exits the shell, times out or trips a limit, the shell's processes are
killed and the next call gets a fresh shell and a note saying so.
"""

from __future__ import annotations

import shutil

from toolself.tools.base import Observation, ToolContext, ToolError, Verbatim, tool
from toolself.tools.sandbox import LIMITS_PRELUDE, CallResult, Limits, SandboxedProcess, SandboxUser, limits_for

BASH_DRIVER = r'''
__ts_in=$TOOLSELF_CTL_IN; __ts_out=$TOOLSELF_CTL_OUT; __ts_mark=$TOOLSELF_MARK
unset TOOLSELF_CTL_IN TOOLSELF_CTL_OUT TOOLSELF_MARK
while IFS= builtin read -r -d '' __ts_id <&"$__ts_in" && IFS= builtin read -r -d '' __ts_cmd <&"$__ts_in"; do
  builtin eval "$__ts_cmd" </dev/null
  __ts_status=$?
  builtin printf '%s' "$__ts_mark"
  builtin printf '%s' "$__ts_mark" >&2
  builtin printf '\n%s %d\n' "$__ts_id" "$__ts_status" >&"$__ts_out"
done
'''


def _bash() -> str:
    return shutil.which("bash", path="/usr/bin:/bin:/usr/local/bin") or "/bin/bash"


class BashSession:
    """The attempt's shell. Started through a short Python prelude that applies the limits
    and then execs bash, because `resource` limits must be set inside the child."""

    def __init__(self, user: SandboxUser, limits: Limits):
        launcher = LIMITS_PRELUDE + (
            "os.execv(%r, ['bash', '--noprofile', '--norc', '-c', %r])" % (_bash(), BASH_DRIVER)
        )
        self.process = SandboxedProcess("shell", [user.interpreter.executable, "-S", "-c", launcher], user, limits)

    @classmethod
    def for_context(cls, ctx: ToolContext) -> "BashSession":
        session = ctx.resources.get("bash")
        if session is None:
            session = cls(SandboxUser.for_context(ctx), limits_for(ctx))
            ctx.resources["bash"] = session
        return session

    def run(self, command: str, timeout_s: float | None = None) -> CallResult:
        return self.process.call(lambda call_id: f"{call_id}\0{command}\0".encode(), timeout_s)

    def close(self) -> None:
        self.process.close()


def format_bash_result(result: CallResult) -> Observation:
    parts = []
    if result.stdout.strip():
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr.strip():
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    status = None
    if result.status == "ok" and result.reply is not None:
        try:
            status = int(result.reply.strip())
        except ValueError:
            status = None
        if status:
            parts.append(f"[exit status {status}]")
    for note in result.notes:
        parts.append(f"[note] {note}")
    if not parts:
        parts.append("(no output)")
    failed = result.status != "ok" or bool(status)
    return Observation("\n".join(parts), is_error=failed,
                       metadata={"status": result.status, "exit_status": status, "seconds": round(result.seconds, 3)})


@tool
def execute_bash(command: Verbatim, ctx: ToolContext) -> Observation:
    """Run a bash command in the task's workspace, in a shell that persists between calls.

    cd and variables carry over between calls. Commands get no stdin; long-running commands time out.

    Args:
        command: The bash command(s) to run.
    """
    if ctx is None:
        raise ToolError("execute_bash needs a task context (a workspace)")
    if not command.strip():
        raise ToolError("the command is empty")
    if "\0" in command:
        raise ToolError("the command contains a NUL character")
    return format_bash_result(BashSession.for_context(ctx).run(command))
