"""bash in bubblewrap: what a command (and any script it runs) can no longer reach, what
ordinary work still does, and what happens where there is no bubblewrap."""

import os
import socket
import subprocess

import pytest
from s08_context_compact.safety import sandbox as sandbox_module
from conftest import context_breakdown, processes_with, run_cli, wait_until
from s08_context_compact.offline.fake_anthropic import text, tool_use, tool_uses

FOUND = sandbox_module.find_sandbox()
needs_bwrap = pytest.mark.skipif(not FOUND.on, reason=f"no sandbox here: {FOUND.why_not} (.ci/run installs "
                                                      "bubblewrap where it can: apt install bubblewrap)")

HOSTILE_PY = """\
import os, subprocess
home = os.environ["HOME"]
def attempt(what, action):
    try:
        print(what, "->", action())
    except OSError as err:
        print(what, "-> refused:", err)
attempt("delete", lambda: os.remove({outside!r}))
attempt("home", lambda: open(os.path.join(home, "pwned.txt"), "w").write("pwned"))
attempt("ssh", lambda: open(os.path.join(home, ".ssh", "id_rsa")).read())
attempt("env", lambda: open({own_env!r}).read())
attempt("log", lambda: open({log!r}, "a").write("forged\\n"))
attempt("move", lambda: __import__("shutil").move(".transcripts", "old-transcripts"))
subprocess.Popen(["setsid", "sleep", "60.{marker}"], start_new_session=True)
print("daemon started")
"""
HOSTILE_SH = """\
rm -f {outside}
echo pwned > "$HOME/pwned.txt"
cat "$HOME/.ssh/id_rsa"
cat {own_env}
echo forged >> {log}
mv .transcripts old-transcripts
(setsid sleep 61.{marker} &)
echo done
"""


@pytest.fixture
def hostile(workspace, beyond_tmp, marker, monkeypatch):
    """A home with a private key, the program's own folder with its .env, a file outside the
    workspace, a session log: all out of the workspace's reach but the log, which is inside."""
    home, program, ws = beyond_tmp / "home", beyond_tmp / "program", workspace
    for folder in (home / ".ssh", program, ws / ".transcripts"):
        folder.mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("-----BEGIN PRIVATE KEY----- SSH-KEY-BODY\n")
    (program / ".env").write_text("ANTHROPIC_API_KEY=sk-ant-PROGRAM-OWN-KEY-0123456789\n")
    (beyond_tmp / "outside.txt").write_text("keep me\n")
    log = ws / ".transcripts" / "session-20261125-000000-abcdef12.jsonl"
    log.write_text('{"role": "user"}\n')
    monkeypatch.setenv("HOME", str(home))
    places = {"outside": str(beyond_tmp / "outside.txt"), "own_env": str(program / ".env"), "log": str(log),
              "marker": marker}
    (ws / "x.py").write_text(HOSTILE_PY.format(**places))
    (ws / "x.sh").write_text(HOSTILE_SH.format(**places))
    return ws, sandbox_module.find_sandbox(own_env=program / ".env")


@needs_bwrap
@pytest.mark.parametrize("command", ["python3 x.py", "sh x.sh"])
def test_a_script_the_command_runs_reaches_nothing_past_the_workspace(s08, make_agent, fake, hostile, marker,
                                                                      beyond_tmp, command):
    ws, confined = hostile
    agent = make_agent(sandbox=confined, confirm=lambda question: pytest.fail(f"asked: {question}"))
    fake.reply(tool_use("bash", {"command": command}), text("Done."))
    assert s08.take_turn(agent, [], "build it")
    said = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert (beyond_tmp / "outside.txt").read_text() == "keep me\n"
    assert not (beyond_tmp / "home" / "pwned.txt").exists()
    # neither moved (a copy may be made: the workspace is writable) nor changed
    assert (ws / ".transcripts" / "session-20261125-000000-abcdef12.jsonl").read_text() == '{"role": "user"}\n'
    assert "SSH-KEY-BODY" not in said and "PROGRAM-OWN-KEY" not in said
    assert "Read-only file system" in said and "read-only outside the workspace" in said, said
    assert "is hidden from commands (sandbox)" in said or "are hidden from commands (sandbox)" in said, said
    wait_until(lambda: not processes_with(marker), timeout=5)  # the daemon ended with the command's namespace


