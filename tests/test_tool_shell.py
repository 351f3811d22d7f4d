"""`execute_bash`: one persistent, sandboxed shell per attempt, in its workspace."""

from toolself.tools.shell import execute_bash


def sh(ctx, command):
    return execute_bash({"command": command}, ctx)


def test_runs_in_the_workspace(ctx):
    assert sh(ctx, "pwd").content == "."


def test_cd_and_variables_persist(ctx):
    sh(ctx, "mkdir -p src && cd src && export GREETING=hello && count=3")
    assert sh(ctx, 'pwd; echo "$GREETING $count"').content == "./src\nhello 3"


def test_exit_status_and_stderr_are_reported(ctx):
    obs = sh(ctx, "echo visible; ls no-such-file")
    assert obs.is_error
    assert obs.content.startswith("visible\n[stderr]\nls: cannot access")
    assert obs.content.endswith("[exit status 2]")


def test_syntax_error_costs_one_call_not_the_shell(ctx):
    sh(ctx, "kept=1")
    assert "syntax error" in sh(ctx, "if then fi (").content
    assert sh(ctx, "echo $kept").content == "1"


def test_commands_get_no_stdin(ctx):
    obs = sh(ctx, "cat; read line; echo done")
    assert obs.content.startswith("done") or "done" in obs.content
    assert sh(ctx, "echo next").content == "next"


def test_exiting_the_shell_starts_a_fresh_one_with_a_note(ctx):
    sh(ctx, "cd / && kept=1")
    died = sh(ctx, "exit 4")
    assert died.is_error and "exit status 4" in died.content
    after = sh(ctx, "pwd; echo ${kept:-unset}")
    assert after.content.startswith(".\nunset")
    assert "fresh shell" in after.content


def test_environment_is_scrubbed(ctx, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "secret-value")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    obs = sh(ctx, "env")
    assert "secret" not in obs.content
    assert "HOME=.\n" in obs.content


def test_files_created_by_the_shell_are_in_the_workspace(ctx):
    sh(ctx, "printf 'x\\ny\\n' > made.txt")
    assert (ctx.workspace / "made.txt").read_text() == "x\ny\n"


def test_background_job_does_not_block_the_call(ctx):
    obs = sh(ctx, "sleep 30 & echo started")
    assert obs.content == "started" and obs.metadata["seconds"] < 3


def test_nul_in_command_is_refused(ctx):
    assert sh(ctx, "echo a\0b").is_error
