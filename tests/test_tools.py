"""The nine tools and the permission check, called the way the agent loop calls them."""

import json
import time

import pytest
from s08_context_compact.basics import Tool, workspace_path
from s08_context_compact.command_line import handle_command
from s08_context_compact.offline.fake_anthropic import text, tool_use
from s08_context_compact.safety import command_runner as commands  # noqa: E402
from conftest import processes_with, wait_until, use_tool
from s08_context_compact.basics import discover_skills


@pytest.fixture
def agent(make_agent):
    return make_agent()


def call(s08, agent, tool, **args):
    result = use_tool(s08, agent, {"type": "tool_use", "id": "toolu_t", "name": tool, "input": args})
    return result["content"], result.get("is_error", False)


# ---------------------------------------------------------------- bad calls

def test_unknown_tool_is_an_error_the_model_can_act_on(s08, agent):
    out, failed = call(s08, agent, "delete_everything")
    assert failed and "unknown tool 'delete_everything'" in out and "read_file" in out


@pytest.mark.parametrize("args, expected", [
    ({}, "missing required argument(s): path"),
    ({"path": 42}, "argument 'path' must be of type string, got int"),
    ({"path": "a.txt", "offset": True}, "argument 'offset' must be of type integer, got bool"),
])
def test_wrong_arguments_are_reported_not_raised(s08, agent, args, expected):
    out, failed = call(s08, agent, "read_file", **args)
    assert failed and expected in out


def test_input_that_is_not_an_object_is_reported(s08, agent):
    result = use_tool(s08, agent, {"type": "tool_use", "id": "x", "name": "bash", "input": "ls"})
    assert result["is_error"] and "JSON object" in result["content"]


# ---------------------------------------------------------------- bash

def test_bash_reports_exit_code(s08, agent):
    out, failed = call(s08, agent, "bash", command="echo hello; exit 3")
    assert out == "hello\n[exit code 3]" and not failed


def test_bash_timeout_kills_the_whole_process_group(s08, agent, workspace, marker):
    started = time.monotonic()
    out, _ = call(s08, agent, "bash", command=f"(sleep 30.{marker}; echo late > late.txt) & sleep 31.{marker}",
                  timeout=1)
    assert time.monotonic() - started < 10
    assert "timed out after 1s" in out
    wait_until(lambda: not processes_with(marker), timeout=5)  # the background child too, found by its marker


def test_bash_output_kept_in_memory_is_capped(s08, agent):
    out, _ = call(s08, agent, "bash", command="head -c 30000000 /dev/zero | tr '\\0' 'a'; echo THE-END")
    assert len(out) < commands.BASH_OUTPUT_HEAD + commands.BASH_OUTPUT_TAIL + 500
    assert "bytes of output omitted (30,000,008 in all)" in out
    assert out.endswith("THE-END")


# ---------------------------------------------------------------- read_file

def test_read_file_pages_by_line(s08, agent, workspace):
    (workspace / "f.txt").write_text("".join(f"line {n}\n" for n in range(1, 101)))
    out, _ = call(s08, agent, "read_file", path="f.txt", offset=10, limit=3)
    assert out.splitlines() == ["    10\tline 10", "    11\tline 11", "    12\tline 12",
                                "[more lines follow; call read_file with offset=13 to continue]"]


def test_read_file_refuses_binary_files(s08, agent, workspace):
    (workspace / "img.bin").write_bytes(b"\x89PNG\x00\x01\x02" * 100)
    out, failed = call(s08, agent, "read_file", path="img.bin")
    assert failed and "binary file" in out and "xxd" in out


def test_read_file_decodes_invalid_utf8_safely(s08, agent, workspace):
    (workspace / "latin.txt").write_bytes("café".encode("latin-1") + "\n中文\n".encode())
    out, failed = call(s08, agent, "read_file", path="latin.txt")
    assert not failed and "caf\ufffd" in out and "中文" in out


def test_read_file_cuts_very_long_lines(s08, agent, workspace):
    (workspace / "min.js").write_text("x" * 50_000)
    out, _ = call(s08, agent, "read_file", path="min.js")
    assert len(out) < 2_200 and "line cut at 2000 chars" in out