@needs_bwrap
def test_ordinary_work_still_works_in_the_sandbox(s08, make_agent, fake, workspace, marker):
    ws = workspace
    (ws / "Makefile").write_text("all:\n\techo made > made.txt\n")
    # /tmp asks (in the sandbox a path there is not what the host shows): the person says yes
    agent = make_agent(sandbox=sandbox_module.find_sandbox(), confirm=lambda question: (True, ""))
    commands = {"python3 -c 'print(6 * 7)'": "42",
                "git init -q . && echo hi > a.txt && git add a.txt && git status --short": "A  a.txt",
                "git -c user.name=t -c user.email=t@t commit -qm first && git log --oneline": "first",
                "make -s && cat made.txt": "made", "python3 -m pip --version": "pip ",
                f"echo scratch > /tmp/s08-{marker} && cat /tmp/s08-{marker}": "scratch",  # /tmp: its own
                "echo written > out.txt && cat out.txt": "written"}
    fake.reply(tool_uses([("bash", {"command": c}) for c in commands]), text("Done."))
    assert s08.take_turn(agent, [], "work")
    results = fake.main_requests[1]["messages"][-1]["content"]
    for result, (command, expected) in zip(results, commands.items()):
        assert expected in result["content"] and not result.get("is_error"), (command, result["content"])
    assert (ws / "out.txt").read_text() == "written\n" and (ws / ".git").is_dir()
    assert not os.path.exists(f"/tmp/s08-{marker}"), "the command's /tmp is private, and thrown away"
    bash = next(t for t in fake.main_requests[0]["tools"] if t["name"] == "bash")
    assert "every process a command starts ends with it" in bash["description"]


@needs_bwrap
def test_the_network_setting_closes_the_network(s08, make_agent, fake, workspace):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('reached')\""
    try:
        for network, reached in ((True, True), (False, False)):
            agent = make_agent(sandbox=sandbox_module.find_sandbox(network=network))
            fake.replies.clear()
            fake.reply(tool_use("bash", {"command": probe}), text("Done."))
            assert s08.take_turn(agent, [], "try the network")
            said = fake.main_requests[-1]["messages"][-1]["content"][0]["content"]
            assert ("reached" in said) == reached, said
            assert ("There is no network." in agent.tools["bash"].description) != network
    finally:
        listener.close()


@needs_bwrap
def test_the_program_says_which_mode_it_runs_in(s08, make_agent, fake):
    agent = make_agent(sandbox=sandbox_module.find_sandbox(network=False))
    assert "Commands: sandbox bubblewrap: read-only outside the workspace, network off" in \
        context_breakdown(s08, agent, [])
    agent = make_agent(sandbox=sandbox_module.find_sandbox(wanted=False))
    assert "Commands: sandbox off: SANDBOX=off" in context_breakdown(s08, agent, [])


def path_without_bwrap(folder, bwrap: str | None = None) -> str:
    """A PATH with bash and the tools the commands below use, and no bubblewrap (or a broken one)."""
    folder.mkdir()
    for tool in ("bash", "sh", "cat", "ls"):
        (folder / tool).symlink_to(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                                                  text=True).stdout.strip())
    if bwrap is not None:
        (folder / "bwrap").write_text(bwrap)
        (folder / "bwrap").chmod(0o755)
    return str(folder)


@pytest.mark.parametrize("bwrap, said", [
    (None, "[sandbox] off: bwrap is not installed (apt or dnf install bubblewrap); commands run unconfined."),
    ("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n",
     "[sandbox] off: bwrap could not start: bwrap: No permissions to create new namespace; commands run "
     "unconfined.")], ids=["missing", "refused"])
def test_without_a_working_bubblewrap_commands_run_as_before_and_start_up_says_so(fake, beyond_tmp, bwrap, said):
    ws = beyond_tmp / "ws"
    ws.mkdir()
    fake.reply(tool_use("bash", {"command": f"echo pwned > {beyond_tmp}/new.txt"}), text("Done."))
    done = run_cli(fake, ws, "write outside\n", PATH=path_without_bwrap(beyond_tmp / "bin", bwrap), SANDBOX="on")
    assert done.returncode == 0, done.stderr
    assert said in " ".join(done.stdout.split()), done.stdout
    assert done.stdout.count("[sandbox]") == 1
    result = fake.main_requests[1]["messages"][-1]["content"][0]
    assert result.get("is_error") and result["content"].startswith("Permission denied: `echo pwned"), \
        "without the sandbox, a write outside asks as it always did"
    assert not (beyond_tmp / "new.txt").exists()
    bash = next(t for t in fake.main_requests[0]["tools"] if t["name"] == "bash")
    assert "sandbox" not in bash["description"]


