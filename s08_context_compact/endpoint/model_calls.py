"""Talking to the endpoint: one request with its retries and timeouts, the reply read as
it streams, the usage figures as each provider reports them, and what the session knows
about the endpoint (its window above all) and how it was found.

Machinery the chapter does not need. model_reply(...) takes a Connection (the few values a
call needs) and returns an Answer, or raises a ContextOverflow when the prompt did not fit;
the SDK and its client come from sdk.py, and what a failed call tells a person from
api_errors.py, beside it.
"""

import copy
import random
import re
import time
from dataclasses import dataclass, replace
from functools import cache

from ..messages import fresh_id, input_problem, NOTE_MARKER, own_text, said_text
from .api_errors import (api_error_text, api_failures, failed_as_summary_error, key_refused,
                         what_to_do, worth_retrying)
from .overflow import (EMPTY_REPLY_OVERFLOW, MIN_CONTEXT_WINDOW, ContextOverflow,
                       context_overflow, learned_window, is_token_count)
from .replies import (USAGE_KEYS, BadReply, EmptyReply, ErrorEvent, extract_summary,
                      reply_from_body, reply_from_events)
from .request_forms import (PLAIN_TEXT_NOTE, PLAIN_TEXT_PROOF, plain_text_request,
                            redacted_request)
from .sdk import anthropic, httpx2
from ..basics import (Redactor, Screen, Spinner, StreamedText, one_line, say_on,
                      well_formed_deep)


DEFAULT_CONTEXT_WINDOW = 200_000    # tokens, when neither CONTEXT_WINDOW nor the Models API says
# A call and up to 3 retries for 429, 5xx and dropped connections (API_RETRIES, 0 to 10).
API_RETRIES = 3
# An endpoint that counts more than this many times our estimate of a request is not counting
# that request as a tokenizer would; every later estimate is scaled by this much at most.
MAX_UNDERCOUNT = 8.0
MAX_API_ATTEMPTS = API_RETRIES + 1  # a call and its retries, by default
# Backoff 1 s, 2 s, 4 s (±20%), longer if the API's retry-after says so.
RETRY_BASE_SECONDS = 1.0
CONNECT_TIMEOUT = 10.0              # seconds to reach the endpoint (API_CONNECT_TIMEOUT)
# A stream silent this long (pings aside) is abandoned (API_IDLE_TIMEOUT).
IDLE_TIMEOUT = 120.0
MODELS_API_SOURCE = "the Models API (max_input_tokens)"
DEFAULT_WINDOW_SOURCE = "the default (nothing else said; set CONTEXT_WINDOW if you know it)"


