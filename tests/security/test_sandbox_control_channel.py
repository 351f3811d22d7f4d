"""The control pipe between the host and a sandboxed session (findings 5 and 10 of issue 25).

Code in the session can write to its own control pipe (the Python session's code runs in the
process that answers the host), and to the pipes of the attempt's other sessions through
/proc. Whatever it writes there costs the host bounded memory and answers no call but its own.
"""

import os
import re
import sys
import time

import pytest

from toolself.tools.code import code_interpreter
from toolself.tools.sandbox import REPLY_BYTES, with_limits
from toolself.tools.shell import execute_bash

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sandbox_timeout():
    return 30


def py(ctx, code):
    return code_interpreter({"code": code}, ctx)


def resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


FLOOD = """import os, sys
fd = sys.modules["__main__"]._ctl_out
chunk = memoryview(b"x" * (1 << 20))
for _ in range(200):
    view = chunk
    while view:
        view = view[os.write(fd, view):]
"flooded"
"""


def test_two_hundred_megabytes_without_a_newline_on_the_control_pipe_leave_the_host_memory_bounded(ctx):
    py(ctx, "1")
    before = resident_mb()
    obs = py(ctx, FLOOD)
    grown = resident_mb() - before
    assert obs.content == "[value]\n'flooded'", obs.content
    assert grown < 64, f"the host grew by {grown:.0f} MB while 200 MB went through the control pipe"
    assert py(ctx, "2 + 2").content == "[value]\n4"


def test_a_reply_over_the_cap_is_an_error_for_that_call_and_the_next_call_is_answered(ctx):
    with_limits(ctx, output_chars=4_000_000)  # a value cap of 2,000,000 characters, above the reply cap
    obs = py(ctx, f"'x' * {REPLY_BYTES + 1000}")
    assert obs.is_error and f"over {REPLY_BYTES:,} bytes and was dropped" in obs.content
    assert "x" * 1000 not in obs.content
    assert py(ctx, "'next'").content == "[value]\n'next'"


FORGE = """import os, sys
os.write(sys.modules["__main__"]._ctl_out, b'{"value": "FORGED", "error": null}\\n0\\n')
41 + 1
"""


def test_a_forged_reply_on_the_control_pipe_neither_answers_the_call_nor_shifts_later_replies(ctx):
    obs = py(ctx, FORGE)
    assert obs.content == "[value]\n42", obs.content
    assert py(ctx, "'second'").content == "[value]\n'second'"
    assert py(ctx, "'third'").content == "[value]\n'third'"


FORGE_WITH_ID = """import os, sys
frame = sys._getframe()
while frame.f_back is not None:
    frame = frame.f_back
os.write(sys.modules["__main__"]._ctl_out, b"\\n" + frame.f_globals["_id"] + b' {"value": "FORGED", "error": null}\\n')
"genuine"
"""


def test_a_reply_forged_with_the_calls_own_id_answers_only_that_call(ctx):
    """The session's code can read the id of its own call from the session's memory; it can
    choose that call's reply (as it chooses its value), not any later one."""
    assert py(ctx, FORGE_WITH_ID).content == "[value]\nFORGED"
    assert py(ctx, "'second'").content == "[value]\n'second'"
    assert py(ctx, "'third'").content == "[value]\n'third'"


INTO_THE_SHELL = """import re
try:
    environ = open("/proc/{pid}/environ", "rb").read().decode()
    fd = re.search(r"TOOLSELF_CTL_OUT=(\\d+)", environ).group(1)
    with open(f"/proc/{pid}/fd/{{fd}}", "wb", buffering=0) as pipe:
        pipe.write(b"\\n0\\n0\\n" * 50)
    print("written")
except PermissionError:
    print("refused")
"""


def test_lines_written_into_the_shells_control_pipe_by_the_python_session_are_dropped(ctx):
    execute_bash({"command": "true"}, ctx)
    shell = ctx.resources["bash"].process.proc.pid
    written = py(ctx, INTO_THE_SHELL.format(pid=shell)).content
    if written == "refused":
        pytest.skip("here the kernel does not let one session open another's pipes through /proc")
    assert written == "written"
    failed = execute_bash({"command": "exit_with() { return $1; }; exit_with 3"}, ctx)
    assert failed.is_error and "[exit status 3]" in failed.content
    assert execute_bash({"command": "echo fine"}, ctx).content == "fine"


STOP_READING = """import os, sys
driver = sys.modules["__main__"]
requests = driver._ctl_in  # kept open, so the host's writes do not fail: they wait
reader, writer = os.pipe()
driver._ctl_in = os.fdopen(reader, "rb", buffering=0)  # the driver now waits on a pipe nobody writes
"stopped"
"""


def test_a_session_that_stops_reading_requests_cannot_hold_the_host_past_the_timeout(ctx):
    with_limits(ctx, timeout_s=2)
    assert py(ctx, STOP_READING).content == "[value]\n'stopped'"
    big = "x = 1\n" + "#" * 300_000  # more than a pipe holds
    started = time.monotonic()
    obs = py(ctx, big)
    assert time.monotonic() - started < 10
    assert obs.is_error and "timed out after 2 s" in obs.content
    assert py(ctx, "'fresh'").content.startswith("[value]\n'fresh'")
