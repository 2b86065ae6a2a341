"""Shared fixtures: no network but loopback, code.py loaded by path, a fake API, an agent."""

import atexit
import compileall
import faulthandler
import importlib.util
import ipaddress
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import anthropic
import pytest

# The program is imported as the package it is, from the folder above; the lesson's own folder
# is never on sys.path, where code.py would stand in for the standard library's `code`.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cli_runner  # noqa: E402
from s08_context_compact.offline.fake_anthropic import FakeAnthropic  # noqa: E402
from s08_context_compact.basics import discover_skills  # noqa: E402
from s08_context_compact.command_line import Agent, build_system_prompt, handle_command, install_hooks  # noqa: E402
from s08_context_compact.compaction import Settings  # noqa: E402
from s08_context_compact.compaction import summary as summary_layer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CODE = ROOT / "s08_context_compact" / "code.py"


def fresh_copy() -> Path:
    """The program as a fresh clone holds it, with no .env: the one a person made by following
    the README (a key, a model, perhaps a window) must not change what a test of the program
    sees. Its code.py is what the tests run as a command; the repository's is read."""
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path(tempfile.gettempdir())
    folder = Path(tempfile.mkdtemp(prefix="s08-program-", dir=base))
    atexit.register(shutil.rmtree, folder, True)
    shutil.copytree(CODE.parent, folder / CODE.parent.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".env.example", folder / ".env.example")
    # compiled once here: each run would otherwise compile it again (PYTHONDONTWRITEBYTECODE)
    compileall.compile_dir(folder / CODE.parent.name, quiet=1)
    return folder / CODE.parent.name / CODE.name


RUN = fresh_copy()
cli_runner.CODE = RUN  # what `python code.py` runs, in the runner's children too


# ---------------------------------------------------------------- Ctrl-C as a person types it

# A run started in the background (`cmd &`, nohup, some CI runners) inherits SIGINT ignored,
# and passes that on to every program it starts: no Ctrl-C would reach the program under test,
# nor an interrupt the in-process tests raise (_thread.interrupt_main). A handler set here is
# reset to the default in each process started from this one, the workers included.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ---------------------------------------------------------------- no test hangs

TEST_LIMIT_SECONDS = 120  # the slowest test takes a few seconds; one this late waits forever