@dataclass
class Endpoint:
    """What the session knows about the endpoint, shared by the agent and its subagents.
    Compatible endpoints differ: their window, whether they count max_tokens against it,
    whether they offer count_tokens, and whether their usage figures add up."""
    window: int
    window_source: str = "the settings this agent was given"
    model: str = ""
    counts_output: bool = False       # the window bounds prompt + max_tokens
    # False once count_tokens answered 404 (or failed): not asked again.
    can_count_tokens: bool = True
    models_api: bool = True           # False once the Models API answered 404
    learned: bool = False             # the window came from an overflow: it caps any other source
    reads_in_input: bool | None = None  # do its input_tokens include the cache reads? (Kimi: yes)
    # (prompt, prompt + max_tokens) of the biggest request answered.
    largest_accepted: tuple = (0, 0)
    # The biggest prompt answered, as the endpoint's own usage counted it.
    largest_measured: int = 0
    largest_once: int = 0             # the same, had input_tokens held the cache reads (unproven)
    usage_note: str = ""              # set when the endpoint's usage could not be taken as it is
    # What the first call at start-up ran into (no connection, a refused key).
    startup_problem: str = ""
    # How many times our estimate the endpoint counted in a refused prompt.
    undercount: float = 1.0
    # Its chat template takes only text as strings (plain_text_request).
    plain_text: bool = False
    # Requests plain text answered after the blocks got an empty reply.
    plain_text_wins: int = 0

    def accepted(self, prompt_tokens: int, max_tokens: int, measured: bool = False,
                 usage: dict | None = None) -> None:
        self.largest_accepted = (max(self.largest_accepted[0], prompt_tokens),
                                 max(self.largest_accepted[1], prompt_tokens + max_tokens))
        if measured:
            self.largest_measured = max(self.largest_measured, prompt_tokens)
            once = prompt_tokens - self.reads_maybe_inside(usage or {})
            self.largest_once = max(self.largest_once, once)

    def reads_maybe_inside(self, usage: dict) -> int:
        """The cache reads a size added to input_tokens while it is unproven whether they were
        inside it: input_tokens at least as large as the reads may hold them all (Kimi's do)."""
        read = usage.get("cache_read_input_tokens", 0)
        return read if self.reads_in_input is None and usage.get("input_tokens", 0) >= read else 0

    def overflowed_silently(self, sent_tokens: int) -> bool:
        """Whether empty replies (EmptyReply), every try and plain text too, to this request most
        likely mean a prompt over the window: larger than any request answered, large enough
        for the program to work in, and the window only assumed (not set by CONTEXT_WINDOW or
        stated by the Models API)."""
        known = self.window_source in ("CONTEXT_WINDOW", MODELS_API_SOURCE)
        large_enough = sent_tokens >= MIN_CONTEXT_WINDOW
        return not known and large_enough and sent_tokens > self.largest_accepted[0]

    def learn_from(self, err: ContextOverflow) -> str:
        """Take the window an overflow reveals: the one it states, else one below the refused
        size and no lower than the largest request answered. Says what was learned, or why a
        stated limit was not believed; "" when there is nothing to say."""
        overflow, reads = err.overflow, ""
        # Its own count of a prompt it answered, the cache reads counted once if they may have been
        # inside input_tokens: a limit below even that is one refusal's words against its count.
        answered = self.largest_measured if self.reads_in_input is False else self.largest_once
        if overflow.window and overflow.window < answered:
            return (f"[window] the endpoint named a limit of {overflow.window:,} tokens, "
                    f"but it has answered {self.largest_measured:,} by its own count; "
                    f"the window stays {self.window:,}")
        if overflow.window and overflow.window < self.largest_measured:  # fits with each read once:
            said = "; its input_tokens include the cache reads, counted once now"
            reads = "" if self.reads_in_input else said
            self.reads_in_input, self.largest_measured = True, answered  # they were in input_tokens
        if not overflow.window and err.sent_tokens < MIN_CONTEXT_WINDOW:
            # A prompt this small can only be refused for max_tokens.
            overflow = replace(overflow, counts_output=True)
        self.counts_output = self.counts_output or overflow.counts_output
        # It counted more than we estimated: size by its count.
        capped = ""
        if overflow.prompt_tokens and err.sent_tokens:
            ratio = overflow.prompt_tokens / err.sent_tokens
            if ratio > MAX_UNDERCOUNT:
                capped = (f"[window] the endpoint counted {overflow.prompt_tokens:,} tokens in a "
                          f"request estimated at {err.sent_tokens:,}, {ratio:.0f} times as many: "
                          "no tokenizer counts that differently; estimates are scaled up "
                          f"{MAX_UNDERCOUNT:.0f} times at most")
            self.undercount = max(self.undercount, min(ratio, MAX_UNDERCOUNT))
        window = learned_window(overflow, window=self.window, sent_tokens=err.sent_tokens,
                                max_tokens=err.max_tokens, largest_accepted=self.largest_accepted)
        if window >= self.window:
            return capped
        if overflow.window:
            said = (f"[window] the endpoint's limit is {window:,} tokens "
                    f"(was assuming {self.window:,})")
            if overflow.window < window:  # smaller than this program can work in
                said = (f"[window] the endpoint's limit is {overflow.window:,} tokens, "
                        f"below the {window:,} this program needs at least; "
                        f"working with {window:,} (was assuming {self.window:,}). "
                        "Use a model with a larger window.")
            self.window_source = "the endpoint's overflow message"
        elif overflow == EMPTY_REPLY_OVERFLOW:
            said = (f"[window] the endpoint answered about {err.sent_tokens:,} tokens "
                    "with an empty reply, as llama.cpp behind LiteLLM does "
                    "when a prompt is over its context size; "
                    f"assuming a window of {window:,} from now on (was {self.window:,}). "
                    "Set CONTEXT_WINDOW to the server's context size (n_ctx) to skip the guess.")
            self.window_source = "an empty reply to a larger request (below its size)"
        else:
            output = f" + {err.max_tokens:,} for the reply" if overflow.counts_output else ""
            said = (f"[window] the endpoint refused about {err.sent_tokens:,} tokens{output} "
                    "without naming its limit; "
                    f"assuming a window of {window:,} from now on (was {self.window:,})")
            self.window_source = "an overflow that named no limit (below the refused size)"
        self.window, self.learned = window, True
        return "\n".join(filter(None, [said + reads, capped]))

    def facts(self) -> dict:
        """What the session log keeps, so --resume starts from what was learned."""
        return {"model": self.model, "window": self.window, "window_source": self.window_source,
                "learned": self.learned, "counts_output": self.counts_output,
                "count_tokens": self.can_count_tokens, "models_api": self.models_api,
                "plain_text": self.plain_text}


