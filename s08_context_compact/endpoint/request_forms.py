"""The request in the form the endpoint takes: every secret out of it except inside the
thinking blocks the endpoint signed (they go back byte for byte), and, for a server whose
chat template takes only strings (llama.cpp's, relayed by LiteLLM), the same request as
plain text.

Machinery the chapter does not need. It only reshapes a request: sending it, and choosing
the plain-text form after an empty reply, is model_calls.py's job, beside it.
"""

from ..messages import result_text

# blocks the endpoint signed: they go back exactly as it sent them
SIGNED = ("thinking", "redacted_thinking")


def redacted_request(secrets, request: dict) -> dict:
    """The request with every secret in any form replaced, except inside the thinking blocks
    the endpoint signed: those came from it, and a changed one fails its signature (400),
    which would fail every later turn too. They are kept out of logs and the screen
    instead."""
    signed = []

    def set_aside(block):
        if isinstance(block, dict) and block.get("type") in SIGNED:
            signed.append(block)
            return {"type": "signed", "n": len(signed) - 1}
        return block
    clean = secrets.redact_json({**request,
                                 "messages": each_block(request["messages"], set_aside)})
    if not signed:
        return clean
    return {**clean,
            "messages": each_block(clean["messages"],
                                   lambda b: signed[b["n"]] if b.get("type") == "signed" else b)}


def each_block(messages: list, change) -> list:
    """The messages with change() applied to each block of a list content."""
    return [{**m, "content": [change(b) for b in m["content"]]}
            if isinstance(m.get("content"), list) else m
            for m in messages]


PLAIN_TEXT_PROOF = 2                # such requests before plain text is kept
PLAIN_TEXT_NOTE = ("[endpoint] the server failed on text sent as a list of blocks "
                   "and answered it sent as plain strings "
                   "(a chat template such as llama.cpp's takes only those): "
                   "plain text from now on, without prompt-cache marks")


def plain_text_request(request: dict) -> dict:
    """The request as a chat template that concatenates strings can take (LiteLLM turns each
    message into one the template reads): a message of only text as one string; text beside
    tool results inside the last result; a call alone with a line naming it (LiteLLM sends
    such a message with no text, and the template fails on that); no cache marks."""
    def as_strings(message: dict) -> dict:
        content = message["content"]
        if isinstance(content, str):
            return message
        blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
        texts = [b["text"] for b in blocks if b.get("type") == "text"]
        if len(texts) == len(blocks) and "".join(texts).strip():
            return {**message, "content": "\n\n".join(texts)}
        results = [k for k, b in enumerate(blocks) if b.get("type") == "tool_result"]
        if results and texts:
            last = blocks[results[-1]]
            inside = last.get("content")
            # a list (with images, say) stays a list
            inside = (inside + [{"type": "text", "text": t} for t in texts]
                      if isinstance(inside, list)
                      else "\n\n".join([result_text(last), *texts]))
            blocks[results[-1]] = {**last, "content": inside}
            blocks = [b for b in blocks if b.get("type") != "text"]
        calls = [k for k, b in enumerate(blocks) if b.get("type") == "tool_use"]
        # before the calls, after any thinking: a thinking block must come first
        if calls and not texts:
            names = ", ".join(blocks[k]["name"] for k in calls)
            blocks.insert(calls[0], {"type": "text", "text": f"(calling {names})"})
        return {**message, "content": blocks}
    tools = [{k: v for k, v in t.items() if k != "cache_control"}
             for t in request.get("tools") or []]
    return {**request,
            "messages": [as_strings(m) for m in request["messages"]],
            **({"tools": tools} if tools else {})}
