"""What a failed call is, and what a person is told about it: every way one call can fail,
which failures may pass on their own, one line for the error itself, and, when a turn ends
in one, what to check and what became of the message sent.

Machinery the chapter does not need. It only reads an error: trying the call again, for
the failures worth it, is model_calls.py's job, beside it.
"""

import re
from contextlib import contextmanager

from .replies import BadReply, EmptyReply, ErrorEvent, SummaryError
from .sdk import anthropic
from ..basics import one_line

ERROR_CHARS = 300                   # an error's message on screen: pydantic errors can run to pages


def api_failures() -> tuple:
    """Every way one call can fail: the SDK's errors, and what we find wrong in a reply."""
    return anthropic.APIError, BadReply, ErrorEvent


@contextmanager
def failed_as_summary_error():
    """A summary call that failed raised as SummaryError, which says why in one line: the
    summary's caller falls back to one built without the model. "Too long" passes through."""
    try:
        yield
    except api_failures() as err:
        raise SummaryError(api_error_text(err)) from err


def worth_retrying(err: Exception) -> bool:
    """429, 5xx and 529, a reply that broke off, an "overloaded" error inside a stream."""
    if isinstance(err, ErrorEvent):
        return err.kind in ("overloaded_error", "api_error", "rate_limit_error")
    return isinstance(err, (anthropic.RateLimitError, anthropic.InternalServerError,
                            anthropic.APIConnectionError, BadReply))


def api_error_text(err: Exception) -> str:
    """One line for a person: the status, the error's kind and its message (cut short: a
    proxy may quote the whole request in it), and the URL where that URL is what to check."""
    if isinstance(err, ErrorEvent):
        return f"error inside the reply stream: {one_line(str(err), ERROR_CHARS)}"
    request_url = getattr(getattr(err, "request", None), "url", "")
    url = str(request_url or "").split("?")[0] or "the API"
    url = re.sub(r"//[^/@\s]*@", "//", url)  # a proxy's user:password never goes on screen
    status = getattr(err, "status_code", None)
    from_url = f" (from {url})" if status in (401, 403, 404) else ""
    body = getattr(err, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        kind = error.get("type") or error.get("code") or "error"
        message = one_line(error.get("message"), ERROR_CHARS)
        return f"{getattr(err, 'status_code', '')} {kind}: {message}{from_url}"
    if isinstance(err, anthropic.APITimeoutError):
        return (f"{url} did not answer in time (API_CONNECT_TIMEOUT, API_IDLE_TIMEOUT); "
                "check ANTHROPIC_BASE_URL and the network")
    if isinstance(err, anthropic.APIConnectionError):
        return (f"cannot reach {url} ({err.__cause__ or err}); "
                "check ANTHROPIC_BASE_URL and the network")
    if isinstance(err, anthropic.APIStatusError):
        return f"{err.status_code} {one_line(str(body or err), 200)}{from_url}"
    return one_line(str(err), ERROR_CHARS)


def key_refused(err: Exception) -> bool:
    """The endpoint would not take the key: 401 or 403, or LiteLLM without a database, which
    knows only its master key and says "No connected db." of any other."""
    body = getattr(err, "body", None)
    kind = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        kind = body["error"].get("type")
    return getattr(err, "status_code", None) in (401, 403) or kind == "no_db_connection"


def explain_api_error(err: Exception, withdrawn: bool, terminal: bool) -> str:
    """What a person is told when a turn ends in an API error: what went wrong, what to
    check, and what became of the message they sent."""
    parts = [f"API error: {api_error_text(err).rstrip('.')}.",
             what_to_do(err),
             what_became_of_it(err, withdrawn, terminal)]
    return " ".join(filter(None, parts))


def what_to_do(err: Exception) -> str:
    status = getattr(err, "status_code", None)
    if key_refused(err):
        return ("Check ANTHROPIC_API_KEY, or ANTHROPIC_AUTH_TOKEN for an endpoint that wants "
                "a bearer token.")
    if status == 404:
        return "Check MODEL_ID and ANTHROPIC_BASE_URL."
    if isinstance(err, EmptyReply):
        return ("The server's own log says why; if the prompt was over its context size, "
                "set CONTEXT_WINDOW to it (llama.cpp's n_ctx).")
    return ""


def what_became_of_it(err: Exception, withdrawn: bool, terminal: bool) -> str:
    """What happened to the user's message after an API error, and whether to send it again."""
    if not withdrawn:
        return "The work so far is kept; send a message to go on."
    if isinstance(err, EmptyReply):
        return ("Your message was not answered and was taken back out; "
                "send it again once the server's log shows why.")
    status = getattr(err, "status_code", None)
    if key_refused(err) or status == 404:  # the settings, not the message
        return ("Your message was taken back out; "
                "once that is fixed (restart the program), send it again.")
    if status in (400, 413, 422):  # the request itself was refused
        return ("The endpoint refused the request as it stands, so your message was taken "
                "back out; sent unchanged, it would fail again.")
    recall = " (the up arrow recalls it)." if terminal else "."
    return "Your message was not answered and was taken back out; send it again" + recall