def with_retries(call, retry_base_seconds: float, say, retries: int = API_RETRIES):
    """Make an API call; retry what may pass on its own at most `retries` times, saying so
    in one line each time."""
    most = retries
    for attempt in range(1, most + 2):
        try:
            return call()
        except api_failures() as err:
            # An empty reply was tried as plain text too, each time.
            retries = min(1, most) if isinstance(err, EmptyReply) else most
            if attempt > retries or not worth_retrying(err):
                raise
            response = getattr(err, "response", None)
            delay = retry_base_seconds * 2 ** (attempt - 1) * random.uniform(0.8, 1.2)
            # The API's advice, when it asks for longer: a "retry-after: 0" must not make
            # three retries a burst.
            try:
                delay = max(delay, min(float(response.headers.get("retry-after")), 60.0))
            except (AttributeError, TypeError, ValueError):
                pass
            say(f"[api] {api_error_text(err)}; retrying in {delay:.1f}s "
                f"(retry {attempt} of {retries})")
            time.sleep(delay)


# A chunk of nothing but keep-alives: blank lines, SSE comments, ping events.
KEEP_ALIVE = re.compile(r'(?:\n|\r|:[^\n]*\n|event: ping\n|data: \{"type": ?"ping"\}\n)*')


class ReplyEvents:
    """A reply stream's events as (kind, data) pairs, keep-alives left out. Pings and
    comment lines hold a connection open but are not progress: after idle_seconds of
    nothing else, BadReply. (The read timeout covers a stream that sends nothing at all.)"""

    def __init__(self, response, idle_seconds: float):
        self.response, self.idle_seconds = response, idle_seconds
        self.last_news = time.monotonic()
        # Bytes since the last event that were not keep-alives: a reply too slow to finish one.
        self.trickled = 0

    def __iter__(self):
        # The SDK's own decoder, fed bytes we can watch: iterating its Stream would drop pings
        # unseen, skip an event with no event line, and stop at a byte that is not UTF-8.
        for sse in anthropic.Stream.raw_events(httpx2.Response(200, content=self.chunks())):
            try:
                data = sse.json() if sse.data else None
            except (ValueError, RecursionError):  # nested too deep to read is no better
                raise BadReply("the endpoint sent an event that is not JSON: "
                               f"{one_line(sse.data, 60)}") from None
            kind = sse.event or (data.get("type") if isinstance(data, dict) else None)
            if data is not None and kind != "ping":
                self.last_news, self.trickled = time.monotonic(), 0
                yield kind, data

    def chunks(self):
        # A byte that is not UTF-8 becomes U+FFFD, not a crash.
        for text in self.response.iter_text():
            self.trickled += 0 if KEEP_ALIVE.fullmatch(text) else len(text)
            yield text.encode()
            # Checked after the chunk's events: news in it counts.
            if time.monotonic() - self.last_news > self.idle_seconds:
                raise BadReply(self.stalled())

    def stalled(self) -> str:
        if self.trickled:
            return (f"the endpoint's reply stalled: {self.trickled:,} bytes "
                    f"in {self.idle_seconds:g}s, not one whole event")
        return f"the endpoint sent nothing but pings or comments for {self.idle_seconds:g}s"


