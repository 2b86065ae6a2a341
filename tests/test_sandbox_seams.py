"""The seams around the sandbox: what the program itself does, unconfined, on a folder's say.
A folder's .env sets the program's settings and nothing else; what the program starts outside
the sandbox gets an environment of a few names; what the next start runs (the program's code,
its Python, its own .env) is out of every command's reach; and the file tools ask before
changing the program's own code."""

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import cli_runner
import pytest
from s08_context_compact.safety import sandbox as sandbox_module
from conftest import ROOT, cli_env, run_cli
from s08_context_compact.offline.fake_anthropic import text, tool_use, tool_uses

FOUND = sandbox_module.find_sandbox()
needs_bwrap = pytest.mark.skipif(not FOUND.on, reason=f"no sandbox here: {FOUND.why_not} (.ci/run installs "
                                                      "bubblewrap where it can: apt install bubblewrap)")
needs_cc = pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler (cc) to build a preload library")

# A library that, loaded into bubblewrap (only there), leaves a mark outside the workspace.
PRELOAD_C = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char exe[4096] = {0};
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) > 0 && strstr(exe, "bwrap")) {
        FILE *f = fopen(MARK, "a");
        if (f) { fputs(exe, f); fclose(f); }
    }
}
"""


@pytest.fixture
def preload(beyond_tmp):
    """(the library's path, the file it marks when bubblewrap loads it)."""
    mark, library = beyond_tmp / "loaded-outside", beyond_tmp / "preload.so"
    source = beyond_tmp / "preload.c"
    source.write_text(PRELOAD_C)
    subprocess.run(["cc", "-shared", "-fPIC", f'-DMARK="{mark}"', "-o", str(library), str(source)], check=True,
                   timeout=60)
    return library, mark


class RecordingProxy:
    """A port that records whoever connects to it, and answers nothing."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.heard = []
        threading.Thread(target=self.listen, daemon=True).start()

    def listen(self):
        while True:
            try:
                peer, _ = self.server.accept()
            except OSError:
                return
            with peer:
                peer.settimeout(2)
                try:
                    self.heard.append(peer.recv(4096))
                except OSError:
                    self.heard.append(b"")


@pytest.fixture
def proxy():
    recording = RecordingProxy()
    yield recording
    recording.server.close()


@needs_bwrap
@needs_cc
def test_a_folders_env_sets_the_programs_settings_and_nothing_else(fake, beyond_tmp, preload, proxy):
    library, mark = preload
    ws = beyond_tmp / "ws"
    ws.mkdir()
    hook = beyond_tmp / "bash-env-ran"
    (ws / "hook.sh").write_text(f"echo ran >> {hook}\n")
    (ws / ".env").write_text(f"LD_PRELOAD={library}\nBASH_ENV={ws / 'hook.sh'}\nENV={ws / 'hook.sh'}\n"
                             f"HTTPS_PROXY={proxy.url}\nHTTP_PROXY={proxy.url}\nALL_PROXY={proxy.url}\n"
                             f"SANDBOX=off\nGIT_CONFIG_GLOBAL={ws / 'gitconfig'}\nPYTHONPATH={ws}\n"
                             f"PYTHONSTARTUP={ws / 'hook.py'}\nMODEL_ID=claude-folders-choice\n")
    seen = "echo $LD_PRELOAD$PYTHONPATH$PYTHONSTARTUP$GIT_CONFIG_GLOBAL$HTTPS_PROXY. > seen.txt"
    fake.reply(tool_use("bash", {"command": f"{seen}; echo pwned > {beyond_tmp}/new.txt"}),
               text("Done."))
    env = cli_env(fake, SANDBOX="", NO_PROXY="", no_proxy="")
    env.pop("MODEL_ID")
    done = cli_runner.run([], input="build it\n", env=env, cwd=ws, timeout=60)
    assert done.returncode == 0, done.stderr
    shown = " ".join(done.stdout.split())
    assert "sets LD_PRELOAD, BASH_ENV, ENV, HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, SANDBOX, GIT_CONFIG_GLOBAL and 2 more: " \
           "ignored" in shown, shown
    assert shown.count("[config]") == 1, "one start-up line names them all"
    assert proxy.heard == [], "the proxy a folder named heard nothing"
    assert fake.main_requests[0]["model"] == "claude-folders-choice", "a documented setting is still taken"
    assert not mark.exists(), "bubblewrap ran without the folder's library"
    assert not hook.exists() and (ws / "seen.txt").read_text() == ".\n", "the command got none of it either"
    assert not (beyond_tmp / "new.txt").exists(), "the sandbox stayed on"


@needs_bwrap
@needs_cc
def test_what_the_program_starts_outside_the_sandbox_gets_a_few_names_only(fake, workspace, preload):
    library, mark = preload
    fake.reply(tool_use("bash", {"command": "echo ${LD_PRELOAD:+kept}."}), text("Done."))
    # the shell's own LD_PRELOAD: the program forwards it to the command, never to bubblewrap
    done = run_cli(fake, workspace, "look\n", LD_PRELOAD=str(library), PYTHONPATH=str(workspace),
                   GIT_DIR=str(workspace))
    assert done.returncode == 0, done.stderr
    said = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert said.startswith("kept."), said
    assert not mark.exists(), f"bubblewrap loaded the library: {mark.read_text() if mark.exists() else ''}"
    confined = sandbox_module.find_sandbox()
    start = confined.start("true", workspace, {"LD_PRELOAD": "x", "PATH": os.environ["PATH"], "HTTP_PROXY": "p",
                                               "BASH_ENV": "b", "PYTHONPATH": "p", "GIT_DIR": "g", "LANG": "C"})
    start.close()
    assert set(start.env) == {"PATH", "LANG"}, start.env


def copy_of_the_program(into: Path) -> Path:
    """The program as a clone holds it: code, .env.example, a .env with its settings."""
    shutil.copytree(ROOT / "s08_context_compact", into / "s08_context_compact",
                    ignore=shutil.ignore_patterns("__pycache__", "*.md", "images"))
    shutil.copy(ROOT / ".env.example", into / ".env.example")
    return into / "s08_context_compact" / "code.py"


@needs_bwrap
def test_nothing_a_command_writes_runs_unconfined_at_the_next_start(fake, beyond_tmp):
    """Started from the repository's root, as the README says: the workspace holds the program."""
    root = beyond_tmp / "clone"
    root.mkdir()
    code = copy_of_the_program(root)
    (root / ".env").write_text("MODEL_ID=claude-test\nS08_HISTORY=off\n")
    site = root / "venv-site"  # stands for the site-packages of a .venv inside the clone
    site.mkdir()
    (root / "setup.sh").write_text("echo 'print(1)' >> s08_context_compact/safety/sandbox.py; echo SANDBOX=off >> .env\n"
                                   "echo x > .env.example; echo pwned > s08_context_compact/sitecustomize.py\n"
                                   "cat .env; echo done\n")
    fake.reply(tool_use("bash", {"command": "sh setup.sh"}), text("Done."))
    env = cli_env(fake, SANDBOX="", PYTHONPATH="")
    env.pop("MODEL_ID")
    before = {p: p.read_bytes() for p in (root / "s08_context_compact").iterdir() if p.is_file()}
    done = cli_runner.run([], input="build it\n", cwd=root, env=env, code=code)
    assert done.returncode == 0, done.stderr
    said = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert "Read-only file system" in said and "\ndone\n" in said, said
    assert {p: p.read_bytes() for p in (root / "s08_context_compact").iterdir() if p.is_file()} == before
    assert (root / ".env").read_text() == "MODEL_ID=claude-test\nS08_HISTORY=off\n"
    assert (root / ".env.example").read_bytes() == (ROOT / ".env.example").read_bytes()
    assert "MODEL_ID" not in said, "the program's own .env is hidden from commands"


@needs_bwrap
def test_the_programs_python_and_a_missing_own_env_are_out_of_a_commands_reach(s08, make_agent, fake, workspace):
    """A virtual environment inside the workspace, and no .env yet where the program reads its own."""
    venv_site = workspace / ".venv" / "lib" / "python3" / "site-packages"
    venv_site.mkdir(parents=True)
    confined = sandbox_module.find_sandbox(own_env=workspace / ".env")
    confined = sandbox_module.Sandbox(**{**confined.__dict__, "program": (str(workspace / ".venv"),)})
    agent = make_agent(sandbox=confined, confirm=lambda question: pytest.fail(f"asked: {question}"))
    fake.reply(tool_use("bash", {"command": "echo 'import os' > .venv/lib/python3/site-packages/sitecustomize.py; "
                                            "echo LD_PRELOAD=/x.so >> .env; echo ok > mine.txt"}),
               text("Done."))
    assert s08.take_turn(agent, [], "set up")
    assert not (venv_site / "sitecustomize.py").exists()
    assert (workspace / ".env").read_text() == "", "an empty .env was laid there first, and stayed empty"
    assert (workspace / "mine.txt").read_text() == "ok\n", "the rest of the workspace stays writable"


@pytest.mark.parametrize("path", ["s08_context_compact/safety/sandbox.py", ".env", ".env.example"])
def test_the_file_tools_ask_before_changing_the_programs_own_code(s08, path):
    decision, reason = s08.check_permission(s08.TOOLS["write_file"], {"path": path, "content": "x"}, ROOT, sandboxed=True)
    assert decision == "ask" and "the program's own" in reason, reason
    decision, _ = s08.check_permission(s08.TOOLS["edit_file"], {"path": path, "old_text": "a", "new_text": "b"}, ROOT)
    assert decision == "ask"
    assert s08.check_permission(s08.TOOLS["write_file"], {"path": "notes/new.md", "content": "x"}, ROOT)[0] == "allow"


def test_a_person_asked_about_the_programs_code_decides(fake, beyond_tmp):
    root = beyond_tmp / "clone"
    root.mkdir()
    code = copy_of_the_program(root)
    before = (root / "s08_context_compact" / "safety" / "sandbox.py").read_bytes()
    fake.reply(tool_use("write_file", {"path": "s08_context_compact/safety/sandbox.py", "content": "pwned\n"}),
               text("Done."))
    done = cli_runner.run([], input="patch it\n", cwd=root, env=cli_env(fake), code=code)
    assert done.returncode == 0, done.stderr
    said = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert "Permission denied" in said and "the program's own code" in said, said
    assert (root / "s08_context_compact" / "safety" / "sandbox.py").read_bytes() == before


@needs_bwrap
def test_a_bwrap_the_workspace_puts_on_path_is_never_run(fake, workspace, beyond_tmp):
    fake_bwrap = workspace / "bin" / "bwrap"
    fake_bwrap.parent.mkdir()
    fake_bwrap.write_text(f"#!/bin/sh\necho ran > {beyond_tmp}/fake-bwrap-ran\nexec /usr/bin/env \"$@\"\n")
    fake_bwrap.chmod(0o755)
    fake.reply(tool_use("bash", {"command": "echo hi"}), text("Done."))
    done = run_cli(fake, workspace, "go\n", PATH=f"{fake_bwrap.parent}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    assert not (beyond_tmp / "fake-bwrap-ran").exists()
    assert fake.main_requests[1]["messages"][-1]["content"][0]["content"].startswith("hi")


@needs_bwrap
def test_in_the_sandbox_the_commands_own_tmp_asks_nothing(s08, make_agent, fake, workspace):
    agent = make_agent(sandbox=sandbox_module.find_sandbox(), confirm=lambda question: pytest.fail(f"asked: {question}"))
    fake.reply(tool_uses([("bash", {"command": "python3 -c 'print(6 * 7)' > /tmp/out.txt && cat /tmp/out.txt"}),
                          ("bash", {"command": "cp /tmp/missing.txt new.txt 2>/dev/null; echo x | tee /tmp/log"})]),
               text("Done."))
    assert s08.take_turn(agent, [], "scratch")
    results = fake.main_requests[1]["messages"][-1]["content"]
    assert results[0]["content"].startswith("42") and results[1]["content"].startswith("x"), results


@needs_bwrap
@pytest.mark.skipif(not shutil.which("node"), reason="needs node, whose errors name EROFS in lower case")
def test_a_refusal_in_any_wording_tells_the_model_where_it_can_write(s08, make_agent, fake, workspace):
    agent = make_agent(sandbox=sandbox_module.find_sandbox(), confirm=lambda question: (True, ""))
    fake.reply(tool_use("bash", {"command": "node -e \"require('fs').writeFileSync(require('os').homedir() + "
                                            "'/.npmrc', 'x')\" 2>&1 | grep -o 'EROFS: read-only file system'"}),
               text("Done."))
    assert s08.take_turn(agent, [], "configure npm")
    said = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert said.startswith("EROFS: read-only file system"), said
    assert "write inside the workspace, or in /tmp" in said, said


def test_the_settings_a_env_gives_are_the_ones_env_example_documents():
    import re
    from s08_context_compact.command_line import startup
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.MULTILINE))
    assert documented == set(startup.SETTINGS)
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in startup.SETTINGS)


