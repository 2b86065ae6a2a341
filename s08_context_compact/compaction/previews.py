"""Previews: a tool result too big to keep saved through the store and replaced by its head,
with where the whole text is; pointers, a result replaced by where it was saved alone; and
the rule every replacement keeps, that it costs fewer
tokens than what it replaces. The cheap layers (tool_result_budget, micro_compact) decide
which results; summary.py previews a summary's tail the same way.

Machinery the chapter does not need beyond these names.
"""

import json
from pathlib import Path

from ..messages import (CHARS_PER_TOKEN, OWN, PERSISTED_TAG, PLACEHOLDER_PREFIX, blocks_of,
                        estimate_text_tokens, head_within, replace_result, result_text)


def persisted_preview(path: Path, text: str, preview_chars: int) -> str:
    # Fixed wording, so clearing the same content twice produces the same bytes.
    head = head_within(text, preview_chars // CHARS_PER_TOKEN)
    return (f"{PERSISTED_TAG} path=\"{path}\" chars=\"{len(text)}\">\n"
            f"This result was too large to keep in context. The full output is saved at {path}; "
            f"read it (read_file with offset/limit) if you need more than this preview.\n"
            f"Preview (first {len(head)} characters):\n{head}\n</persisted-output>")


def fewer_tokens(new: str, old: str) -> bool:
    """Whether a replacement costs fewer tokens than the text it replaces, measured as it stands
    in a request (inside JSON). A layer replaces nothing otherwise: it must never grow."""
    new_tokens = estimate_text_tokens(json.dumps(new, ensure_ascii=False))
    return new_tokens < estimate_text_tokens(json.dumps(old, ensure_ascii=False))


def previewed(block: dict, preview_chars: int, store) -> dict:
    """A tool result saved to disk and replaced by a preview, when the preview is the smaller."""
    text = result_text(block)
    if estimate_text_tokens(text) <= preview_chars // CHARS_PER_TOKEN or OWN in block:
        return block
    path = store.save_output(block["tool_use_id"], text)
    preview = persisted_preview(path, text, preview_chars)
    return replace_result(block, preview, "preview", path) if fewer_tokens(preview, text) else block


def preview_results(message: dict, preview_chars: int, store) -> dict:
    """Persist every result in a message that is longer than a preview, keeping the preview."""
    blocks = [previewed(b, preview_chars, store) if b.get("type") == "tool_result" else b
              for b in blocks_of(message)]
    return {**message, "content": blocks}


def pointed_to(block: dict, tool_name: str, path) -> dict:
    """A tool result replaced by a pointer to its saved copy at `path`, when the pointer is the
    smaller (a long path can make it cost more than a short result); else the block as it was."""
    text = result_text(block)
    pointer = (f"{PLACEHOLDER_PREFIX} ({tool_name}) cleared to save context. "
               f"Full output: {path}. Read that file if you need it again.]")
    smaller = fewer_tokens(pointer, text)
    return replace_result(block, pointer, "placeholder", path) if smaller else block
