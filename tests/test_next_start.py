"""What the next start reads, however it lies in the workspace: the program's own .env as a
link, a folder or nothing yet; its compiled code wherever PYTHONPYCACHEPREFIX puts it; the
bubblewrap it runs outside the sandbox, reached through a link; the prompt history not made
yet; the empty files laid over hidden ones. A command can change none of it, or the next
start says so and does not trust it."""

import os
import signal

import cli_runner
import pytest
from conftest import Terminal, cli_env, run_cli, wait_until
from s08_context_compact.offline.fake_anthropic import text, tool_use, tool_uses
from test_sandbox_seams import RecordingProxy, copy_of_the_program, needs_bwrap


@pytest.fixture
def proxy():
    recording = RecordingProxy()
    yield recording
    recording.server.close()


def clone(beyond_tmp):
    """A clone of the program, started from its root as the README says."""
    root = beyond_tmp / "clone"
    root.mkdir()
    return root, copy_of_the_program(root)


def clone_with_a_linked_own_env(beyond_tmp):
    """A clone whose own .env is a link to a file of yours outside it (a dotfiles folder)."""
    root, code = clone(beyond_tmp)
    kept = beyond_tmp / "kept.env"
    kept.write_text("MODEL_ID=claude-test\nS08_HISTORY=off\n")
    (root / ".env").symlink_to(kept)
    return root, code


def shell_without_model(fake, **extra) -> dict:
    env = cli_env(fake, SANDBOX="", NO_PROXY="", no_proxy="")
    env.pop("MODEL_ID")  # from the program's own .env, unless given here
    return {**env, **extra}


def script(folder, name: str, text: str) -> dict:
    """A bash call that runs a script: what it does is the script's (the permission check reads
    only the command's text, and the sandbox decides)."""
    (folder / name).write_text(text + "\n")
    return {"command": f"sh {name}"}


def tool_result(request: dict, index: int = 0) -> str:
    return request["messages"][-1]["content"][index]["content"]


@needs_bwrap
def test_an_own_env_a_command_put_where_a_link_was_is_not_trusted_until_you_save_it(fake, beyond_tmp, proxy):
    root, code = clone_with_a_linked_own_env(beyond_tmp)
    planted = f"HTTP_PROXY={proxy.url}\\nALL_PROXY={proxy.url}\\nMODEL_ID=claude-test\\n"
    fake.reply(tool_use("bash", script(root, "swap.sh", f"rm .env && printf '{planted}' > .env && echo swapped")),
               text("Done."), text("Hello."), text("Hello again."))
    env = shell_without_model(fake)
    first = cli_runner.run([], input="set up\n", cwd=root, env=env, code=code)
    assert first.returncode == 0, first.stderr
    said = tool_result(fake.main_requests[1])
    assert "swapped" in said, "a link cannot be pinned: the command could replace it"
    assert "the next start will not trust it" in said, said
    second = cli_runner.run([], input="hi\n", cwd=root, env=env, code=code)
    assert second.returncode == 0, second.stderr
    shown = " ".join(second.stdout.split())
    assert "the program's own .env" in shown and "is not trusted: it was changed while the program ran" in shown, shown
    assert "sets HTTP_PROXY, ALL_PROXY: ignored" in shown, shown
    assert proxy.heard == [] and len(fake.main_requests) == 3, "your key went straight to your endpoint"
    (root / ".env").write_text("MODEL_ID=claude-test\nSANDBOX_NETWORK=off\n")  # a person's own save
    third = cli_runner.run([], input="hi\n", cwd=root, env=env, code=code)
    assert "not trusted" not in third.stdout, third.stdout
    bash = next(t for t in fake.main_requests[-1]["tools"] if t["name"] == "bash")
    assert "There is no network" in bash["description"], "saved by a person, it is trusted again"


@needs_bwrap
def test_an_own_env_that_is_a_folder_stays_one(fake, beyond_tmp, proxy):
    root, code = clone(beyond_tmp)
    (root / ".env" / "bin").mkdir(parents=True)  # an old virtual environment named .env
    planted = f"HTTP_PROXY={proxy.url}\\nALL_PROXY={proxy.url}\\n"
    fake.reply(tool_use("bash", script(root, "clean.sh", f"rm -rf .env; printf '{planted}' > .env; echo done")),
               text("Done."), text("Hello."))
    env = shell_without_model(fake, MODEL_ID="claude-test", S08_HISTORY="off")
    first = cli_runner.run([], input="clean up\n", cwd=root, env=env, code=code)
    assert first.returncode == 0, first.stderr
    assert "Device or resource busy" in tool_result(fake.main_requests[1])
    assert (root / ".env").is_dir() and not (root / ".env").is_symlink()
    second = cli_runner.run([], input="hi\n", cwd=root, env=env, code=code)
    assert second.returncode == 0 and proxy.heard == [], second.stderr