def stream_reply(client, idle: float, request: dict, on_text=None) -> tuple:
    """One streamed request: (content, stop_reason, usage). Text goes to on_text as it arrives;
    idle: the seconds a stream may stay silent."""
    with client.messages.create(**request, stream=True) as stream:
        try:
            if "json" in stream.response.headers.get("content-type", ""):
                return reply_from_body(stream.response.read(), on_text)
            return reply_from_events(ReplyEvents(stream.response, idle), on_text)
        except httpx2.TimeoutException:
            raise BadReply(f"the endpoint sent nothing for {idle:g}s") from None
        except httpx2.HTTPError as err:  # a dropped connection, a body that does not decode
            raise BadReply(f"the reply broke off ({err or type(err).__name__})") from None


@dataclass(frozen=True)
class Connection:
    """What a call to the model needs, made once for an agent: the client; what the session
    knows of the endpoint (shared with subagents, and learned into as calls go); how long to
    pause before a retry and to wait for a silent stream; the screen (a retry said, the
    spinner, the text as it streams); the secrets, which no request carries."""
    client: "anthropic.Anthropic"
    endpoint: "Endpoint"
    retry_base_seconds: float
    idle: float
    screen: Screen
    secrets: Redactor
    retries: int = API_RETRIES  # of a call that may pass on its own (API_RETRIES)

    def say(self, text: str, style: str = "") -> None:
        say_on(self.screen, text, style)


@dataclass(frozen=True)
class Answer:
    """A reply, and what it cost: the caller adds the usage up and logs it."""
    message: dict               # the assistant message, strings_only dicts
    stop_reason: str
    usage: dict
    prompt_tokens: int | None   # the prompt's size by usage; None when usage is not trusted
    sent_tokens: int = 0        # the prompt's size as estimated before it was sent
    note: str = ""              # what was learned of the endpoint, said once the reply is shown
    seconds: float = 0.0        # from the request sent to the reply whole, retries included

    @property
    def figures(self) -> dict:
        """The usage as the session keeps it: every key of USAGE_KEYS, 0 where not given."""
        return usage_figures(self.usage)

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens or self.sent_tokens

    @property
    def summary(self) -> str:
        """What a summary reply keeps: the text in <summary>; "(no reply)" is not a summary."""
        return extract_summary(said_text(self.message))


def own_connection(connection: Connection, on_request) -> tuple:
    """(a copy of the connection with an HTTP client of its own, what closes it), for a
    request on another thread that may have to be cut: every request it sends goes through
    on_request. The endpoint's facts are a copy too: what that request learns stays there.
    The certificates are loaded once (it takes tens of milliseconds)."""
    http = httpx2.Client(verify=tls_context(), event_hooks={"request": [on_request]})
    try:
        client = connection.client.with_options(http_client=http)
    except BaseException:
        http.close()  # it will not run: nothing may keep its connections open
        raise
    own = replace(connection, client=client, endpoint=copy.copy(connection.endpoint))
    return own, http.close


@cache
def tls_context():
    return httpx2.create_ssl_context()  # as a client makes its own: the system's or SSL_CERT_FILE's


