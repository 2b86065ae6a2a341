"""Talking to the endpoint: requests, retries, streaming, replies, and a prompt that did not fit.

What the rest of the program may use from this folder."""

from .model_calls import (anthropic, httpx2, CONNECT_TIMEOUT, DEFAULT_WINDOW_SOURCE, IDLE_TIMEOUT, RETRY_BASE_SECONDS,
                       Answer, api_error_text, api_failures, Connection, count_tokens, discover_endpoint, Endpoint,
                       explain_api_error, make_client, make_reply_sendable, model_reply, own_connection,
                       send_request)
from .overflow import MAX_CONTEXT_WINDOW, MIN_CONTEXT_WINDOW, ContextOverflow
from .replies import extract_summary, SummaryError
from .prompt_cache import CACHE_TTLS, cache_mark, with_cache_breakpoints
