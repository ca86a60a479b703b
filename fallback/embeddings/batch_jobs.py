"""Provider batch-job APIs (openai, voyage, gemini) and the runner that falls back inline.

A job uploads the texts as one JSONL file, is polled every ``remote.batch.pollIntervalMs``
until done (or ``timeoutMinutes`` pass), and its result file is mapped back by ``custom_id``;
any per-line error or missing vector fails the whole job. :class:`BatchRunner` turns batch
mode off after :data:`BATCH_FAILURE_LIMIT` failures (a timeout is retried once), or at once
when the API is not available, and the provider embeds inline. Gemini follows Google's public
Batch API, untested against the service. Source: spec 6.3; OpenClaw ``batch-*.ts``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import orjson

from fallback.embeddings._http import HttpClient
from fallback.errors import EmbeddingProviderError
from fallback.settings import RemoteBatchSettings

__all__ = ["BATCH_FAILURE_LIMIT", "BatchJobApi", "BatchRunner", "BatchState", "GeminiBatchJobs",
           "OpenAIBatchJobs", "VoyageBatchJobs", "custom_id_for", "run_batch_job"]

# Failures after which batch mode is disabled for the provider (spec 6.3).
BATCH_FAILURE_LIMIT = 2
# Requests per job: the providers' limit (OpenAI, Voyage and Gemini accept 50,000).
MAX_REQUESTS_PER_JOB = 50_000
# Marker in errors that disable batch mode at once (the API does not exist for this endpoint).
UNAVAILABLE_MARKER = "batch API not available"

_DONE = frozenset({"completed", "succeeded", "done"})
_FAILED = frozenset({"failed", "expired", "cancelled", "canceled", "cancelling"})


def custom_id_for(index: int, text: str) -> str:
    """Stable request id of text ``index``: sha256 hex of ``"<index>:<sha256(text)>"``."""
    text_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return hashlib.sha256(f"{index}:{text_hash}".encode()).hexdigest()


@dataclass(frozen=True)
class BatchState:
    """One observation of a batch job: its id, the provider's state (lower-cased, prefix
    removed), the result file's id once done, and the provider's error message."""

    job_id: str
    state: str
    output_file: str | None = None
    error: str | None = None


def _norm_state(value: Any) -> str:
    return str(value or "unknown").lower().removeprefix("batch_state_").removeprefix("job_state_")


def _message(obj: Any) -> str | None:
    """``obj.message`` / ``obj.error.message`` / ``obj.body.error.message`` if present."""
    if not isinstance(obj, dict):
        return str(obj) if obj else None
    if isinstance(obj.get("message"), str):
        return obj["message"]
    for key in ("error", "body"):
        inner = _message(obj.get(key)) if obj.get(key) else None
        if inner:
            return inner
    return None


def parse_result_lines(provider_id: str, job_id: str, text: str,
                       expected: Sequence[str]) -> dict[str, list[float]]:
    """Map a JSONL result file (OpenAI/Voyage or Gemini lines) to ``{custom_id: vector}``.
    Raises ``EmbeddingProviderError``: an error line, an empty embedding, bad JSON, an
    ``expected`` id missing."""
    vectors: dict[str, list[float]] = {}
    errors: list[str] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise EmbeddingProviderError(provider_id, f"batch {job_id} result file has a line "
                                                      "that is not JSON") from exc
        if not isinstance(line, dict):
            raise EmbeddingProviderError(provider_id, f"batch {job_id} result line is not an object")
        cid = line.get("custom_id") or line.get("key") or line.get("request_id")
        if not cid:
            continue
        response = line.get("response") or {}
        status = response.get("status_code", 200)
        failure = _message(line.get("error")) if line.get("error") else None
        if failure is None and isinstance(status, int) and status >= 400:
            failure = _message(response.get("body")) or f"HTTP {status}"
        if failure is None and response.get("error"):
            failure = _message(response.get("error"))
        if failure:
            errors.append(f"{cid[:12]}: {failure}")
            continue
        body = response.get("body") or {}
        data = body.get("data") if isinstance(body, dict) else None
        vector = (data[0].get("embedding") if isinstance(data, list) and data
                  else (response.get("embedding") or line.get("embedding") or {}).get("values"))
        if not vector:
            errors.append(f"{cid[:12]}: empty embedding")
            continue
        vectors[cid] = vector
    if errors:
        raise EmbeddingProviderError(provider_id, f"batch {job_id} failed: {'; '.join(errors[:5])}")
    missing = [cid for cid in expected if cid not in vectors]
    if missing:
        raise EmbeddingProviderError(
            provider_id, f"batch {job_id} missing {len(missing)} embedding responses")
    return vectors


async def run_batch_job(api: BatchJobApi, requests: Sequence[tuple[str, str]], *, wait: bool,
                        poll_interval_s: float, timeout_s: float) -> dict[str, list[float]]:
    """Submit one job, wait for it (polled every ``poll_interval_s``), download and map its
    results by custom id. Raises ``EmbeddingProviderError``: the job failed, expired or was
    cancelled; it still runs and ``wait`` is false; it ran past ``timeout_s`` seconds
    (retryable); or its results are incomplete."""
    pid = api.provider_id
    state = await api.submit(requests)
    started = anyio.current_time()
    while state.state not in _DONE:
        if state.state in _FAILED:
            detail = f": {state.error}" if state.error else ""
            raise EmbeddingProviderError(pid, f"batch {state.job_id} {state.state}{detail}")
        if not wait:
            raise EmbeddingProviderError(
                pid, f"batch {state.job_id} still {state.state}; remote.batch.wait is false")
        if anyio.current_time() - started > timeout_s:
            raise EmbeddingProviderError(
                pid, f"batch {state.job_id} timed out after {timeout_s:g}s",
                retryable=True)
        await anyio.sleep(poll_interval_s)
        state = await api.poll(state.job_id)
    if not state.output_file:
        raise EmbeddingProviderError(pid, f"batch {state.job_id} completed without output file")
    text = await api.fetch_results(state)
    return parse_result_lines(pid, state.job_id, text, [cid for cid, _ in requests])


class OpenAIBatchJobs:
    """OpenAI Batch API: ``/files`` (purpose ``batch``) + ``/batches`` on ``/v1/embeddings``."""

    provider_id = "openai"
    completion_window = "24h"

    def __init__(self, *, http: HttpClient, model: str, dimensions: int | None = None) -> None:
        """Args: the provider's HTTP client, model id and optional ``dimensions``."""
        self.http = http
        self.model = model
        self.dimensions = dimensions

    def _line(self, custom_id: str, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "input": text}
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}

    def _create_body(self, file_id: str) -> dict[str, Any]:
        return {"input_file_id": file_id, "endpoint": "/v1/embeddings",
                "completion_window": self.completion_window,
                "metadata": {"source": "qmdbridge-memory"}}

    def _state(self, body: Any) -> BatchState:
        if not isinstance(body, dict) or not body.get("id"):
            raise EmbeddingProviderError(self.provider_id, "batch response has no id")
        errors = body.get("errors") or {}
        data = errors.get("data") if isinstance(errors, dict) else None
        error = _message(data[0]) if isinstance(data, list) and data else None
        return BatchState(job_id=str(body["id"]), state=_norm_state(body.get("status")),
                          output_file=body.get("output_file_id") or None, error=error)

    async def submit(self, requests: Sequence[tuple[str, str]]) -> BatchState:
        """Upload the JSONL file and create the batch job."""
        jsonl = b"\n".join(orjson.dumps(self._line(cid, text)) for cid, text in requests)
        uploaded = await self.http.json("POST", "files", data={"purpose": "batch"}, files={
            "file": ("memory-embeddings.jsonl", jsonl, "application/jsonl")})
        file_id = uploaded.get("id") if isinstance(uploaded, dict) else None
        if not file_id:
            raise EmbeddingProviderError(self.provider_id, "batch file upload returned no id")
        return self._state(await self.http.post_json("batches", self._create_body(file_id)))

    async def poll(self, job_id: str) -> BatchState:
        """GET ``/batches/{id}``."""
        return self._state(await self.http.json("GET", f"batches/{job_id}"))

    async def fetch_results(self, state: BatchState) -> str:
        """GET ``/files/{output_file_id}/content``."""
        return (await self.http.request("GET", f"files/{state.output_file}/content")).text