def send_request(connection: Connection, request: dict, sent_tokens: int, on_text=None,
                 label: str = "waiting for the model") -> Answer:
    """One request, retried on passing failures. Raises ContextOverflow when the endpoint
    says the prompt did not fit, however it words it; other failures as they come."""
    def attempt():
        shown = []
        with Spinner(connection.screen.spinner_to, label) as spinner:
            def show(chunk):
                spinner.stop()  # the first token replaces the spinner
                shown.append(chunk)
                on_text(chunk)
            try:
                shown_by = show if on_text else None
                return reply_in_a_form_it_takes(connection, request, shown_by, notes)
            except KeyboardInterrupt:
                raise  # model_reply ends the line: the word held back was never shown
            except BaseException:
                if shown:  # a reply cut off mid-line: what is said next starts on a line of its own
                    on_text("\n")
                raise
    max_tokens, notes, started = request["max_tokens"], [], time.monotonic()
    secrets, endpoint = connection.secrets, connection.endpoint
    # The last nets: every text can be encoded (a name with bytes that are not UTF-8 shows
    # U+FFFD), and what is sent holds no secret, in any form.
    request = redacted_request(secrets, well_formed_deep(request))
    if endpoint.plain_text:
        request = plain_text_request(request)
    try:
        content, stop_reason, usage = with_retries(attempt, connection.retry_base_seconds,
                                                   connection.say, connection.retries)
    # Empty every time: a prompt over the window, if it was large for what is known of it.
    except EmptyReply:
        if endpoint.overflowed_silently(sent_tokens):
            raise ContextOverflow(EMPTY_REPLY_OVERFLOW, sent_tokens, max_tokens) from None
        raise
    except (anthropic.APIStatusError, ErrorEvent) as err:
        overflow = context_overflow(err, max_tokens=max_tokens)
        if overflow:
            raise ContextOverflow(overflow, sent_tokens, max_tokens) from err
        raise
    overflow = context_overflow(stop_reason=stop_reason)
    if overflow:
        raise ContextOverflow(overflow, sent_tokens, max_tokens)
    prompt_tokens, usage = usage_prompt_tokens(endpoint, usage, sent_tokens)
    endpoint.accepted(prompt_tokens or sent_tokens, max_tokens, measured=bool(prompt_tokens),
                      usage=usage)
    # A secret the model repeats in its text goes no further. Its tool inputs run as written (a
    # .env value may be an ordinary word it means); they are redacted wherever they are sent,
    # logged, saved or shown.
    content = [secrets.redact_deep(b) if b.get("type") == "text" else b for b in content]
    return Answer({"role": "assistant", "content": content}, stop_reason, usage, prompt_tokens,
                  sent_tokens, " ".join(notes), time.monotonic() - started)


def reply_in_a_form_it_takes(connection: Connection, request: dict, on_text, notes: list) -> tuple:
    """stream_reply; after an empty reply, at once the same request as plain text, in case
    the server's chat template takes only strings. Plain text is kept for the session once
    it answered where the blocks got nothing on two requests: one passing failure is not
    enough to give up the prompt cache."""
    endpoint, client, idle = connection.endpoint, connection.client, connection.idle
    try:
        return stream_reply(client, idle, request, on_text)
    except EmptyReply:
        strings_only = plain_text_request(request)
        if endpoint.plain_text or strings_only == request:
            raise
        answer = stream_reply(client, idle, strings_only, on_text)
        endpoint.plain_text_wins += 1
        if endpoint.plain_text_wins >= PLAIN_TEXT_PROOF:
            endpoint.plain_text = True
            notes.append(PLAIN_TEXT_NOTE)
        return answer


def model_reply(connection: Connection, request: dict, sent_tokens: int, show_text: bool,
                label: str = "waiting for the model") -> Answer:
    """send_request, with the reply's text shown as it streams when show_text. After
    Ctrl-C the text the user saw rides on the exception (stop.partial), so the history
    can keep it."""
    shown = StreamedText(connection.screen) if show_text else None
    try:
        answer = send_request(connection, request, sent_tokens, on_text=shown, label=label)
    except KeyboardInterrupt as stop:
        if shown:
            shown.finish(complete=False)
            stop.partial = shown.shown_text
        raise
    if shown:
        shown.finish()
    if answer.note:
        connection.say(answer.note, "dim")
    return answer


def summary_reply(connection: Connection, request: dict, sent_tokens: int) -> Answer:
    """A summary's request sent, its text not shown as it streams. A call that failed raises
    SummaryError; a prompt too long, ContextOverflow."""
    with failed_as_summary_error():
        return model_reply(connection, request, sent_tokens, show_text=False,
                           label="writing the summary")