def test_sandbox_off_is_a_setting_and_a_wrong_value_is_named(fake, workspace):
    done = run_cli(fake, workspace, "", SANDBOX="maybe")
    assert done.returncode == 2 and "SANDBOX='maybe' must be on or off." in done.stderr
    fake.reply(text("Hello."))
    done = run_cli(fake, workspace, "hi\n", SANDBOX="off")
    assert done.returncode == 0 and "[sandbox]" not in done.stdout, done.stdout
    bash = next(t for t in fake.main_requests[0]["tools"] if t["name"] == "bash")
    assert "sandbox" not in bash["description"]


@needs_bwrap
def test_the_real_program_runs_its_commands_in_the_sandbox(fake, beyond_tmp):
    ws = beyond_tmp / "ws"
    ws.mkdir()
    fake.reply(tool_use("bash", {"command": f"echo pwned > {beyond_tmp}/new.txt; echo $$"}), text("Done."))
    done = run_cli(fake, ws, "write outside\n", SANDBOX="on")  # the default, whatever runs the suite
    assert done.returncode == 0 and "[sandbox]" not in done.stdout, done.stdout
    said = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert "read-only outside the workspace" in said and not (beyond_tmp / "new.txt").exists(), said
    assert "\n2\n" in f"\n{said}\n", "the shell is the second process of a PID namespace of its own"
    bash = next(t for t in fake.main_requests[0]["tools"] if t["name"] == "bash")
    assert "Commands run in a sandbox" in bash["description"]


@needs_bwrap
def test_a_subagents_commands_run_in_the_same_sandbox(s08, make_agent, fake, beyond_tmp):
    agent = make_agent(sandbox=sandbox_module.find_sandbox())
    fake.reply(tool_use("task", {"prompt": "write the file", "description": "writer"}),
               tool_use("bash", {"command": f"echo pwned > {beyond_tmp}/new.txt"}, "toolu_sub"),
               text("It could not."), text("Done."))
    assert s08.take_turn(agent, [], "delegate")
    said = next(b["content"] for r in fake.requests for m in r.get("messages", []) if isinstance(m["content"], list)
                for b in m["content"] if b.get("tool_use_id") == "toolu_sub")
    assert "read-only outside the workspace" in said and not (beyond_tmp / "new.txt").exists(), said


@needs_bwrap
def test_no_kernel_setting_and_no_agent_socket_is_within_reach(s08, make_agent, fake, beyond_tmp, monkeypatch):
    runtime = beyond_tmp / "run"
    runtime.mkdir(mode=0o700)
    agent_socket = socket.socket(socket.AF_UNIX)
    agent_socket.bind(str(runtime / "agent.sock"))
    agent_socket.listen()
    agent_socket.setblocking(False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("SSH_AUTH_SOCK", str(runtime / "agent.sock"))
    command = ("v=$(cat /proc/sys/kernel/core_pattern); printf '%s\\n' \"$v\" > /proc/sys/kernel/core_pattern; "
               f"echo \"agent=$SSH_AUTH_SOCK.\"; python3 -c \"import socket; socket.socket(socket.AF_UNIX)"
               f".connect('{runtime / 'agent.sock'}')\" 2>&1 | tail -1")
    agent = make_agent(sandbox=sandbox_module.find_sandbox(), confirm=lambda question: (True, ""))  # a hasty yes
    fake.reply(tool_use("bash", {"command": command}), text("Done."))
    try:
        assert s08.take_turn(agent, [], "look around")
        with pytest.raises(BlockingIOError):
            agent_socket.accept()  # nobody connected
    finally:
        agent_socket.close()
    said = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert "/proc/sys/kernel/core_pattern: Read-only file system" in said and "agent=." in said, said
    assert "FileNotFoundError" in said or "ConnectionRefusedError" in said, said


@pytest.mark.parametrize("command, asks", [
    ("mv data.csv /tmp/", True),               # the sandbox's /tmp takes it, and throws it away with the command
    ("echo x > /proc/2/cwd/data.csv", True),   # in the command's own /proc, pid 2 is its shell, in the workspace
    ("cp -r /tmp/d/. .", True),                # what the command's /tmp holds, the host cannot check
    ("cat /etc/hostname", True),               # reading outside still asks
    ("rm data.csv", True),
    ("echo x > /var/tmp/s08-never.txt", False),  # read-only there: the write fails, no question needed
    ("cp data.csv /usr/local/", False)])
def test_with_the_sandbox_only_a_write_it_refuses_goes_unasked(s08, workspace, command, asks):
    (workspace / "data.csv").write_text("a,1\n")
    decision, reason = s08.check_permission(s08.TOOLS["bash"], {"command": command}, workspace, sandboxed=True)
    assert (decision == "ask") == asks, reason
    assert s08.check_permission(s08.TOOLS["bash"], {"command": command}, workspace)[0] == "ask", "without it, all ask"


def test_a_history_setting_never_hides_a_system_folder(workspace, monkeypatch):
    monkeypatch.setenv("HISTFILE", "/usr")
    assert "/usr" not in sandbox_module.Sandbox(on=True).hidden(str(workspace))


@needs_bwrap
def test_a_folders_env_cannot_turn_the_sandbox_off(fake, beyond_tmp):
    ws = beyond_tmp / "ws"
    ws.mkdir()
    (ws / ".env").write_text("SANDBOX=off\nHISTFILE=/usr\n")
    fake.reply(tool_use("bash", {"command": f"echo pwned > {beyond_tmp}/new.txt"}), text("Done."))
    done = run_cli(fake, ws, "write outside\n", SANDBOX="", HISTFILE="")
    assert done.returncode == 0, done.stderr
    assert "sets SANDBOX, HISTFILE: ignored" in \
        " ".join(done.stdout.split()), done.stdout
    said = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert "read-only outside the workspace" in said and not (beyond_tmp / "new.txt").exists(), said


def test_a_runtime_folder_setting_never_hides_a_system_folder(workspace, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/usr")
    assert "/usr" not in sandbox_module.Sandbox(on=True).hidden(str(workspace))


def test_credentials_a_setting_moved_are_hidden_where_they_are_but_never_outside_home(beyond_tmp, monkeypatch):
    home = beyond_tmp / "home"
    for folder in ("keys/gnupg", "k8s", "cfg/gh", "cargo"):
        (home / folder).mkdir(parents=True)
    for file in ("k8s/a.yaml", "k8s/b.yaml", "cfg/gh/hosts.yml", "cargo/credentials.toml", ".pgpass"):
        (home / file).write_text("token: ghp_secret\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GNUPGHOME", str(home / "keys" / "gnupg"))
    monkeypatch.setenv("KUBECONFIG", f"{home}/k8s/a.yaml:{home}/k8s/b.yaml")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "cfg"))
    monkeypatch.setenv("CARGO_HOME", str(home / "cargo"))
    monkeypatch.setenv("DOCKER_CONFIG", "/usr")  # a system folder: never hidden
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(home))  # all of home: never hidden either
    hidden = sandbox_module.Sandbox(on=True).hidden(str(beyond_tmp / "ws"))
    assert {str(home / p) for p in ("keys/gnupg", "k8s/a.yaml", "k8s/b.yaml", "cfg/gh", "cargo/credentials.toml",
                                    ".pgpass")} <= set(hidden), hidden
    assert "/usr" not in hidden and str(home) not in hidden