class VoyageBatchJobs(OpenAIBatchJobs):
    """Voyage Batch API: same file/batch flow, ``request_params`` carry model and input type
    (construct without ``dimensions``)."""

    provider_id = "voyage"
    completion_window = "12h"

    def _line(self, custom_id: str, text: str) -> dict[str, Any]:
        return {"custom_id": custom_id, "body": {"input": [text]}}

    def _create_body(self, file_id: str) -> dict[str, Any]:
        return {**super()._create_body(file_id),
                "request_params": {"model": self.model, "input_type": "document"}}


class GeminiBatchJobs:
    """Gemini Batch API (best-effort, see the module docstring)."""

    provider_id = "gemini"

    def __init__(self, *, http: HttpClient, model_path: str) -> None:
        """Args: the provider's HTTP client and ``models/<model>``."""
        self.http = http
        self.model_path = model_path

    def _prefixed(self, kind: str) -> str:
        """``https://host/v1beta`` -> ``https://host/<kind>/v1beta`` (upload, download)."""
        base = self.http.base_url
        scheme, _, rest = base.partition("://")
        host, _, path = rest.partition("/")
        return f"{scheme}://{host}/{kind}/{path}".rstrip("/")

    @staticmethod
    def _state(body: Any) -> BatchState:
        if not isinstance(body, dict) or not body.get("name"):
            raise EmbeddingProviderError("gemini", "batch response has no name")
        meta: dict[str, Any] = body.get("metadata") or {}
        response: dict[str, Any] = body.get("response") or {}
        state = body.get("state") or meta.get("state")
        output = None
        for holder in (body.get("outputConfig"), body.get("output"), meta.get("output"),
                       response, response.get("output")):
            if isinstance(holder, dict):
                output = (holder.get("responsesFile") or holder.get("file")
                          or holder.get("fileId") or output)
        if state is None and body.get("done"):
            state = "failed" if body.get("error") else "succeeded"
        return BatchState(job_id=str(body["name"]), state=_norm_state(state), output_file=output,
                          error=_message(body.get("error")))

    async def submit(self, requests: Sequence[tuple[str, str]]) -> BatchState:
        """Upload the JSONL file (multipart/related) and call ``asyncBatchEmbedContent``."""
        jsonl = b"\n".join(orjson.dumps({"key": cid, "request": {
            "content": {"parts": [{"text": text}]}, "task_type": "RETRIEVAL_DOCUMENT"}})
            for cid, text in requests)
        boundary = "qmdbridge-" + hashlib.sha256(jsonl).hexdigest()[:16]
        meta = orjson.dumps({"file": {"displayName": f"memory-embeddings-{boundary}",
                                      "mimeType": "application/jsonl"}})
        body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode()
                + meta + f"\r\n--{boundary}\r\nContent-Type: application/jsonl\r\n\r\n".encode()
                + jsonl + f"\r\n--{boundary}--\r\n".encode())
        uploaded = await self.http.json(
            "POST", f"{self._prefixed('upload')}/files?uploadType=multipart", content=body,
            headers={"content-type": f"multipart/related; boundary={boundary}"})
        file_name = (uploaded.get("name") or (uploaded.get("file") or {}).get("name")
                     if isinstance(uploaded, dict) else None)
        if not file_name:
            raise EmbeddingProviderError(self.provider_id, "batch file upload returned no name")
        payload = {"batch": {"displayName": "memory-embeddings",
                             "inputConfig": {"file_name": file_name}}}
        try:
            created = await self.http.post_json(f"{self.model_path}:asyncBatchEmbedContent",
                                                payload)
        except EmbeddingProviderError as exc:
            if exc.status == 404:
                raise EmbeddingProviderError(
                    self.provider_id, f"{UNAVAILABLE_MARKER} (asyncBatchEmbedContent returned 404 "
                    "for this model/baseUrl)", status=404) from exc
            raise
        return self._state(created)

    async def poll(self, job_id: str) -> BatchState:
        """GET ``/batches/<name>``."""
        name = job_id if job_id.startswith("batches/") else f"batches/{job_id}"
        return self._state(await self.http.json("GET", name))

    async def fetch_results(self, state: BatchState) -> str:
        """GET ``/download/v1beta/files/<id>:download?alt=media``."""
        name = state.output_file or ""
        name = name if name.startswith("files/") else f"files/{name}"
        return (await self.http.request(
            "GET", f"{self._prefixed('download')}/{name}:download?alt=media")).text


