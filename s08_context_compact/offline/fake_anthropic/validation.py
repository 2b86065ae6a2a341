"""Request validation of the fake Messages API: `validate_request` refuses what the real
API refuses, with its error texts (roles, block shapes, empty text, tool pairing, tool schemas,
cache breakpoints), raising `InvalidRequest`; `check_thinking_passback` and
`renders_as_strings` are the checks some providers add; `is_summary_request` tells a summary
request (answered from `summaries`) from the others."""

from __future__ import annotations

import re

from .providers import sign_thinking

TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
MAX_CACHE_BREAKPOINTS = 4


# ---------------------------------------------------------------- validation

class InvalidRequest(Exception):
    """A request the real API would answer with 400 invalid_request_error."""


SUMMARY_OPENING = "TEXT ONLY, NO TOOLS."  # how code.py's summary instruction begins


def is_summary_request(body: dict) -> bool:
    """A request for a summary, to be answered from `summaries`: it has no tools, forbids
    them, or ends with the summary instruction (a request that keeps the tools as they
    were, so that it reads the conversation's cache)."""
    choice = body.get("tool_choice") or {}
    last = (body.get("messages") or [{}])[-1]
    content = last.get("content") if isinstance(last, dict) else None
    last_block = content[-1] if isinstance(content, list) and content else None
    if isinstance(last_block, dict):
        ending = last_block.get("text", "")
    elif isinstance(content, str):
        ending = content
    else:
        ending = ""
    # plain text: what followed the results is inside the last
    if isinstance(last_block, dict) and last_block.get("type") == "tool_result":
        inner = last_block.get("content")
        ending = inner if isinstance(inner, str) else ""
    ending = str(ending)
    # plain text: the instruction is the last paragraph of a string
    return (not body.get("tools") or choice.get("type") == "none"
            or ending.startswith(SUMMARY_OPENING) or f"\n\n{SUMMARY_OPENING}" in ending)


def _check_text_block(block: dict, where: str) -> None:
    value = block.get("text")
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}.text: Field required")
    if value == "":
        raise InvalidRequest(f"{where.split('.')[0]}: text content blocks must be non-empty")
    if not value.strip():
        raise InvalidRequest(f"{where.split('.')[0]}: "
                             "text content blocks must contain non-whitespace text")


def _check_tool_result_content(content, where: str) -> None:
    if isinstance(content, str) or content is None:
        return
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: Input should be a valid string or list")
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
            raise InvalidRequest(f"{where}.content.{k}: "
                                 "Input tag does not match any of the expected tags: "
                                 "'text', 'image'")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{where}.content.{k}.text: Field required")


def _check_block(block, role: str, where: str) -> None:
    if not isinstance(block, dict) or "type" not in block:
        raise InvalidRequest(f"{where}: Input should be a valid dictionary with a 'type' field")
    kind = block["type"]
    if kind == "text":
        _check_text_block(block, where)
    elif kind == "tool_use":
        if role != "assistant":
            raise InvalidRequest(f"{where}: `tool_use` blocks can only be in `assistant` messages")
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
            raise InvalidRequest(f"{where}: tool_use blocks require string `id` and `name`")
        if not isinstance(block.get("input"), dict):
            raise InvalidRequest(f"{where}.input: Input should be a valid dictionary")
    elif kind == "tool_result":
        if role != "user":
            raise InvalidRequest(f"{where}: `tool_result` blocks can only be in `user` messages")
        if not isinstance(block.get("tool_use_id"), str):
            raise InvalidRequest(f"{where}.tool_use_id: Field required")
        _check_tool_result_content(block.get("content"), where)
    elif kind in ("image", "document", "thinking", "redacted_thinking"):
        pass
    else:
        raise InvalidRequest(f"{where}.type: Input tag '{kind}' found using 'type' "
                             "does not match any of the expected tags")
    extra = set(block) - {"type", "text", "id", "name", "input", "tool_use_id", "content",
                          "is_error", "cache_control", "source", "thinking", "signature",
                          "data", "citations", "title", "context"}
    if extra:
        raise InvalidRequest(f"{where}.{sorted(extra)[0]}: Extra inputs are not permitted")


def _blocks(message: dict) -> list:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content


def _merge_consecutive(messages: list) -> list:
    """The real API folds consecutive same-role messages into one turn."""
    merged = []
    for index, message in enumerate(messages):
        blocks = [(index, k, b) for k, b in enumerate(_blocks(message))]
        if merged and merged[-1][0] == message["role"]:
            merged[-1][1].extend(blocks)
        else:
            merged.append((message["role"], blocks, index))
    return merged


def _check_pairing(messages: list) -> None:
    turns = _merge_consecutive(messages)
    seen_ids: set = set()
    for t, (role, blocks, first_index) in enumerate(turns):
        if role == "user":
            previous = turns[t - 1][1] if t > 0 else []
            offered = {b["id"] for _, _, b in previous if b.get("type") == "tool_use"}
            for i, k, b in blocks:
                if b.get("type") == "tool_result" and b["tool_use_id"] not in offered:
                    raise InvalidRequest(
                        f"messages.{i}.content.{k}: "
                        "unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{b['tool_use_id']}. "
                        "Each `tool_result` block must have a corresponding `tool_use` "
                        "block in the previous message.")
            continue
        uses = [b for _, _, b in blocks if b.get("type") == "tool_use"]
        for i, k, b in blocks:
            if b.get("type") == "tool_use":
                if b["id"] in seen_ids:
                    raise InvalidRequest(
                        f"messages.{i}.content.{k}: `tool_use` ids must be unique")
                seen_ids.add(b["id"])
        if not uses:
            continue
        last_index = blocks[-1][0] if blocks else first_index
        if t + 1 >= len(turns):
            raise InvalidRequest(
                f"messages.{last_index}: "
                "`tool_use` ids were found without `tool_result` blocks immediately "
                f"after: {', '.join(b['id'] for b in uses)}. "
                "Each `tool_use` block must have a corresponding "
                "`tool_result` block in the next message.")
        following = turns[t + 1][1]
        leading = []
        for _, _, b in following:
            if b.get("type") != "tool_result":
                break
            leading.append(b["tool_use_id"])
        missing = [b["id"] for b in uses if b["id"] not in leading]
        if missing:
            raise InvalidRequest(
                f"messages.{last_index}: "
                "`tool_use` ids were found without `tool_result` blocks immediately "
                f"after: {', '.join(missing)}. "
                "Each `tool_use` block must have a corresponding `tool_result` "
                "block in the next message.")
        if len(leading) < len([b for _, _, b in following if b.get("type") == "tool_result"]):
            raise InvalidRequest(
                f"messages.{turns[t + 1][2]}: "
                f"Did not find {len(uses)} `tool_result` block(s) at the beginning "
                "of this message. "
                "Messages following `tool_use` blocks must begin with a matching number of "
                "`tool_result` blocks.")