@needs_bwrap
def test_a_credential_setting_inside_a_hidden_folder_keeps_the_sandbox_on(beyond_tmp, monkeypatch):
    """KUBECONFIG=~/.kube/config names a file inside a folder already hidden, and a runtime
    folder may lie inside another hidden place: bubblewrap must still start, and hide both."""
    home, ws = beyond_tmp / "home", beyond_tmp / "ws"
    for folder in (".kube", ".aws", ".docker/run", "ws"):
        (home / folder).mkdir(parents=True, exist_ok=True)
    ws.mkdir()
    (home / ".docker" / "run").chmod(0o700)
    (home / ".kube" / "config").write_text("token: KUBE-SECRET\n")
    (home / ".aws" / "credentials").write_text("aws_secret_access_key = AWS-SECRET\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KUBECONFIG", str(home / ".kube" / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / ".aws" / "credentials"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(home / ".docker" / "run"))
    confined = sandbox_module.find_sandbox()
    assert confined.on, confined.why_not
    start = confined.start("cat ~/.kube/config ~/.aws/credentials; echo read", ws, dict(os.environ))
    done = subprocess.run(start.argv, env=start.env, pass_fds=start.fds, capture_output=True, text=True, timeout=30)
    assert done.stdout == "read\n" and "SECRET" not in done.stdout + done.stderr, done


@needs_bwrap
def test_started_in_the_home_folder_the_program_says_commands_reach_all_of_it(fake, beyond_tmp):
    home = beyond_tmp / "home"
    (home / "project").mkdir(parents=True)
    in_home = run_cli(fake, home, "", HOME=str(home), SANDBOX="")  # on, even when the suite runs with it off
    in_project = run_cli(fake, home / "project", "", HOME=str(home), SANDBOX="")
    assert in_home.returncode == 0 and in_project.returncode == 0, in_home.stderr + in_project.stderr
    said = " ".join(in_home.stdout.split())
    assert f"[sandbox] the working folder {home} holds your home folder: commands may change anything" in said, said
    assert "holds your home folder" not in in_project.stdout
