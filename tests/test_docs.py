"""The chapter names the code: every function or constant it mentions must exist in code.py."""

import re

import pytest

from conftest import CODE

CHAPTER = CODE.parent / "README.md"
SOURCE = CODE.read_text(encoding="utf-8")


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
    missing = sorted(n for n in code_names(text) if n not in known_elsewhere
                     and not re.search(rf"\b{re.escape(n.split('.')[-1])}\b", SOURCE))
    assert not missing, f"{chapter.name} names what code.py does not have: {missing}"


def test_the_chapter_numbers_match_the_code(s08):
    text = CHAPTER.read_text(encoding="utf-8")
    big = s08.Settings.for_window("m", 200_000)
    small = s08.Settings.for_window("m", 12_000)
    for number in (big.threshold, big.micro_trigger, big.clear_at_least, small.threshold, small.budget_chars,
                   small.micro_trigger, small.clear_at_least):
        assert f"{number:,}" in text, number