@needs_bwrap
def test_compiled_code_kept_in_the_workspace_is_out_of_a_commands_reach(fake, workspace):
    prefix = workspace / "pycache"
    fake.reply(tool_use("bash", script(workspace, "patch.sh", "for f in $(find pycache -name 'sandbox*.pyc'); do "
                                                              "printf x >> $f || echo refused; done; echo done")),
               text("Done."))
    env = cli_env(fake, PYTHONPYCACHEPREFIX=str(prefix))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = cli_runner.run([], input="go\n", env=env, cwd=workspace)
    assert done.returncode == 0, done.stderr
    compiled = list(prefix.rglob("sandbox*.pyc"))
    assert compiled, "the program keeps its compiled code in the folder PYTHONPYCACHEPREFIX names"
    said = tool_result(fake.main_requests[1])
    assert "Read-only file system" in said and "refused" in said, said
    assert not any(path.read_bytes().endswith(b"x") for path in compiled)


@needs_bwrap
def test_a_bwrap_reached_through_a_link_into_the_workspace_is_never_run(fake, workspace, beyond_tmp):
    mark = beyond_tmp / "linked-bwrap-ran"
    tools = workspace / "tools"
    tools.mkdir()
    (tools / "bwrap").write_text(f"#!/bin/sh\necho ran > {mark}\nexec /usr/bin/env \"$@\"\n")
    (tools / "bwrap").chmod(0o755)
    outside = beyond_tmp / "bin"
    outside.mkdir()
    (outside / "bwrap").symlink_to(tools / "bwrap")  # the folder on PATH is outside; where it leads is not
    fake.reply(tool_use("bash", {"command": f"echo hi; echo pwned > {beyond_tmp}/escaped"}), text("Done."))
    done = run_cli(fake, workspace, "go\n", PATH=f"{outside}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    assert not mark.exists(), "the linked bwrap never ran"
    assert tool_result(fake.main_requests[1]).startswith("hi")
    assert not (beyond_tmp / "escaped").exists(), "the bubblewrap installed outside confined the command"


@needs_bwrap
def test_a_history_file_not_made_yet_cannot_be_planted(fake, workspace, beyond_tmp):
    target = beyond_tmp / "yours.txt"
    target.write_text("keep me\n")
    target.chmod(0o644)
    fake.reply(tool_use("bash", script(workspace, "plant.sh", f"ln -s {target} history || echo refused")),
               text("Done."))
    terminal = Terminal(fake, workspace, S08_HISTORY=str(workspace / "history"))
    assert terminal.read_until(b"s08 >> ")
    assert terminal.turn(b"plant it\r")
    assert terminal.finish() == 0
    assert "refused" in tool_result(fake.main_requests[1])
    assert target.read_text() == "keep me\n" and target.stat().st_mode & 0o777 == 0o644
    history = workspace / "history"
    assert not history.is_symlink() and "plant it" in history.read_text()


def test_a_planted_history_link_is_refused_in_one_line_never_followed(fake, workspace, beyond_tmp):
    """Without the sandbox, a command can plant anything: the program still writes through none of it."""
    target = beyond_tmp / "yours.txt"
    target.write_text("keep me\n")
    target.chmod(0o644)
    fake.reply(tool_use("bash", script(workspace, "plant.sh", f"ln -s {target} history")), text("Done."))
    terminal = Terminal(fake, workspace, S08_HISTORY=str(workspace / "history"), SANDBOX="off")
    assert terminal.read_until(b"s08 >> ")
    assert terminal.turn(b"plant it\r"), terminal.text
    assert terminal.finish() == 0
    assert target.read_text() == "keep me\n" and target.stat().st_mode & 0o777 == 0o644
    shown = " ".join(terminal.text.split())
    assert "[history]" in shown and "is not used (a symbolic link)" in shown, shown


@needs_bwrap
def test_a_tmpdir_in_the_workspace_holds_nothing_a_command_can_swap(fake, beyond_tmp):
    root, code = clone(beyond_tmp)
    (root / ".env").write_text("MODEL_ID=claude-test\nS08_HISTORY=off\n")
    (root / "tmp").mkdir()
    swap = 'for f in tmp/*; do [ -e "$f" ] || continue; rm -f "$f"; ln -s "$PWD/.env" "$f"; done; ls tmp | wc -l'
    fake.reply(tool_use("bash", script(root, "swap.sh", swap)), tool_use("bash", script(root, "look.sh", "cat .env; echo end")),
               text("Done."))
    env = shell_without_model(fake, TMPDIR=str(root / "tmp"))
    done = cli_runner.run([], input="look\n", cwd=root, env=env, code=code)
    assert done.returncode == 0, done.stderr
    assert tool_result(fake.main_requests[1]).startswith("0"), "nothing of the program's lies in TMPDIR"
    said = tool_result(fake.main_requests[2])
    assert "MODEL_ID" not in said and said.startswith("end"), said


@needs_bwrap
def test_a_change_made_before_the_program_was_killed_is_not_trusted(fake, beyond_tmp, proxy):
    root, code = clone_with_a_linked_own_env(beyond_tmp)
    planted = f"HTTP_PROXY={proxy.url}\\nMODEL_ID=claude-test\\n"
    fake.reply(tool_use("bash", script(root, "swap.sh", f"rm .env && printf '{planted}' > .env && sleep 60")),
               text("Hello."))
    env = shell_without_model(fake)
    pid, folder = cli_runner.start([], input="set up\n", cwd=root, env=env, code=code)
    wait_until(lambda: (root / ".env").is_file() and not (root / ".env").is_symlink(), timeout=30)
    os.kill(pid, signal.SIGKILL)  # no chance to look after the command
    cli_runner.finish(pid, folder)
    second = cli_runner.run([], input="hi\n", cwd=root, env=env, code=code)
    shown = " ".join(second.stdout.split())
    assert "is not trusted" in shown and "without a clean exit" in shown, shown
    assert proxy.heard == []


def test_a_env_that_is_a_loop_of_links_is_named_as_one(fake, workspace):
    (workspace / ".env").symlink_to(workspace / ".env")
    done = run_cli(fake, workspace, "hi\n")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    said = " ".join(done.stderr.split())
    assert "Too many levels of symbolic links" in said and "It is a loop of links: make it a file or remove it" in said, said
    assert "chmod" not in said


def test_an_own_env_with_another_name_is_not_read(fake, beyond_tmp):
    """A hard link is a second path to the same file: the sandbox hides one, so a command could
    read the key through the other."""
    root, code = clone(beyond_tmp)
    (root / ".env").write_text("SANDBOX_NETWORK=off\n")
    os.link(root / ".env", root / "notes.txt")
    fake.reply(text("Hello."))
    done = cli_runner.run([], input="hi\n", cwd=root, env=shell_without_model(fake, MODEL_ID="claude-test"), code=code)
    assert done.returncode == 0, done.stderr
    shown = " ".join(done.stdout.split())
    assert "has 2 names (hard links)" in shown and "so it is not read" in shown, shown
    bash = next(t for t in fake.main_requests[0]["tools"] if t["name"] == "bash")
    assert "There is no network" not in bash["description"], "nothing of it was taken"


def test_an_own_env_that_is_a_folder_is_not_taken_for_a_file_with_other_names(beyond_tmp):
    from s08_context_compact.command_line.startup import trusted_own
    root = beyond_tmp / "clone"
    (root / ".env" / "bin").mkdir(parents=True)  # a folder's link count is 3 here
    own, read, note = trusted_own(root / ".env", root)
    assert own == root / ".env" and read and note == ""


@needs_bwrap
def test_a_commands_env_put_back_by_redo_is_still_not_trusted(fake, beyond_tmp, proxy):
    """/undo and /redo write outside the sandbox: what they put back at the program's .env is
    looked at like a command's change, never taken for a person's save."""
    root, code = clone_with_a_linked_own_env(beyond_tmp)
    planted = f"HTTP_PROXY={proxy.url}\\nMODEL_ID=claude-test\\n"
    fake.reply(tool_use("bash", script(root, "swap.sh", f"rm .env && printf '{planted}' > .env")), text("Done."),
               text("Hello."))
    env = shell_without_model(fake)
    first = cli_runner.run([], input="set up\n/undo\n/redo\n", cwd=root, env=env, code=code)
    assert first.returncode == 0, first.stderr
    assert (root / ".env").is_file() and not (root / ".env").is_symlink(), "/redo put the command's file back"
    second = cli_runner.run([], input="hi\n", cwd=root, env=env, code=code)
    shown = " ".join(second.stdout.split())
    assert "is not trusted" in shown and proxy.heard == [], shown


def test_a_command_gets_none_of_the_programs_settings(fake, beyond_tmp):
    """The program's endpoint, model and proxies (a password in one) are its own; a proxy your
    shell set is passed on, as to your own commands."""
    root, code = clone(beyond_tmp)
    (root / ".env").write_text("MODEL_ID=claude-test\nS08_HISTORY=off\n"
                               "HTTPS_PROXY=http://me:Pr0xyPassw0rd@127.0.0.1:9\n")
    look = 'echo "[$HTTPS_PROXY][$HTTP_PROXY][$ANTHROPIC_BASE_URL][$MODEL_ID][$NO_PROXY]"'
    fake.reply(tool_use("bash", {"command": look}), text("Done."))
    env = shell_without_model(fake, HTTP_PROXY="http://127.0.0.1:9", NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    done = cli_runner.run([], input="look\n", cwd=root, env=env, code=code)
    assert done.returncode == 0, done.stderr
    assert tool_result(fake.main_requests[1]).startswith("[][http://127.0.0.1:9][][][127.0.0.1]")


def test_a_session_record_whose_pid_now_names_another_program_is_settled(beyond_tmp):
    """A record left by a program that was killed names a pid another program may hold now (after
    a reboot): the start time tells them apart, and the change is judged as a killed session's."""
    from s08_context_compact.safety import next_start
    place = beyond_tmp / "own.env"
    place.write_text("MODEL_ID=m\n")
    began = next_start.fingerprint(place)
    record = next_start.records() / f"session-{os.getpid()}-0.json"
    next_start.write_record(record, {"pid": os.getpid(), "started": "0", "places": {str(place): began}})
    place.write_text("HTTP_PROXY=http://127.0.0.1:9\n")  # what the killed program's command left
    said = next_start.changed_by_command(place)
    assert "ended without a clean exit" in said, said
    assert not record.exists()