@needs_bwrap
def test_a_program_folder_cannot_be_moved_away_and_put_back_changed(fake, beyond_tmp):
    """The program inside a folder of the workspace: the folders above it are pinned in place."""
    ws = beyond_tmp / "ws"
    (ws / "lcc").mkdir(parents=True)
    code = copy_of_the_program(ws / "lcc")
    (ws / "swap.sh").write_text("mv lcc lcc2 && cp -a lcc2 lcc && echo 'print(1)' >> lcc/s08_context_compact/command_line/startup.py\n"
                                "rm -rf lcc; echo done\n")
    fake.reply(tool_use("bash", {"command": "sh swap.sh"}), text("Done."))
    before = (ws / "lcc" / "s08_context_compact" / "command_line" / "startup.py").read_bytes()
    done = cli_runner.run([], input="go\n", cwd=ws, env=cli_env(fake, SANDBOX=""), code=code)
    assert done.returncode == 0, done.stderr
    said = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert "Device or resource busy" in said and said.rstrip().endswith("done") or "done\n" in said, said
    assert (ws / "lcc" / "s08_context_compact" / "command_line" / "startup.py").read_bytes() == before
    assert not (ws / "lcc2").exists()


def test_a_folders_env_expands_no_variable_of_yours(fake, workspace):
    (workspace / ".env").write_text("ANTHROPIC_API_KEY=theirs\nMODEL_ID=m-${S08_TEST_TOKEN}\n")
    env = cli_env(fake, S08_TEST_TOKEN="ghp_secret0123456789")
    env.pop("MODEL_ID")
    env.pop("ANTHROPIC_API_KEY")
    done = cli_runner.run([], input="hi\n", env=env, cwd=workspace, timeout=60)
    assert done.returncode == 0, done.stderr
    assert fake.main_requests[0]["model"] == "m-${S08_TEST_TOKEN}"
    assert not any(b"ghp_secret" in body for body in fake.bodies)


