"""The HTTP client of the remote embedding providers, and the one place httpx errors are mapped.

HTTP failures become :class:`~fallback.errors.EmbeddingProviderError` here and nowhere else:
429, 5xx, transport errors and timeouts are retryable, other 4xx are not; API keys are
replaced by ``***`` in messages.
"""

from __future__ import annotations

import contextlib
import email.utils
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from fallback.errors import EmbeddingProviderError

if TYPE_CHECKING:  # httpx is imported on first use, so `qmdbridge search` starts fast
    import httpx

__all__ = ["HttpClient", "error_from_response", "parse_retry_after"]

# Provider error text kept in our messages, in characters.
MAX_ERROR_TEXT_CHARS = 300
# Secrets shorter than this are not redacted (see _redact).
MIN_SECRET_CHARS = 6
# Error text that marks a 4xx (or anything) as a transient quota problem (spec 6.4).
_RETRYABLE_TEXT_RE = re.compile(
    r"rate limit|too many requests|resource has been exhausted|tokens per day|cloudflare",
    re.IGNORECASE,
)


def parse_retry_after(value: str | None, *, now_s: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date, measured
    from ``now_s``, epoch seconds); None when missing or unparsable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    with contextlib.suppress(ValueError):
        return max(0.0, float(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except ValueError:  # Python 3.10+: no date, or one that does not exist
        return None
    current = time.time() if now_s is None else now_s
    return max(0.0, when.timestamp() - current)


def _redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        # Shorter values are no real keys, and replacing them would garble the text.
        if len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, "***")
    return text


def _error_text(response: httpx.Response) -> str:
    """The provider's error message: ``error.message`` of a JSON body, else the raw text."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.text.strip()
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
    if isinstance(body, list) and body and isinstance(body[0], dict):
        err = body[0].get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
    return response.text.strip()


def error_from_response(provider_id: str, response: httpx.Response, *,
                        secrets: Sequence[str] = ()) -> EmbeddingProviderError:
    """The error for a non-2xx response: the provider's text (redacted, cut to
    :data:`MAX_ERROR_TEXT_CHARS`); 429, 5xx and quota messages retryable, with Retry-After."""
    status = response.status_code
    text = _redact(_error_text(response), secrets)
    if len(text) > MAX_ERROR_TEXT_CHARS:
        text = text[:MAX_ERROR_TEXT_CHARS] + "..."
    retryable = status == 429 or status >= 500 or bool(_RETRYABLE_TEXT_RE.search(text))
    retry_after = parse_retry_after(response.headers.get("retry-after")) if retryable else None
    return EmbeddingProviderError(provider_id, text or response.reason_phrase or "request failed",
                                  status=status, retryable=retryable, retry_after_s=retry_after)


class HttpClient:
    """One provider's ``httpx.AsyncClient``, created on first use; relative paths are joined
    to ``base_url`` (by httpx). All methods raise ``EmbeddingProviderError``."""

    def __init__(self, *, provider_id: str, base_url: str, headers: Mapping[str, str],
                 secrets: Sequence[str] = (), timeout_s: float = 120.0) -> None:
        """``headers`` go with every request (auth included), ``secrets`` (API keys) are
        redacted from any message, ``timeout_s`` is httpx's per-request backstop in seconds."""
        self.provider_id = provider_id
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers)
        self.secrets = tuple(s for s in secrets if s)
        self.timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request; return the 2xx response or raise ``EmbeddingProviderError``
        (transport errors and timeouts retryable)."""
        import httpx

        if self._client is None:  # created on first use
            self._client = httpx.AsyncClient(base_url=self.base_url, headers=self.headers,
                                             timeout=httpx.Timeout(self.timeout_s))
        try:
            response = await self._client.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise EmbeddingProviderError(self.provider_id, f"request timed out ({type(exc).__name__})",
                                         retryable=True) from exc
        except httpx.TransportError as exc:
            detail = _redact(str(exc) or type(exc).__name__, self.secrets)
            raise EmbeddingProviderError(self.provider_id, f"request failed: {detail}",
                                         retryable=True) from exc
        if response.status_code >= 400:
            raise error_from_response(self.provider_id, response, secrets=self.secrets)
        return response

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request (``httpx`` keyword arguments); return the decoded JSON body."""
        response = await self.request(method, path, **kwargs)
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise EmbeddingProviderError(
                self.provider_id, f"invalid JSON in response from {response.request.url.path}",
                status=response.status_code) from exc

    async def post_json(self, path: str, payload: Any) -> Any:
        """POST ``payload`` as JSON; return the decoded JSON body."""
        return await self.json("POST", path, content=orjson.dumps(payload),
                               headers={"content-type": "application/json"})

    async def aclose(self) -> None:
        """Close the underlying client (safe to call twice)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