# What :func:`run_batch_job` drives: ``submit((custom_id, text) pairs)``, ``poll(job_id)``,
# ``fetch_results(state)`` (the finished job's JSONL), each returning a :class:`BatchState` but the last.
BatchJobApi = OpenAIBatchJobs | GeminiBatchJobs


class BatchRunner:
    """Runs provider batch jobs for ``BaseProvider.embed_batch`` and decides when to stop;
    ``failures`` counts failed attempts since the last success, ``last_error`` the last one."""

    def __init__(self, *, jobs: BatchJobApi, settings: RemoteBatchSettings) -> None:
        """Args: the provider's batch API and the ``remote.batch`` settings."""
        self.jobs = jobs
        self.settings = settings
        self.failures = 0
        self.last_error: str | None = None
        self._unavailable = False

    @property
    def enabled(self) -> bool:
        """True while batch mode is configured and not disabled by failures."""
        return (self.settings.enabled and not self._unavailable
                and self.failures < BATCH_FAILURE_LIMIT)

    async def run(self, texts: list[str]) -> list[list[float]] | None:
        """Vectors for ``texts`` from batch jobs, or None (a failure counted, never raised)
        when the caller must embed inline."""
        requests = [(custom_id_for(i, text), text) for i, text in enumerate(texts)]
        groups = [requests[i:i + MAX_REQUESTS_PER_JOB]
                  for i in range(0, len(requests), MAX_REQUESTS_PER_JOB)]
        vectors: dict[str, list[float]] = {}
        failed: list[tuple[EmbeddingProviderError, int]] = []
        limiter = anyio.CapacityLimiter(max(1, self.settings.concurrency))

        async def run_group(group: list[tuple[str, str]], tg: anyio.abc.TaskGroup) -> None:
            async with limiter:
                if failed:
                    return
                for attempt in (1, 2):  # a job that timed out is submitted once more
                    try:
                        vectors.update(await run_batch_job(
                            self.jobs, group, wait=self.settings.wait,
                            poll_interval_s=self.settings.poll_interval_ms / 1000,
                            timeout_s=self.settings.timeout_minutes * 60))
                        return
                    except EmbeddingProviderError as exc:
                        if attempt == 2 or "timed out" not in str(exc):
                            failed.append((exc, attempt))
                            tg.cancel_scope.cancel()
                            return

        async with anyio.create_task_group() as tg:
            for group in groups:
                tg.start_soon(run_group, group, tg)
        if failed:
            exc, attempts = failed[0]
            self.failures += attempts
            self.last_error = str(exc)
            if UNAVAILABLE_MARKER in str(exc):
                self._unavailable = True
            return None
        self.failures = 0
        self.last_error = None
        return [vectors[cid] for cid, _ in requests]
