"""/undo keeps its promise however a turn ended: its end is recorded after an API error,
Ctrl-C (in a subagent too) or the step limit; what was recorded before a change is never
dropped because a later record failed; /undo and /redo say truthfully what they did and
could not do; a store that cannot keep copies is said at start; and a tree nested
deeper than Python's recursion limit is walked, what could not be listed said."""

import os
from pathlib import Path

import pytest

import cli_runner
from conftest import cli_env, run_cli
from s08_context_compact.command_line import handle_command, take_line
from s08_context_compact.offline.fake_anthropic import error, text, tool_use, tool_uses
from s08_context_compact.safety import Undo


def interrupted(question):
    raise KeyboardInterrupt  # Ctrl-C at the question


WRITE = ("write_file", {"path": "a.txt", "content": "made by the turn\n"})
ASKS = ("bash", {"command": "rm gone.txt"})  # a delete asks first

ENDINGS = {  # how a turn ends: (the model's replies, the agent's settings)
    "an API error": ([tool_use(*WRITE), error(400, "invalid_request_error", "bad request")], {}),
    "Ctrl-C": ([tool_uses([WRITE, ASKS])], {"confirm": interrupted}),
    "the step limit": ([tool_use(*WRITE)], {"max_steps": 1}),
    "Ctrl-C in a subagent": ([tool_use("task", {"prompt": "make a.txt"}), tool_uses([WRITE, ASKS])],
                             {"confirm": interrupted}),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_undo_after_a_turn_cut_short_leaves_what_you_changed_since(s08, make_agent, fake, workspace, ending):
    (workspace / "b.txt").write_text("b as it was\n")
    (workspace / "gone.txt").write_text("still here\n")
    replies, settings = ENDINGS[ending]
    agent = make_agent(**settings)
    fake.reply(*replies)
    messages = []
    take_line(agent, messages, "make a.txt", s08.LESSON)
    assert (workspace / "a.txt").exists(), agent.out.text
    (workspace / "b.txt").write_text("my own edit, after the turn\n")
    handle_command(agent, messages, "/undo", s08.LESSON)
    said = agent.out.text
    assert not (workspace / "a.txt").exists(), said
    assert (workspace / "b.txt").read_text() == "my own edit, after the turn\n", said
    assert "1 put back as they were (a.txt)" in said


def test_a_turn_past_the_file_limit_still_gets_back_the_file_it_deleted(s08, make_agent, fake, workspace):
    (workspace / "keep.txt").write_text("precious\n")
    agent = make_agent(undo=Undo(max_files=20), confirm=lambda question: (True, ""))
    fake.reply(tool_use("bash", {"command": "rm keep.txt && mkdir many && touch many/f{1..30}"}), text("Done."))
    messages = []
    assert s08.take_turn(agent, messages, "make many files")
    assert not (workspace / "keep.txt").exists() and len(list((workspace / "many").iterdir())) == 30
    handle_command(agent, messages, "/undo", s08.LESSON)
    said = agent.out.text
    assert (workspace / "keep.txt").read_text() == "precious\n", said
    assert "1 put back as they were (keep.txt)" in said
    assert "the files it created are left: at its end the workspace had over 20 files" in said
    assert "over 20 files now: /undo can put back what this request changed or deleted" in said, \
        "said when the turn ended, too"


def test_a_redo_that_changes_nothing_keeps_the_turn_to_redo(s08, make_agent, fake, workspace):
    (workspace / "a.txt").write_text("v1\n")
    agent = make_agent()
    fake.reply(tool_use("write_file", {"path": "a.txt", "content": "v2\n"}), text("Done."))
    messages = []
    assert s08.take_turn(agent, messages, "change a.txt")
    handle_command(agent, messages, "/undo", s08.LESSON)
    assert (workspace / "a.txt").read_text() == "v1\n"
    (workspace / "a.txt").write_text("mine\n")
    before = len(agent.out)
    handle_command(agent, messages, "/redo", s08.LESSON)
    said = "".join(agent.out[before:])
    assert (workspace / "a.txt").read_text() == "mine\n", said
    assert said.startswith("Nothing was put back") and "/redo will try this request again" in said
    assert "the user ran /redo" not in str(messages), "the model is told only of files changed"
    (workspace / "a.txt").write_text("v1\n")
    handle_command(agent, messages, "/redo", s08.LESSON)
    assert (workspace / "a.txt").read_text() == "v2\n", agent.out.text


def test_a_store_that_cannot_be_made_is_said_at_start_and_by_undo(fake, workspace, tmp_path):
    (tmp_path / "not-a-folder").write_text("")  # as a folder not yours would fail it
    (workspace / "keep.txt").write_text("precious\n")
    fake.reply(tool_use("write_file", {"path": "keep.txt", "content": "changed\n"}), text("Done."))
    done = run_cli(fake, workspace, "change keep.txt\n/undo\n", XDG_STATE_HOME=tmp_path / "not-a-folder")
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    warned = said.find("[undo] cannot keep copies of your files in")
    assert -1 < warned < said.find("write_file"), "said at start, before the request's first change"
    assert "set XDG_STATE_HOME to a folder that is" in said
    assert 'Nothing to undo: your request "change keep.txt" could not be recorded (no copy can be kept)' in said


def nested(root: Path, name: str, depth: int) -> Path:
    """A chain of folders depth deep under root, made without recursion and without a path
    longer than the system takes (each made from its parent's descriptor); the last one."""
    descriptor = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=descriptor)
        inner = os.open(name, os.O_RDONLY, dir_fd=descriptor)
        os.close(descriptor)
        descriptor = inner
    os.close(descriptor)
    return root.joinpath(*[name] * depth)