def make_reply_sendable(reply: dict, stop_reason: str, *, ids_used: set, max_output: int) -> tuple:
    """Fix what would break the next request: a tool call cut off by max_tokens (dropped,
    with a note for the model), a tool_use id used before (renamed), and an input that is
    not a JSON object or nests too deep (kept as {} so later requests stay valid, and
    answered with an error). Returns (reply, the notes for the model: a text block or none,
    {tool_use id: why it will not run})."""
    content, notes, refused = list(reply["content"]), [], {}
    if stop_reason == "max_tokens" and content and content[-1].get("type") == "tool_use":
        cut = content.pop()  # its input is incomplete: never run it
        note = (f"your reply reached the output limit ({max_output:,} tokens) "
                f"in the middle of a call to {cut['name']}, so that call was not run. "
                "Continue from there, and split large content into several smaller calls.")
        notes = [own_text("note", f"{NOTE_MARKER}: {note}]")]
    seen = set(ids_used)
    for k, block in enumerate(content):
        if block.get("type") == "tool_use":
            unique = fresh_id(block["id"], seen)
            content[k] = {**block, "id": unique}
            if problem := input_problem(block["input"]):
                refused[unique] = f"{problem}, so it was not run"
                content[k]["input"] = {}
    if content == reply["content"]:
        return reply, notes, refused  # the same object: the token counter's anchor still knows it
    content = content or [{"type": "text", "text": "(reply cut off)"}]
    return {**reply, "content": content}, notes, refused


def usage_prompt_tokens(endpoint, usage: dict, estimate: int) -> tuple:
    """(the prompt's size by usage, the usage with each token counted once). The size is
    None when usage cannot be trusted, and the estimate stands.

    Anthropic's input_tokens leave out the cache reads; some endpoints (Kimi) include
    them, and adding cache_read_input_tokens there counts them twice. A reply with fewer
    input tokens than cache reads proves the first way; reads-included is believed when
    adding them would double the size past what was sent, or when the endpoint names a
    limit that a prompt it answered passes only with the reads added (learn_from). Either
    is then remembered; until then the larger reading stands (compacting early is safe).
    A size that is missing, zero or under half the estimate is distrusted (believing it
    could overflow the window); one over twice the estimate is kept (a tokenizer can
    count that much more, and compacting early is the safe side). /context says which."""
    uncached, read = usage.get("input_tokens", 0), usage.get("cache_read_input_tokens", 0)
    written = usage.get("cache_creation_input_tokens", 0)
    size, counted = uncached + read + written, usage
    if read and uncached < read:
        endpoint.reads_in_input = False
    elif read and endpoint.reads_in_input is not False:
        once = uncached + written
        # Adding the reads would double the size past what was sent; without them it fits.
        doubled = size > 1.6 * estimate and abs(once - estimate) <= 0.3 * estimate
        if endpoint.reads_in_input or doubled:
            endpoint.reads_in_input = True
            size, counted = once, {**usage, "input_tokens": uncached - read}
    if size <= 0:
        endpoint.usage_note = ("the endpoint reported no input usage on the last reply; "
                               "sizes are estimates")
        return None, counted
    if size < estimate / 2:
        endpoint.usage_note = (f"usage distrusted: the endpoint reported {size:,} prompt tokens "
                               f"where about {estimate:,} were sent; sizes are estimates")
        return None, counted
    if size > estimate * 2:
        endpoint.usage_note = (f"the endpoint counts {size:,} prompt tokens "
                               f"where the estimate was {estimate:,}; its count is used")
    elif endpoint.reads_in_input:
        endpoint.usage_note = "this endpoint's input_tokens include the cache reads; counted once"
    else:
        endpoint.usage_note = ""
    return size, counted


def usage_figures(usage: dict) -> dict:
    """A call's usage as the figures the session keeps: every key of USAGE_KEYS, 0 if not
    given."""
    return {key: usage.get(key, 0) for key in USAGE_KEYS}


# Windows of well-known models, for endpoints without the Models API (none of the
# compatible providers has one). First match wins; the id may carry a provider prefix.
KNOWN_WINDOWS = [  # (pattern, window, what it matches)
    # Anthropic models overview: 200k (1M only behind a beta header)
    (r"claude-", 200_000, "claude-*"),
    # DeepSeek API docs: deepseek-chat / deepseek-reasoner, 128K
    (r"deepseek-", 131_072, "deepseek-*"),
    (r"kimi-k2-0711", 131_072, "kimi-k2-0711"),     # Moonshot docs: the first Kimi K2 release, 128K
    # Moonshot docs: kimi-k2-0905, k2-turbo, k2.5, 256K
    (r"kimi-k2", 262_144, "kimi-k2*"),
    (r"glm-4\.5", 128_000, "glm-4.5*"),             # Z.ai docs: GLM-4.5, 128K
    (r"glm-(4\.[6-9]|5)", 200_000, "glm-4.6 and later"),  # Z.ai docs: GLM-4.6 and later, 200K
    (r"minimax-m2", 204_800, "MiniMax-M2*"),        # MiniMax docs: MiniMax-M2 to M2.7, 204,800
]


