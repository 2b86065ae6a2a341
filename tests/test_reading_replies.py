"""Reading a streamed reply on top of the SDK's decoder: what its own Stream would get
wrong for compatible endpoints (events with no event line, a character cut between two
reads) and what the idle timeout must still allow (a slow stream that keeps making progress)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import blocks, wait_until
from s08_context_compact.offline.fake_anthropic import text

START = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                                              "content": [], "stop_reason": None,
                                              "usage": {"input_tokens": 900, "output_tokens": 1}}}
TEXT_BLOCK = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
END = [{"type": "content_block_stop", "index": 0},
       {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
       {"type": "message_stop"}]


def delta(words: str) -> dict:
    return {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": words}}


def sse(data: dict, name: bool = True) -> bytes:
    line = f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
    return ((f"event: {data['type']}\n" if name else "") + line).encode()


class ScriptedStream:
    """A Messages endpoint on 127.0.0.1 that answers every POST with the same 200 stream,
    written piece by piece: bytes are sent as they are, a callable is waited on first."""

    def __init__(self, *pieces):
        self.pieces, self.requests = pieces, 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["content-length"]))
                owner.requests += 1
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for piece in owner.pieces:
                    if callable(piece):
                        wait_until(piece)
                    else:
                        self.wfile.write(piece)
                        self.wfile.flush()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_events_without_an_event_line_are_read_by_their_type(s08, make_agent):
    # The SDK's own Stream skips an event that has no `event:` line; some proxies send none.
    events = [START, TEXT_BLOCK, delta("read without event lines"), *END]
    with ScriptedStream(b"".join(sse(e, name=False) for e in events)) as server:
        agent = make_agent(server=server)
        messages = []
        s08.take_turn(agent, messages, "hello")
    assert messages[-1]["content"] == [{"type": "text", "text": "read without event lines"}]
    assert server.requests == 1 and "API error" not in agent.out.text


def test_an_error_event_without_an_event_line_is_still_an_error_event(s08, make_agent):
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "tools.0: something odd"}}
    with ScriptedStream(sse(START, name=False) + sse(error, name=False)) as server:
        agent = make_agent(server=server)
        s08.take_turn(agent, [], "hello")
    assert "error inside the reply stream: invalid_request_error: tools.0: something odd" in agent.out.text
    assert server.requests == 1, "not retried: the same request would fail the same way"


def test_a_character_cut_between_two_reads_arrives_whole(s08, make_agent):
    cut = sse(delta("café ☕ done"))
    middle = cut.index("é".encode()) + 1  # inside the two bytes of é
    agent = None
    first = sse(START) + sse(TEXT_BLOCK) + sse(delta("first, ")) + cut[:middle]
    rest = cut[middle:] + b"".join(sse(e) for e in END)
    # the second piece waits until the first was read and shown: the two arrive apart
    with ScriptedStream(first, lambda: agent is not None and "first, " in agent.out.text, rest) as server:
        agent = make_agent(server=server)
        messages = []
        s08.take_turn(agent, messages, "hello")
    assert blocks(messages[-1]) == [{"type": "text", "text": "first, café ☕ done"}]
    assert "\ufffd" not in agent.out.text and server.requests == 1


def test_a_slow_stream_that_keeps_sending_text_is_not_abandoned(s08, make_agent, fake):
    agent = make_agent(idle=1.0)
    words = "word " * 64  # eight pieces of 40 characters, 0.3 s apart: 2.4 s in all, never 1 s idle
    fake.reply(dict(text(words), chunk_delay=0.3))
    messages = []
    s08.take_turn(agent, messages, "hello")
    assert blocks(messages[-1]) == [{"type": "text", "text": words}]
    assert "pings or comments" not in agent.out.text and len(fake.requests) == 1