def test_missing_file_suggests_glob(s08, agent):
    out, failed = call(s08, agent, "read_file", path="nope.txt")
    assert failed and "Call glob" in out


# ---------------------------------------------------------------- write_file and edit_file

def test_write_then_edit(s08, agent, workspace):
    call(s08, agent, "write_file", path="src/a.py", content="x = 1\ny = 1\n")
    out, failed = call(s08, agent, "edit_file", path="src/a.py", old_text="x = 1", new_text="x = 2")
    assert not failed and (workspace / "src/a.py").read_text() == "x = 2\ny = 1\n"


def test_edit_says_how_many_times_old_text_was_found(s08, agent, workspace):
    (workspace / "a.py").write_text("v = 1\nv = 1\n")
    out, failed = call(s08, agent, "edit_file", path="a.py", old_text="v = 1", new_text="v = 2")
    assert failed and "found 2 times" in out
    out, failed = call(s08, agent, "edit_file", path="a.py", old_text="w = 1", new_text="v = 2")
    assert failed and "found 0 times" in out
    assert (workspace / "a.py").read_text() == "v = 1\nv = 1\n"


# ---------------------------------------------------------------- glob

def test_glob_is_recursive_and_capped(s08, agent, workspace):
    for n in range(250):
        (workspace / "pkg" / f"d{n % 5}").mkdir(parents=True, exist_ok=True)
        (workspace / "pkg" / f"d{n % 5}" / f"m{n}.py").write_text("")
    out, _ = call(s08, agent, "glob", pattern="**/*.py")
    lines = out.splitlines()
    assert len(lines) == 201 and "showing 200 of 250 matches" in lines[-1]
    assert all(line.startswith("pkg/") for line in lines[:-1])


