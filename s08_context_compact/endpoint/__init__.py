"""Talking to the endpoint: requests, retries, streaming, replies, and a prompt that did not fit.

What the rest of the program may use from this folder."""

from .api_errors import api_error_text, api_failures, explain_api_error, failed_as_summary_error
from .model_calls import (API_RETRIES, CONNECT_TIMEOUT, DEFAULT_WINDOW_SOURCE, IDLE_TIMEOUT,
                          RETRY_BASE_SECONDS, Answer, Connection, count_tokens,
                          discover_endpoint, Endpoint, make_reply_sendable, model_reply,
                          own_connection, send_request, summary_reply)
from .overflow import MAX_CONTEXT_WINDOW, MIN_CONTEXT_WINDOW, ContextOverflow
from .replies import extract_summary, SummaryError
from .prompt_cache import CACHE_TTLS, cache_mark, marked_request, with_cache_breakpoints
from .sdk import anthropic, httpx2, make_client