@pytest.fixture(autouse=True)
def no_hang():
    """A test that waits on an event that never comes (an interrupt lost on a loaded machine, a
    reply held with no release) ends its worker with every thread's traceback, so the run
    fails and says where, rather than hanging."""
    faulthandler.dump_traceback_later(TEST_LIMIT_SECONDS, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# ---------------------------------------------------------------- no network

_real_connect = socket.socket.connect


def _loopback_only(self, address):
    host = address[0] if isinstance(address, tuple) else address
    try:
        allowed = self.family == socket.AF_UNIX or ipaddress.ip_address(host).is_loopback
    except ValueError:
        allowed = host == "localhost"
    if not allowed:
        raise OSError(f"tests may not reach the network ({host})")
    return _real_connect(self, address)


socket.socket.connect = _loopback_only

# The session log's key (log_checks.py) lives outside the workspace: for the tests, in a
# folder of their own, never the home of whoever runs them. Children inherit it.
if not os.environ.get("S08_TEST_STATE"):
    os.environ["S08_TEST_STATE"] = tempfile.mkdtemp(prefix="s08-state-")
    atexit.register(shutil.rmtree, os.environ["S08_TEST_STATE"], True)
os.environ["XDG_STATE_HOME"] = os.environ["S08_TEST_STATE"]


# ---------------------------------------------------------------- the module under test

def load_code():
    return importlib.import_module("s08_context_compact.code")


@pytest.fixture(scope="session")
def s08():
    return load_code()


@pytest.fixture(scope="session")
def sandbox():
    """The sandbox the program under test finds here, as its own start-up does: bubblewrap
    where it is installed and works. `SANDBOX=off python -m pytest` runs the suite without."""
    from s08_context_compact.safety import sandbox as module
    return module.find_sandbox(os.environ.get("SANDBOX", "on").strip().lower() != "off")


@pytest.fixture
def beyond_tmp():
    """A folder outside /tmp, which the sandbox replaces with a private one: what a command
    does to a folder here is what it would do to one in a home or a project elsewhere."""
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path(tempfile.gettempdir())
    folder = Path(tempfile.mkdtemp(prefix="s08-test-", dir=base))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def fake():
    with FakeAnthropic() as server:
        yield server


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


class Printed(list):
    """Collects what the agent prints, as one string per call."""

    def __call__(self, *parts, end="\n", flush=False):
        self.append(" ".join(str(p) for p in parts) + end)

    @property
    def text(self) -> str:
        return "".join(self)


@pytest.fixture
def make_agent(s08, fake, workspace, sandbox):
    """Build an Agent wired to the fake server, as main() would, with printing captured."""
    def build(window=200_000, confirm=None, server=None, idle=None, retry=0.0, **overrides):
        """idle: seconds a stream may be silent (the client's read timeout too); retry: the
        pause before a retry. The agent makes its connection from them once, as main() does."""
        server = server or fake
        client = anthropic.Anthropic(api_key="test", base_url=server.url, max_retries=0)
        if idle is not None:
            client = client.with_options(timeout=anthropic.Timeout(idle, connect=2))
        skills = discover_skills([workspace / "skills", CODE.parent / "skills"])
        # no waiting; and no summary written in the background, whose requests would interleave with
        # the scripted ones at a time no test sets (test_summary_ahead.py turns it on and orders them);
        # the summary of what snip cut is written before the next request goes
        settings = replace(Settings.for_window("claude-test", window), retry_base_seconds=retry,
                           summary_ahead=None, snip_summary_waits=True)
        settings = settings if idle is None else replace(settings, idle_timeout=idle)
        chosen = overrides.get("sandbox", sandbox)
        overrides = {"tools": chosen.tools(s08.TOOLS), "sandbox": chosen, **overrides}
        out = overrides.pop("out", None)
        agent = Agent(client=client, settings=settings,
                          workdir=workspace, system=build_system_prompt(workspace, skills),
                          skills=skills, out=Printed() if out is None else out,
                          confirm=confirm or (lambda q: (False, "no one could confirm it (test)")),
                          **overrides)
        install_hooks(agent, s08.permission_hook)
        return agent
    return build


def replace_with_summary(s08, messages: list, kind: str, summary: str, tail: list, restored: list, *,
                         store, preview_chars: int) -> list:
    """compaction/summary.py's replace_with_summary, the tail previewed as code.py's layers preview it."""
    return summary_layer.replace_with_summary(messages, kind, summary, tail, restored, store=store,
                                              preview_chars=preview_chars)


def use_tool(s08, agent, block: dict, history: list = ()) -> dict:
    """One tool call, run as the loop runs a batch of one (in history): its tool_result."""
    results, interrupted = s08.use_tools(agent, [block], {}, list(history))
    assert not interrupted, "Ctrl-C during the call"
    return results[0]


def context_breakdown(s08, agent, messages: list) -> str:
    """What /context prints for this history (the command itself, through the agent's output)."""
    before = len(agent.out)
    handle_command(agent, messages, "/context", s08.LESSON)
    return "".join(agent.out[before:])


# ---------------------------------------------------------------- running the CLI

def cli_env(fake, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(ANTHROPIC_API_KEY="test", ANTHROPIC_BASE_URL=fake.url if fake else "http://127.0.0.1:9",
               MODEL_ID="claude-test", PYTHONUNBUFFERED="1", S08_HISTORY="off")
    env.pop("CONTEXT_WINDOW", None)
    env.pop("COLUMNS", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_cli(fake, workspace, stdin: str, timeout=60, args=(), **env):
    """`python code.py *args` with piped input, in a process forked with the SDK already imported."""
    return cli_runner.run(list(args), input=stdin, env=cli_env(fake, **env), cwd=workspace, timeout=timeout)


def processes_with(marker: str, exactly: bool = False) -> list:
    """The pids whose command line holds marker (or, exactly, is it: arguments end with NUL)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if (cmdline == marker.encode()) if exactly else marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def marker():
    """A number of seconds no one else sleeps (sleep takes fractions), to find the command's
    processes by; whatever a failed test left running with it is ended afterwards."""
    unique = f"{random.randrange(10**8):08d}"
    yield unique
    for pid in processes_with(unique):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def wait_until(condition, timeout=10) -> None:
    """Wait for something another thread or process does (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


# ---------------------------------------------------------------- invariants

def blocks(message):
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def invariant_problems(messages, request_text=None):
    """Everything wrong with a history, as the real API and this chapter's rules see it."""
    problems = []
    if not messages:
        return ["history is empty"]
    if messages[0]["role"] != "user":
        problems.append("first message is not a user message")
    for i, message in enumerate(messages):
        if i and message["role"] == messages[i - 1]["role"]:
            problems.append(f"messages {i - 1} and {i} have the same role")
        content = blocks(message)
        kinds = [b.get("type") for b in content]
        if "tool_result" in kinds:
            last_result = max(k for k, kind in enumerate(kinds) if kind == "tool_result")
            if any(kind != "tool_result" for kind in kinds[:last_result]):
                problems.append(f"message {i}: a block comes before a tool_result")
        results = [b["tool_use_id"] for b in content if b.get("type") == "tool_result"]
        previous = blocks(messages[i - 1]) if i else []
        offered = [b["id"] for b in previous if b.get("type") == "tool_use"] if i and messages[i - 1]["role"] == "assistant" else []
        if message["role"] == "user" and sorted(results) != sorted(offered):
            problems.append(f"message {i}: results {results} do not answer calls {offered}")
        for b in content:
            if b.get("type") == "text" and not b["text"].strip():
                problems.append(f"message {i}: empty text block")
        json.loads(json.dumps(message))
    if messages[-1]["role"] == "assistant" and any(b.get("type") == "tool_use" for b in blocks(messages[-1])):
        problems.append("last message has unanswered tool calls")
    if request_text is not None:
        texts = [b["text"] for m in messages if m["role"] == "user" for b in blocks(m) if b.get("type") == "text"]
        if request_text not in texts:
            problems.append("the current request is not visible verbatim")
    return problems


def assert_valid(messages, request_text=None):
    problems = invariant_problems(messages, request_text)
    assert not problems, problems


def assert_requests_valid(fake):
    """Nothing the program sent was rejected, and every request alternates roles."""
    assert fake.rejections == [] or all(r.startswith("prompt is too long") for r in fake.rejections), fake.rejections
    for body in fake.valid_requests:
        roles = [m["role"] for m in body["messages"]]
        assert all(a != b for a, b in zip(roles, roles[1:])), roles


def of_what_snip_cut(body: dict) -> bool:
    """A summary request of a part snip cut, written out (compaction/snip_summaries.py), not of
    the history."""
    return "messages snip cut, written out:]" in json.dumps(body["messages"][-1])


def plain(value):
    """A request (or part of one) with the cache_control marks removed, for comparisons."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k not in ("cache_control", "_valid", "_s08", "snipped",
                                                                    "saved_at")}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


# ---------------------------------------------------------------- small builders

def user(words):
    return {"role": "user", "content": [{"type": "text", "text": words}]}


def chat(turns, size, word=None):
    """A history of plain text turns (nothing for the cheap layers to clear)."""
    history = []
    for n in range(turns):
        history += [user(f"question {n} " + (word * size if word else "q" * size)),
                    {"role": "assistant", "content": [
                        {"type": "text", "text": f"answer {n} " + (word * size if word else "a" * size)}]}]
    return history


class LiveCLI:
    """The CLI as a running subprocess: type lines, watch output as it arrives, send signals."""

    def __init__(self, fake, workspace, **env):
        self.proc = subprocess.Popen([sys.executable, str(RUN)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=workspace, env=cli_env(fake, **env))
        self.chunks = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while chunk := os.read(self.proc.stdout.fileno(), 4096):  # raw: streamed text has no newline yet
            self.chunks.append(chunk.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "".join(self.chunks)

    def type(self, text: str) -> None:
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def wait_for(self, condition, timeout=20) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out waiting"
            time.sleep(0.02)

    def wait_at_prompt(self, timeout=20) -> None:
        """Wait until the program is blocked reading its standard input: back at the prompt.
        (Seen in /proc: the system call it sleeps in is read, on file descriptor 0.)"""
        read = {"x86_64": "0", "aarch64": "63"}[platform.machine()]
        def reading() -> bool:
            try:
                call = Path(f"/proc/{self.proc.pid}/syscall").read_text().split()
            except OSError:
                return False
            return call[:2] == [read, "0x0"]
        self.wait_for(reading, timeout)

    def finish(self, last_input: str = "", timeout=30) -> int:
        """Type the last input, close stdin, and return the exit code."""
        self.type(last_input)
        self.proc.stdin.close()
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=5)  # it ends at the end of the output: everything is collected
        return code


class Terminal:
    """The CLI on a pseudo-terminal: type keys, wait for what it shows, never on a fixed sleep.
    It runs in a child of the zygote (cli_runner), with the terminal as its controlling one."""

    def __init__(self, fake, workspace, columns: int = 80, args=(), **env):
        import fcntl
        import struct
        import termios
        self.fd, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        self.pid = cli_runner.start_on_terminal(list(args), tty=os.ttyname(self.slave), env=cli_env(fake, **env),
                                                cwd=workspace)
        self.shown = b""

    def read_until(self, expected: bytes, count: int = 1, seconds: float = 20) -> bool:
        import select
        end = time.monotonic() + seconds
        while self.shown.count(expected) < count and time.monotonic() < end:
            if select.select([self.fd], [], [], 0.05)[0]:
                try:
                    self.shown += os.read(self.fd, 65536)
                except OSError:  # the program has ended
                    break
                if self.slave is not None:  # the program has the terminal open: ours can go, so its end shows
                    os.close(self.slave)
                    self.slave = None
        return self.shown.count(expected) >= count

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def turn(self, keys: bytes) -> bool:
        """Type keys, and wait until the prompt is back once more: the turn they started is over."""
        prompts = self.shown.count(b"s08 >> ")
        self.type(keys)
        return self.read_until(b"s08 >> ", prompts + 1)

    def wait_for_input(self, timeout: float = 20) -> None:
        """Wait until the program sleeps waiting for a key (readline waits in select): a key
        typed sooner, while a question is still being set up, could be seen late."""
        waiting = {"x86_64": {"0", "7", "23", "270", "271"}, "aarch64": {"63", "72", "73"}}[platform.machine()]
        deadline = time.monotonic() + timeout
        while True:
            try:
                call = Path(f"/proc/{self.pid}/syscall").read_text().split()
            except OSError:
                call = []
            if call[:1] and call[0] in waiting:
                return
            assert time.monotonic() < deadline, "timed out waiting for the program to wait for a key"
            time.sleep(0.02)

    def finish(self) -> int:
        """Ctrl-D at the prompt; everything shown is collected; the exit code."""
        self.type(b"\x04")
        self.read_until(b"the end of the output, which never appears")
        code = cli_runner.exit_code(self.pid)
        os.close(self.fd)
        return code

    @property
    def text(self) -> str:
        return self.shown.decode(errors="replace")

    def __del__(self):  # a test that failed half-way: closing the terminal hangs the program up
        for fd in (self.fd, self.slave):
            try:
                os.close(fd)
            except (OSError, TypeError):
                pass


# The longest tests start first, so the workers that take them are not the last to finish:
# with work stealing, a long test dealt out at the end alone decides when the suite ends.
LONGEST_FIRST = ("test_properties.py::test_the_whole_pipeline_keeps_the_invariants",
                 "test_layout.py::test_below_the_command_line_no_call_is_handed_the_agent",
                 "test_benchmark.py::test_the_chapters_measured_figures_match_a_fresh_run",
                 "test_repl.py::test_a_proxy_password_in_the_url_is_never_shown",
                 "test_properties.py::test_each_cheap_layer_keeps_the_invariants",
                 "test_provider_sessions.py::test_a_reading_session_through")


def pytest_collection_modifyitems(items):
    def rank(item):
        where = next((k for k, name in enumerate(LONGEST_FIRST) if name in item.nodeid), None)
        return (0, where) if where is not None else (1, 0)
    items.sort(key=rank)  # stable: every other test keeps its place
