"""Counting tokens without a tokenizer: an estimate of what a request carries (ASCII at four
characters a token, anything else one each), the newest items that fit a budget, the head of
a text that fits, and the TokenCounter that anchors the estimate to the API's own figures.

Machinery the chapter does not need. It measures a history and never changes one: what to
cut once the count passes the threshold is the compaction layers' decision.
"""

import json

from .history import message_groups, sendable

CHARS_PER_TOKEN = 4                 # for ASCII text; other characters count one token each



def estimate_text_tokens(text: str) -> int:
    if text.isascii():  # most text: counted without a copy
        return len(text) // CHARS_PER_TOKEN + 1
    ascii_chars = len(text.encode("ascii", "ignore"))
    return ascii_chars // CHARS_PER_TOKEN + (len(text) - ascii_chars) + 1



def estimate_tokens(messages: list) -> int:
    """A character-based estimate of what is sent: ASCII at 4 characters a token, anything
    else one each."""
    return sum(estimate_text_tokens(json.dumps(sendable(m), ensure_ascii=False))
               for m in messages)



def newest_within(items: list, max_tokens: int, size) -> list:
    """The newest items that together cost at most max_tokens, in their order. Used wherever
    recent things are kept and older ones let go: recent groups, user messages, ledger
    lines."""
    kept, used = [], 0
    for item in reversed(items):
        used += size(item)
        if used > max_tokens:
            break
        kept.append(item)
    return kept[::-1]


def newest_groups(messages: list, max_tokens: int) -> list:
    """The newest groups of the history (a call with its results) that together cost at most
    max_tokens, by estimate, oldest first; the newest group at least, whatever it costs."""
    groups = message_groups(messages)
    return newest_within(groups, max_tokens, estimate_tokens) or groups[-1:]



def head_within(text: str, max_tokens: int) -> str:
    """The start of text that costs at most max_tokens: four characters a token in ASCII,
    one in Chinese. Cut by a quarter at a time, so long texts need few measurements."""
    head = text[:max_tokens * CHARS_PER_TOKEN]
    while head and estimate_text_tokens(head) > max_tokens + 1:  # the estimate adds 1 to any text
        head = head[:len(head) * 3 // 4]
    return head



class TokenCounter:
    """The context's size, anchored to the API: the last response's usage is exact, and
    only messages added or changed since are estimated."""

    def __init__(self):
        # id(message) -> (message, estimate): each message measured once
        self.sizes = {}
        self.anchor_tokens = None
        self.anchor_messages = []

    def size(self, message: dict) -> int:
        entry = self.sizes.get(id(message))
        if entry is None or entry[0] is not message:
            entry = self.sizes[id(message)] = (message, estimate_tokens([message]))
        return entry[1]

    def estimate(self, messages: list) -> int:
        return sum(self.size(m) for m in messages)

    def anchor(self, tokens: int, messages: list) -> None:
        self.anchor_tokens, self.anchor_messages = tokens, list(messages)
        if len(self.sizes) > 4 * len(messages) + 100:  # forget messages no longer in history
            self.sizes = {id(m): (m, self.size(m)) for m in messages}

    def measures(self, messages: list) -> bool:
        """Whether count() is the API's own figure: the history is the one it measured."""
        return self.anchor_tokens is not None and messages == self.anchor_messages

    def last_anchored(self) -> dict | None:
        """The newest message the anchor measured (a reply, whose usage gave the count)."""
        return self.anchor_messages[-1] if self.anchor_messages else None

    def count(self, messages: list, overhead: int) -> int:
        if self.anchor_tokens is None:
            return overhead + self.estimate(messages)
        same = len(self.anchor_messages)
        # The usual cases, the anchored history as it was or with new messages after it, are
        # decided by one list comparison: in C, identical items by identity, no message read.
        if (messages if len(messages) == same else messages[:same]) != self.anchor_messages:
            same = 0  # layers copy only what they change, so identity marks what is unchanged
            for old, new in zip(self.anchor_messages, messages):
                if old is not new:
                    break
                same += 1
        before, after = self.anchor_messages[same:], messages[same:]
        if before and after:  # something was rewritten: compare what is gone with what is new
            now = {id(m) for m in after}
            gone = [m for m in before if id(m) not in now]
            # nothing in common (a summary): the anchor says nothing
            if same == 0 and len(gone) == len(before):
                return overhead + self.estimate(messages)
            then = {id(m) for m in before}
            before, after = gone, [m for m in after if id(m) not in then]
        return self.anchor_tokens - self.estimate(before) + self.estimate(after)