def known_window(model: str) -> tuple | None:
    """(window, what the table's row matches) for a well-known model id, else None."""
    for pattern, window, label in KNOWN_WINDOWS:
        if re.search(pattern, model, re.IGNORECASE):
            return window, label
    return None


def models_api_window(client, model: str, endpoint: Endpoint) -> int | None:
    """max_input_tokens from the Models API; a 404 is remembered (most compatible endpoints)."""
    if not endpoint.models_api:
        return None
    try:
        # No retries and a short timeout: start-up stays quick.
        info = client.with_options(max_retries=0, timeout=10).models.retrieve(model)
    except anthropic.NotFoundError:
        endpoint.models_api = False
        return None
    except (anthropic.AuthenticationError, anthropic.PermissionDeniedError,
            anthropic.APIConnectionError) as err:
        problem = f"{api_error_text(err).rstrip('.')}. {what_to_do(err)}"
        endpoint.startup_problem = problem.strip()  # said at start
        return None
    except anthropic.APIError as err:
        if key_refused(err):  # a proxy's own way of refusing a key
            endpoint.startup_problem = f"{api_error_text(err).rstrip('.')}. {what_to_do(err)}"
        return None
    window = getattr(info, "max_input_tokens", None)
    return window if is_token_count(window) and window >= MIN_CONTEXT_WINDOW else None


def discover_endpoint(client, model: str, logged: dict | None = None, *,
                      configured: int | None = None) -> Endpoint:
    """The window, from CONTEXT_WINDOW (configured, already checked), else the Models API,
    else the table of well-known models, else 200,000. A window a resumed session learned
    from an overflow caps the last three. The Models API is asked even when CONTEXT_WINDOW
    is set: the answer also says whether the key, the URL and the model are right (unless a
    resumed session already learned that the endpoint has no Models API)."""
    logged = logged or {}
    endpoint = Endpoint(DEFAULT_CONTEXT_WINDOW, DEFAULT_WINDOW_SOURCE, model=model,
                        counts_output=bool(logged.get("counts_output")),
                        can_count_tokens=logged.get("count_tokens", True) is not False,
                        models_api=logged.get("models_api", True) is not False,
                        plain_text=logged.get("plain_text") is True)
    window = models_api_window(client, model, endpoint)
    if configured:
        endpoint.window, endpoint.window_source = configured, "CONTEXT_WINDOW"
    elif window:
        endpoint.window, endpoint.window_source = window, MODELS_API_SOURCE
    elif row := known_window(model):
        endpoint.window = row[0]
        endpoint.window_source = f"the built-in table of known models ({row[1]})"
    learned = logged.get("window")  # CONTEXT_WINDOW, set by the user, may correct a learned window
    if logged.get("learned") and not configured and isinstance(learned, int) and \
            MIN_CONTEXT_WINDOW <= learned < endpoint.window:
        endpoint.window, endpoint.learned = learned, True
        source = logged.get("window_source") or "an overflow earlier in this session"
        endpoint.window_source = str(source)
    return endpoint


def count_tokens(connection: Connection, request: dict, estimate: int) -> int | None:
    """The endpoint's own count of a request, or None. Where count_tokens is not offered
    (404, 405, 501), or answers far below what is sent, it is never asked again."""
    endpoint = connection.endpoint
    if not endpoint.can_count_tokens:
        return None
    request = {k: v for k, v in request.items() if k != "max_tokens"}
    # The last nets, as send_request's.
    request = redacted_request(connection.secrets, well_formed_deep(request))
    try:
        counted = connection.client.messages.count_tokens(**request).input_tokens
    except anthropic.APIStatusError as err:
        # Anything else: not this time.
        endpoint.can_count_tokens = err.status_code not in (404, 405, 501)
        return None
    except anthropic.APIError:
        return None
    if is_token_count(counted) and counted >= estimate / 2:
        return counted
    endpoint.can_count_tokens = False  # a count far below what is sent is not a count of it
    return None