def _count_cache_breakpoints(body: dict) -> int:
    found = 0
    for part in [body.get("system")] + (body.get("tools") or []) + (body.get("messages") or []):
        if isinstance(part, dict):
            found += "cache_control" in part
            for block in part.get("content") if isinstance(part.get("content"), list) else []:
                found += isinstance(block, dict) and "cache_control" in block
        elif isinstance(part, list):
            found += sum(1 for b in part if isinstance(b, dict) and "cache_control" in b)
    return found


def validate_request(body: dict, *, need_max_tokens: bool = True) -> None:
    """Raise InvalidRequest with the real API's message for the first problem found."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("model: Field required")
    if need_max_tokens:
        if "max_tokens" not in body:
            raise InvalidRequest("max_tokens: Field required")
        if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
            raise InvalidRequest("max_tokens: Input should be greater than or equal to 1")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: Field required")
    if not messages:
        raise InvalidRequest("messages: at least one message is required")
    system = body.get("system")
    if isinstance(system, list):
        for k, block in enumerate(system):
            _check_text_block(block, f"system.{k}")
    elif system is not None and not isinstance(system, str):
        raise InvalidRequest("system: Input should be a valid string or list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise InvalidRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise InvalidRequest(f"messages.{i}.content: Input should be a valid string or list")
        # a prefill may be empty
        final_assistant = i == len(messages) - 1 and message["role"] == "assistant"
        if not content and not final_assistant:
            raise InvalidRequest(f"messages.{i}: "
                                 "all messages must have non-empty content except for the "
                                 "optional final assistant message")
        if isinstance(content, str):
            if message["role"] == "user" and not content.strip():
                raise InvalidRequest(
                    "messages: text content blocks must contain non-whitespace text")
            continue
        for k, block in enumerate(content):
            _check_block(block, message["role"], f"messages.{i}.content.{k}")
    if messages[0]["role"] != "user":
        raise InvalidRequest('messages: first message must use the "user" role')
    _check_pairing(messages)
    names = []
    for k, tool in enumerate(body.get("tools") or []):
        if not TOOL_NAME_RE.match(str(tool.get("name", ""))):
            raise InvalidRequest(f"tools.{k}.name: "
                                 "String should match pattern '^[a-zA-Z0-9_-]{1,128}$'")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise InvalidRequest(f"tools.{k}.input_schema.type: Input should be 'object'")
        names.append(tool["name"])
    if len(names) != len(set(names)):
        raise InvalidRequest("tools: Tool names must be unique.")
    breakpoints = _count_cache_breakpoints(body)
    if breakpoints > MAX_CACHE_BREAKPOINTS:
        raise InvalidRequest(f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control "
                             f"may be provided. Found {breakpoints}.")


def renders_as_strings(messages: list) -> bool:
    """Whether a chat template that concatenates strings can take these messages once
    LiteLLM has made them OpenAI messages: text only as a string, no text beside tool
    results (it would become a user message of parts), no call without text."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            continue
        kinds = [b.get("type") for b in content if isinstance(b, dict)]
        if "text" in kinds and ("tool_result" in kinds or set(kinds) == {"text"}):
            return False
        if message.get("role") == "assistant" and "tool_use" in kinds and "text" not in kinds:
            return False
    return True


def check_thinking_passback(messages: list) -> None:
    """With thinking on, a tool loop must hand back the thinking that led to its tool calls.

    When the messages end with a user turn of tool results, the assistant turn before
    it must start with the thinking block it was given, text and signature unchanged
    (or with a redacted_thinking block), as Anthropic and DeepSeek require."""
    turns = _merge_consecutive(messages)
    if len(turns) < 2 or turns[-1][0] != "user" or turns[-2][0] != "assistant":
        return
    if not any(b.get("type") == "tool_result" for _, _, b in turns[-1][1]):
        return
    if not turns[-2][1]:
        return  # an empty assistant turn; the pairing check has already refused its results
    i, k, first = turns[-2][1][0]
    kind = first.get("type")
    if kind == "redacted_thinking":
        return
    if kind != "thinking":
        raise InvalidRequest(
            f"messages.{i}.content.{k}.type: "
            f"Expected `thinking` or `redacted_thinking`, but found `{kind}`. "
            "When `thinking` is enabled, "
            "a final `assistant` message must start with a thinking block "
            "(preceeding the lastmost set of `tool_use` and `tool_result` blocks).")
    if (not isinstance(first.get("thinking"), str)
            or first.get("signature") != sign_thinking(first["thinking"])):
        raise InvalidRequest(f"messages.{i}.content.{k}: Invalid `signature` in `thinking` block")
