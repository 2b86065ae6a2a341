"""Text that cannot be written: lone UTF-16 surrogates. An emoji is two UTF-16 halves in
JSON (\\ud83d\\ude00); an endpoint that cuts a stream between them sends each half in a
delta of its own, and Python decodes each to a lone surrogate, which no UTF-8 file,
terminal or request can take. A log edited by hand can hold a lone \\udXXX escape too.
And the operating system's names and values (a folder, a file, an environment variable)
arrive with each byte that is not UTF-8 as a half of its own, U+DC80 to U+DCFF
(surrogateescape). Here halves that belong together are joined, those bytes become
U+FFFD as a UTF-8 decoder shows them (as in a command's output), and any other half
alone becomes U+FFFD too.

Machinery the chapter does not need: well_formed and well_formed_deep make a text, a reply,
a request or a log record writable wherever one is assembled, sent, read back or written,
and a secret's value findable as text shows it; shown_so_far holds back a first half at the
end of what has streamed. workspace_files.py takes a name the model was shown with U+FFFD
back to the name on disk (on_disk).
"""

import re

LONE_HALF = re.compile("[\ud800-\udfff]")
NOT_A_BYTE = re.compile("[\ud800-\udc7f\udd00-\udfff]")  # halves surrogateescape never makes
HALF_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # how JSON text spells a half


def well_formed(text: str) -> str:
    """text with each pair of surrogate halves joined into its character, the bytes a name
    or value held that were not UTF-8 as U+FFFD (as bytes.decode("utf-8", "replace") shows
    them: once for each broken sequence), and any other half left alone as U+FFFD. Text
    without halves (nearly all) comes back as it is."""
    if not LONE_HALF.search(text):
        return text
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    as_bytes = NOT_A_BYTE.sub("\ufffd", joined).encode("utf-8", "surrogateescape")
    return as_bytes.decode("utf-8", "replace")


def well_formed_deep(value, depth: int = 100):
    """A JSON value with every string (and key) well formed; what holds no half comes back
    as the same object. Nesting past `depth` is left as it is (tool_input.py refuses it)."""
    if isinstance(value, str):
        return well_formed(value)
    if depth <= 0:
        return value
    if isinstance(value, dict):
        items = {well_formed(key): well_formed_deep(item, depth - 1) for key, item in value.items()}
        same = items.keys() == value.keys() and all(items[key] is item
                                                    for key, item in value.items())
        return value if same else items
    if isinstance(value, list):
        items = [well_formed_deep(item, depth - 1) for item in value]
        return value if all(new is old for new, old in zip(items, value)) else items
    return value


def shown_so_far(text: str) -> tuple:
    """(what of a streamed text can be shown now, what must wait for the next piece): a
    first half at the very end waits, since its second half may be in the next delta."""
    if text and "\ud800" <= text[-1] <= "\udbff":
        return well_formed(text[:-1]), text[-1]
    return well_formed(text), ""
