"""`code_interpreter`: a persistent, sandboxed Python session per attempt."""

import os
import statistics
import time

from toolself.tools.base import ToolContext
from toolself.tools.code import code_interpreter


def py(ctx, code):
    return code_interpreter({"code": code}, ctx)


def test_state_survives_between_calls(ctx):
    py(ctx, "import math\nradius = 2")
    assert py(ctx, "round(math.pi * radius ** 2, 2)").content == "[value]\n12.57"


def test_stdout_stderr_and_value_are_reported(ctx):
    obs = py(ctx, "import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7")
    assert obs.content == "out\n[stderr]\nerr\n[value]\n42"
    assert not obs.is_error


def test_none_value_is_not_shown(ctx):
    assert py(ctx, "x = None\nx").content == "(no output)"


def test_exception_gives_the_traceback_of_the_cell(ctx):
    obs = py(ctx, "def f(x):\n    return 1 / x\n\nf(0)")
    assert obs.is_error
    assert 'File "<cell 1>", line 4' in obs.content and "return 1 / x" in obs.content
    assert "ZeroDivisionError: division by zero" in obs.content
    assert "_run" not in obs.content  # the driver's own frames are hidden


def test_syntax_error_is_reported_and_the_session_goes_on(ctx):
    py(ctx, "kept = 1")
    obs = py(ctx, "def broken(:")
    assert obs.is_error and "SyntaxError" in obs.content
    assert py(ctx, "kept").content == "[value]\n1"


def test_working_directory_is_the_workspace(ctx):
    py(ctx, "open('data.csv', 'w').write('a,b\\n1,2\\n')")
    assert (ctx.workspace / "data.csv").read_text() == "a,b\n1,2\n"
    assert py(ctx, "import os; os.getcwd()").content == "[value]\n'.'"


def test_installed_libraries_are_importable(ctx):
    assert py(ctx, "import numpy as np\nint(np.arange(5).sum())").content == "[value]\n10"


def test_host_secrets_are_not_in_the_environment(ctx, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    obs = py(ctx, "import os\nsorted(k for k in os.environ if 'KEY' in k or 'TOKEN' in k), os.environ['HOME']")
    assert "sk-secret" not in obs.content
    assert obs.content == "[value]\n([], '.')"


def test_sys_exit_does_not_end_the_session(ctx):
    py(ctx, "kept = 5")
    assert "SystemExit" in py(ctx, "import sys; sys.exit(3)").content
    assert py(ctx, "kept").content == "[value]\n5"


def test_hard_exit_restarts_the_session_with_a_note(ctx):
    py(ctx, "kept = 5")
    died = py(ctx, "import os; os._exit(7)")
    assert died.is_error and "exit status 7" in died.content
    after = py(ctx, "'kept' in globals()")
    assert after.content.startswith("[value]\nFalse") and "fresh Python session" in after.content


def test_forked_child_does_not_answer_for_the_session(ctx):
    obs = py(ctx, "import os\npid = os.fork()\npid != 0")
    assert obs.content == "[value]\nTrue"
    assert py(ctx, "1 + 1").content == "[value]\n2"


def test_large_value_is_cut_with_a_note(ctx):
    obs = py(ctx, "list(range(100000))")
    assert "characters of the value cut" in obs.content
    assert len(obs.content) < 20_000


def test_empty_code_is_an_error_observation(ctx):
    assert py(ctx, "   ").is_error


def test_warm_trivial_call_is_fast(ctx):
    py(ctx, "1")
    times = []
    for _ in range(20):
        start = time.perf_counter()
        py(ctx, "1 + 1")
        times.append(time.perf_counter() - start)
    assert statistics.median(times) < 0.05


def test_sessions_of_two_attempts_are_separate():
    a, b = ToolContext.temporary(), ToolContext.temporary()
    try:
        py(a, "secret = 'a'")
        assert "NameError" in py(b, "secret").content
    finally:
        a.close()
        b.close()


def test_close_ends_the_session_process(ctx):
    py(ctx, "import os; pid = os.getpid()")
    pid = int(py(ctx, "pid").content.split("\n")[1])
    ctx.close()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"


def test_a_megabyte_of_code_goes_through(ctx):
    code = "data = [\n" + "".join(f"    {i},\n" for i in range(150_000)) + "]\nlen(data)"
    assert len(code) > 1_000_000
    assert py(ctx, code).content == "[value]\n150000"