def test_glob_does_not_follow_a_symlink_out_of_the_workspace(s08, agent, workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("")
    (workspace / "link").symlink_to(outside)
    (workspace / "mine.py").write_text("")
    out, _ = call(s08, agent, "glob", pattern="**/*.py")
    assert out == "mine.py"
    out, failed = call(s08, agent, "glob", pattern="../*")
    assert failed


# ---------------------------------------------------------------- permission

def test_file_tools_are_confined_to_the_workspace(s08, agent, workspace, tmp_path):
    (tmp_path / "secret.txt").write_text("s3cret")
    (workspace / "sneaky").symlink_to(tmp_path / "secret.txt")
    for args in ({"path": "../secret.txt"}, {"path": str(tmp_path / "secret.txt")}, {"path": "sneaky"}):
        out, failed = call(s08, agent, "read_file", **args)
        assert failed and "outside the workspace" in out and "s3cret" not in out
    out, failed = call(s08, agent, "write_file", path="../evil.txt", content="x")
    assert failed and not (tmp_path / "evil.txt").exists()


def test_deny_list_blocks_without_asking(s08, make_agent):
    asked = []
    agent = make_agent(confirm=lambda q: asked.append(q) or (True, ""))
    out, failed = call(s08, agent, "bash", command="sudo rm -rf /")
    assert failed and "deny list" in out and not asked


def test_destructive_command_needs_confirmation(s08, make_agent, workspace):
    (workspace / "keep.txt").write_text("k")
    denied = make_agent()  # the fixture's confirm answers as a pipe does: no one there
    out, failed = call(s08, denied, "bash", command="rm keep.txt")
    assert failed and "no one could confirm" in out and (workspace / "keep.txt").exists()
    allowed = make_agent(confirm=lambda q: (True, ""))
    out, failed = call(s08, allowed, "bash", command="rm keep.txt")
    assert not failed and not (workspace / "keep.txt").exists()


def test_check_permission_is_pure_and_explains(s08, workspace):
    assert s08.check_permission(s08.TOOLS["bash"], {"command": "ls"}, workspace) == ("allow", "")
    assert s08.check_permission(s08.TOOLS["bash"], {"command": "git push --force"}, workspace)[0] == "ask"
    assert s08.check_permission(s08.TOOLS["edit_file"], {"path": "/etc/passwd"}, workspace)[0] == "deny"


# ---------------------------------------------------------------- todo_write, load_skill

def test_todo_write_allows_one_item_in_progress(s08, agent):
    out, failed = call(s08, agent, "todo_write", items=[{"content": "a", "status": "in_progress"},
                                                        {"content": "b", "status": "in_progress"}])
    assert failed and "only one item may be in_progress" in out
    out, failed = call(s08, agent, "todo_write", items=[{"content": "a", "status": "started"}])
    assert failed and "status must be" in out


def test_the_todo_list_is_printed_once_a_call_an_item_a_line(s08, agent):
    items = [{"content": "write tests", "status": "in_progress"}, {"content": "ship", "status": "pending"}]
    call(s08, agent, "todo_write", items=items)
    assert "  [>] write tests\n  [ ] ship" in agent.out.text
    assert agent.out.text.count("write tests") == 1, "the list once: not in the call's line, not in a preview"
    assert "● todo_write  2 items\n" in agent.out.text


def test_load_skill_returns_the_body(s08, agent, workspace):
    (workspace / "skills" / "deploy").mkdir(parents=True)
    (workspace / "skills" / "deploy" / "SKILL.md").write_text(
        "---\nname: deploy\ndescription: How we ship\n---\nRun make release.\n")
    fresh = s08.replace(agent, skills=discover_skills([workspace / "skills"]))
    out, failed = call(s08, fresh, "load_skill", name="deploy")
    assert not failed and "Run make release." in out
    out, failed = call(s08, fresh, "load_skill", name="nope")
    assert failed and "deploy" in out


def test_the_chapter_ships_a_real_skill(s08, agent):
    assert agent.skills, "s08_context_compact/skills/ must hold at least one skill"
    for name, skill in agent.skills.items():
        assert skill["description"] and len(skill["body"]) > 200
        assert f"- {name}: {skill['description']}" in agent.system


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_a_task_with_a_blank_prompt_is_answered_with_what_to_do_and_sends_nothing(s08, make_agent, fake, prompt):
    agent = make_agent()
    result = use_tool(s08, agent, {"type": "tool_use", "id": "toolu_t", "name": "task", "input": {"prompt": prompt}})
    assert result["content"] == "Error: task was called wrongly: argument 'prompt' must not be blank. Call it " \
        "again with valid input." and fake.requests == []


def test_a_tool_declared_once_is_recorded_by_undo_and_the_ledger_and_checked(s08, make_agent, fake, workspace):
    """A new tool that writes a file says so where it is declared, and nowhere else: /undo puts
    back what it wrote, the ledger brings its file back after a summary, the permission check
    keeps it inside the workspace, and the work line shows its path."""
    def run_append_line(agent, call, path: str, line: str) -> str:
        with open(workspace_path(agent.workdir, path), "a", encoding="utf-8") as f:
            f.write(line + "\n")
        return f"appended a line to {path}"

    append = Tool("append_line", "Append a line to a text file.",
                  s08.schema(("path", "line"), path=s08.TEXT, line=s08.TEXT), run_append_line,
                  main_argument="path", writes="path")
    agent = make_agent(tools={**s08.TOOLS, "append_line": append})
    notes = workspace / "notes.txt"
    notes.write_text("first\n")
    fake.reply(tool_use("append_line", {"path": "notes.txt", "line": "second"}),
               tool_use("append_line", {"path": "/etc/motd", "line": "x"}), text("Done."),
               text("<summary>Appended to a file.</summary>"), text("Carrying on."))
    messages = []
    assert s08.take_turn(agent, messages, "append a line")
    assert notes.read_text() == "first\nsecond\n"
    assert "● append_line  notes.txt" in str(agent.out)
    refused = fake.main_requests[2]["messages"][-1]["content"][0]
    assert refused["is_error"] and "outside the workspace" in refused["content"], refused
    handle_command(agent, messages, "/compact", s08.LESSON)
    assert s08.take_turn(agent, messages, "go on")
    after = json.dumps(fake.main_requests[-1]["messages"])
    assert "Fact ledger" in after and "wrote or edited (oldest first): notes.txt" in after
    handle_command(agent, messages, "/undo", s08.LESSON)
    assert notes.read_text() == "first\n", "undo put back what the new tool wrote"
