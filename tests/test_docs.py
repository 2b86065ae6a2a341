"""The chapter names the code: every function or constant it mentions must exist in code.py
(a comment does not count), in the order the chapter's table gives."""

import ast
import re

import pytest

from conftest import CODE

CHAPTER = CODE.parent / "README.md"
TREE = ast.parse(CODE.read_text(encoding="utf-8"))


def words_in_code(tree) -> set:
    """Every identifier code.py uses or defines, and every word of its string literals
    other than docstrings: what a comment says is not there."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node)}
    words = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            words.add(node.name)
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
            words.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value))
    return words


WORDS = words_in_code(TREE)
DEFINED_AT = {node.name: node.lineno for node in TREE.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def code_names(markdown: str) -> set:
    names = set()
    for span in re.findall(r"`([^`\n]+)`", markdown):
        for name in re.findall(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?$", span):
            if "_" in name or re.match(r"[A-Z][a-z]+[A-Z]", name) or name.isupper():
                names.add(name)
    return names


@pytest.mark.parametrize("chapter", [CHAPTER, CODE.parent / "README.zh.md"], ids=["en", "zh"])
def test_every_code_name_in_the_chapter_exists(chapter):
    text = chapter.read_text(encoding="utf-8")
    known_elsewhere = {"tool_use", "tool_result", "tool_choice", "max_tokens", "input_tokens", "cache_control",
                       "max_input_tokens", "invalid_request_error", "count_tokens", "read_file", "write_file",
                       "edit_file", "todo_write", "load_skill", "clear_at_least", "budget_chars", "micro_trigger",
                       "NO_COLOR", "CONTEXT_WINDOW", "MODEL_ID", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
                       "POST_COMPACT_", "SKILL", "cache_edits", "tool_use_id", "messages/count_tokens",
                       "redacted_thinking", "ContextWindowExceededError"}  # the API's and LiteLLM's names
    missing = sorted(n for n in code_names(text) if n not in known_elsewhere and n.split(".")[-1] not in WORDS)
    assert not missing, f"{chapter.name} names what code.py does not have: {missing}"


def test_the_chapter_numbers_match_the_code(s08):
    text = CHAPTER.read_text(encoding="utf-8")
    big = s08.Settings.for_window("m", 200_000)
    small = s08.Settings.for_window("m", 12_000)
    for number in (big.threshold, big.micro_trigger, big.clear_at_least, small.threshold, small.budget_chars,
                   small.micro_trigger, small.clear_at_least):
        assert f"{number:,}" in text, number


def test_a_name_only_in_a_comment_or_a_docstring_is_not_in_the_code():
    tree = ast.parse('# uses compact_history here\ndef f():\n    """and keep_going in a docstring"""\n'
                     '    return g("x_y")\n')
    words = words_in_code(tree)
    assert {"f", "g", "x_y"} <= words and "compact_history" not in words and "keep_going" not in words


def table_names(text: str) -> list:
    """The code names in the function column of the "Where each idea lives" table."""
    table = text[text.index("| --- |"):].split("\n\n")[0]
    return [name.split(".")[0] for line in table.splitlines()[1:]
            for name in re.findall(r"`([A-Za-z_][\w.]*)`", line.split("|")[2])]


@pytest.mark.parametrize("chapter", [CHAPTER, CODE.parent / "README.zh.md"], ids=["en", "zh"])
def test_code_py_defines_the_tables_names_in_the_tables_order(chapter):
    text = chapter.read_text(encoding="utf-8")
    names = table_names(text)
    assert len(names) >= 30 and all(n in DEFINED_AT for n in names), [n for n in names if n not in DEFINED_AT]
    backwards = [(a, b) for a, b in zip(names, names[1:]) if DEFINED_AT[b] < DEFINED_AT[a]]
    assert not backwards, f"code.py defines these the other way round: {backwards}"
    layers = re.findall(r"^### `(\w+)`", text, re.M)
    assert layers == ["tool_result_budget", "snip_compact", "micro_compact", "compact_history", "reactive_compact"]
    assert [DEFINED_AT[n] for n in layers] == sorted(DEFINED_AT[n] for n in layers)


def test_the_lesson_comes_before_the_command_line():
    source = CODE.read_text(encoding="utf-8")
    part_two = source[:source.index("PART 2: THE COMMAND LINE AROUND IT")].count("\n") + 1
    assert all(DEFINED_AT[n] < part_two for n in ("Settings", "tool_result_budget", "compact_pipeline", "agent_loop"))
    assert all(DEFINED_AT[n] > part_two for n in ("repl", "SessionLog", "send_request", "main"))