def removed(root: Path, name: str, depth: int) -> None:
    """The chain nested() made, and the files in it, taken away deepest first (shutil.rmtree
    recurses before Python 3.12)."""
    descriptors = [os.open(root, os.O_RDONLY)]
    for _ in range(depth):
        descriptors.append(os.open(name, os.O_RDONLY, dir_fd=descriptors[-1]))
    for level, descriptor in reversed(list(enumerate(descriptors))):
        for entry in os.listdir(descriptor) if level else [name]:
            if entry == name and level < depth:
                os.rmdir(name, dir_fd=descriptor)
            else:
                os.unlink(entry, dir_fd=descriptor)
        os.close(descriptor)


@pytest.fixture
def deep(workspace):
    """A folder 1,200 deep in the workspace (past Python's recursion limit) with a file at the bottom."""
    bottom = nested(workspace, "d", 1_200)
    (bottom / "deep.txt").write_text("needle\n")
    yield bottom
    removed(workspace, "d", 1_200)


def test_a_tree_past_the_recursion_limit_is_walked_by_undo_glob_and_the_permission_check(
        s08, make_agent, fake, workspace, deep):
    (workspace / "copy" / "d").mkdir(parents=True)  # cp -r d copy/ goes over it: the check walks d
    agent = make_agent(confirm=lambda question: (True, ""))
    fake.reply(tool_uses([("write_file", {"path": "a.txt", "content": "new\n"}),
                          ("glob", {"pattern": "**/deep.txt"}),
                          ("bash", {"command": "grep -R needle . | wc -l && cp -r d copy/"})]),
               text("Done."))
    messages = []
    assert s08.take_turn(agent, messages, "look deep")
    found = [b for m in fake.main_requests[-1]["messages"] if isinstance(m["content"], list)
             for b in m["content"] if b.get("type") == "tool_result"]
    assert [b.get("is_error") for b in found] == [None] * 3, found
    assert found[1]["content"] == "d/" * 1_200 + "deep.txt", "glob found it"
    handle_command(agent, messages, "/undo", s08.LESSON)
    said = agent.out.text
    assert not (workspace / "a.txt").exists() and (deep / "deep.txt").exists(), said
    assert "RecursionError" not in said and "put back as they were" in said
    assert not (workspace / "copy" / "d" / "d").exists(), "what the turn copied, taken away"


# Root lists any folder, whatever its mode, by two capabilities: run as root, the tests run
# the program without them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so a folder's mode holds.
WITHOUT_OVERRIDE = """import ctypes, runpy, sys
header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # capabilities, version 3, of this process
sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: the first 32, then the next
libc = ctypes.CDLL(None, use_errno=True)
assert libc.capget(header, sets) == 0
sets[0] &= ~0b110
assert libc.capset(header, sets) == 0
sys.argv[0] = {code!r}
runpy.run_path({code!r}, run_name="__main__")
"""


def test_a_folder_undo_could_not_list_is_said_and_left_as_it_is(fake, workspace, tmp_path):
    """A folder whose mode lets no one list it: undo says so, once, and leaves what it holds."""
    (workspace / "locked").mkdir()
    (workspace / "locked" / "inside.txt").write_text("mine\n")
    (workspace / "locked").chmod(0)
    program = tmp_path / "without_override.py"
    program.write_text(WITHOUT_OVERRIDE.format(code=str(cli_runner.CODE)))
    fake.reply(tool_use("write_file", {"path": "a.txt", "content": "new\n"}), text("Done."))
    try:
        done = cli_runner.run([], input="write a.txt\n/undo\n", env=cli_env(fake), cwd=workspace,
                              code=program if os.geteuid() == 0 else None)
    finally:
        (workspace / "locked").chmod(0o755)
    said = done.stdout + done.stderr
    assert said.count("[undo] locked/ could not be listed (Permission denied): its files are not recorded") == 1, said
    assert "1 put back as they were (a.txt)" in said and not (workspace / "a.txt").exists(), said
    assert (workspace / "locked" / "inside.txt").read_text() == "mine\n"
