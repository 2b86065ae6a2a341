"""Repeated reads: read_file of an unchanged file whose earlier result is still in the
conversation in full is answered with a short stub that points at that result, instead of
the same text twice; and every such stub stays true when a layer clears that result later.

Machinery the chapter does not need. A RepeatReads remembers one loop's reads: stub()
answers a repeat before the file is read, forget() drops what a summary took away, and
kept_true() keeps every stub true in a history about to be sent (true_stubs). Reading the
file when no stub applies is the read_file tool's job.
"""

from dataclasses import dataclass, field

from ..messages import OWN, blocks_of, replace_result


def still_in_context(messages: list, tool_use_id: str) -> bool:
    """Whether a tool result is still in the history with its full text
    (not cleared or previewed)."""
    for message in messages:
        for block in blocks_of(message):
            if block.get("type") == "tool_result" and block["tool_use_id"] == tool_use_id:
                return OWN not in block  # not a placeholder, not a preview
    return False


@dataclass
class RepeatReads:
    """What one loop remembers of its reads, to answer a repeat with a stub."""
    seen: dict = field(default_factory=dict)   # (path, offset, limit) -> (size, mtime, call id)
    stubs: dict = field(default_factory=dict)  # a stub's call id -> (the result it shows, path)

    def stub(self, history: list, call_id: str, target, path: str, offset: int,
             limit: int) -> str | None:
        """The stub for a read whose very bytes are already in the conversation (history), or
        None, and the read is remembered as call_id's."""
        key, stat = (str(target), offset, limit), target.stat()
        seen = self.seen.get(key)
        if (seen and seen[:2] == (stat.st_size, stat.st_mtime_ns)
                and still_in_context(history, seen[2])):
            self.stubs[call_id] = (seen[2], path)
            return (f"(unchanged: {path}, lines from {offset}, "
                    f"is exactly as in result {seen[2]} above)")
        self.seen[key] = (stat.st_size, stat.st_mtime_ns, call_id)
        return None

    def forget(self) -> None:
        """After a summary: what was read is no longer in the context as it was read."""
        self.seen.clear()

    def kept_true(self, messages: list) -> list:
        """The history with every stub still true (true_stubs)."""
        return true_stubs(messages, self.stubs)


def true_stubs(messages: list, stubs: dict) -> list:
    """A stub saying "as in result X above" must stay true in what is sent: when a layer has
    since cleared X (or a summary took it), the stub says where the text went."""
    if not stubs:
        return messages
    found = {b["tool_use_id"]: b for m in messages for b in blocks_of(m)
             if b.get("type") == "tool_result"}
    stale = {call: (target, path) for call, (target, path) in stubs.items()
             if call in found
             and OWN not in found[call]
             and (target not in found or OWN in found[target])}
    if not stale:
        return messages
    out = []
    for message in messages:
        if any(b.get("tool_use_id") in stale for b in blocks_of(message)):
            message = {**message,
                       "content": [restub(b, *stale[b["tool_use_id"]],
                                          found.get(stale[b["tool_use_id"]][0]))
                                   if b.get("tool_use_id") in stale else b
                                   for b in blocks_of(message)]}
        out.append(message)
    return out


def restub(block: dict, target: str, path: str, earlier: dict | None) -> dict:
    where = (f"its full text is saved at {earlier['saved_at']}"
             if earlier and earlier.get("saved_at")
             else "it is no longer in the conversation")
    return replace_result(block,
                          f"(a repeat read of {path}: "
                          f"the earlier result {target} was cleared since, and "
                          f"{where}; call read_file on {path} again to see it)", "stub")