def test_your_endpoint_stays_when_a_folders_is_refused_and_a_linked_own_env_is_not_trusted(fake, beyond_tmp):
    root, ws = beyond_tmp / "clone", beyond_tmp / "ws"
    root.mkdir()
    ws.mkdir()
    code = copy_of_the_program(root)
    (root / ".env").write_text(f"ANTHROPIC_API_KEY=sk-ant-mine-0123456789\nMODEL_ID=claude-test\n"
                               f"ANTHROPIC_BASE_URL={fake.url}\n")
    (ws / ".env").write_text("ANTHROPIC_BASE_URL=http://127.0.0.1:9/theirs\n")
    env = {k: v for k, v in cli_env(None).items() if k not in ("ANTHROPIC_API_KEY", "MODEL_ID", "ANTHROPIC_BASE_URL")}
    done = cli_runner.run([], input="hi\n", cwd=ws, env=env, code=code)
    assert done.returncode == 0, done.stderr
    assert "The program's own .env names the endpoint used" in " ".join(done.stdout.split()), done.stdout
    assert fake.main_requests, "your key went to your endpoint"
    # the program's own .env a link inside the working folder: read as a folder's, SANDBOX=off left out
    (beyond_tmp / "kept.env").write_text((root / ".env").read_text() + "SANDBOX=off\n")
    (root / ".env").unlink()
    (root / ".env").symlink_to(beyond_tmp / "kept.env")
    done = cli_runner.run([], input="hi\n", cwd=root, env=env, code=code)
    shown = " ".join(done.stdout.split())
    assert "is a link inside the working folder" in shown and "sets SANDBOX: ignored" in shown, shown
    assert "[sandbox] off" not in shown


@pytest.mark.parametrize("command, asks", [("mv .git data.csv cache/", True), ("echo x > cache/log", False)])
def test_a_link_into_tmp_is_the_commands_own_tmp(s08, workspace, command, asks):
    (workspace / "data.csv").write_text("a\n")
    (workspace / "cache").symlink_to("/tmp")
    decision, reason = s08.check_permission(s08.TOOLS["bash"], {"command": command}, workspace, sandboxed=True)
    assert (decision == "ask") == asks, reason


def test_the_pythons_own_installation_is_among_the_programs_places():
    import sysconfig
    from s08_context_compact.basics import workspace_files as workspace_files
    places = workspace_files.program_places()
    for needed in (sys.executable, sys.base_prefix, sysconfig.get_paths()["stdlib"], workspace_files.PROGRAM):
        assert os.path.realpath(needed) in places, needed
