"""Provider batch-job APIs against a real HTTP server on 127.0.0.1, and the BatchRunner rules."""

from __future__ import annotations

import email
import email.policy
import json
from typing import Any

import pytest

from fallback.embeddings import create_provider
from fallback.embeddings.base import CallPolicy
from fallback.embeddings.batch_jobs import custom_id_for, parse_result_lines
from fallback.errors import EmbeddingProviderError
from fallback.settings import MemorySearchSettings
from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

FAST = CallPolicy(concurrency=1, query_timeout_s=5, batch_timeout_s=5, retry_base_s=0.01)
KEYS = {"OPENAI_API_KEY": "sk-batch-key", "VOYAGE_API_KEY": "voyage-key", "GEMINI_API_KEY": "gem-key"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make(name: str, url: str, **batch: object) -> Any:
    cfg = MemorySearchSettings.model_validate({
        "provider": name,
        "remote": {"baseUrl": url, "batch": {"enabled": True, "pollIntervalMs": 5, **batch}}})
    provider = create_provider(name, cfg, env=KEYS)
    provider.policy = FAST
    return provider


def multipart_parts(req: Recorded) -> dict[str, bytes]:
    """Form fields and files of a multipart request, by field name."""
    raw = f"Content-Type: {req.headers['content-type']}\r\n\r\n".encode() + req.body
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    return {part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
            for part in msg.iter_parts()}


class OpenAIBatchService:
    """Speaks OpenAI's files/batches API; ``statuses`` are returned by successive polls."""

    def __init__(self, statuses: list[str], *, created: str = "validating",
                 drop_last: bool = False) -> None:
        self.statuses = statuses
        self.created = created
        self.drop_last = drop_last
        self.lines: list[dict[str, Any]] = []
        self.polls = 0

    def __call__(self, req: Recorded) -> Reply:
        if req.method == "POST" and req.path == "/files":
            parts = multipart_parts(req)
            assert parts["purpose"] == b"batch"
            self.lines = [json.loads(x) for x in parts["file"].splitlines()]
            return Reply(200, {"id": "file-in", "purpose": "batch"})
        if req.method == "POST" and req.path == "/batches":
            return Reply(200, {"id": "batch_1", "status": self.created})
        if req.method == "GET" and req.path == "/batches/batch_1":
            status = self.statuses[min(self.polls, len(self.statuses) - 1)]
            self.polls += 1
            body: dict[str, Any] = {"id": "batch_1", "status": status}
            if status == "completed":
                body["output_file_id"] = "file-out"
            if status == "failed":
                body["errors"] = {"data": [{"message": "invalid model"}]}
            return Reply(200, body)
        if req.method == "GET" and req.path == "/files/file-out/content":
            lines = self.lines[:-1] if self.drop_last else self.lines
            out = [{"custom_id": line["custom_id"], "error": None, "response": {
                "status_code": 200,
                "body": {"data": [{"index": 0, "embedding": embed(_text(line))}]}}}
                for line in reversed(lines)]
            return Reply(200, "\n".join(json.dumps(o) for o in out) + "\n")
        if req.method == "POST" and req.path == "/embeddings":
            return Reply(200, {"data": [{"index": i, "embedding": embed(t)}
                                        for i, t in enumerate(req.json["input"])]})
        return Reply(404, {"error": {"message": f"no route {req.path}"}})


def _text(line: dict[str, Any]) -> str:
    body = line["body"]
    return body["input"][0] if isinstance(body["input"], list) else body["input"]


def embed(text: str) -> list[float]:
    return [float(len(text)), 1.0]


@pytest.mark.anyio
async def test_openai_batch_upload_poll_download_and_mapping() -> None:
    service = OpenAIBatchService(["in_progress", "finalizing", "completed"])
    with serve(service) as srv:
        provider = make("openai", srv.url)
        try:
            vectors = await provider.embed_batch(["a", "bb", "ccc"])
        finally:
            await provider.aclose()
    assert vectors == [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]
    assert [(r.method, r.path) for r in srv.requests] == [
        ("POST", "/files"), ("POST", "/batches"), ("GET", "/batches/batch_1"),
        ("GET", "/batches/batch_1"), ("GET", "/batches/batch_1"), ("GET", "/files/file-out/content")]
    assert srv.requests[0].headers["authorization"] == "Bearer sk-batch-key"
    assert service.lines == [
        {"custom_id": custom_id_for(i, t), "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "text-embedding-3-small", "input": t}} for i, t in enumerate(["a", "bb", "ccc"])]
    assert srv.requests[1].json == {"input_file_id": "file-in", "endpoint": "/v1/embeddings",
                                    "completion_window": "24h",
                                    "metadata": {"source": "qmdbridge-memory"}}
    assert provider.batch_runner.failures == 0 and provider.batch_runner.enabled


@pytest.mark.anyio
async def test_two_failures_disable_batch_mode_and_inline_is_used() -> None:
    service = OpenAIBatchService(["failed"])
    with serve(service) as srv:
        provider = make("openai", srv.url)
        runner = provider.batch_runner
        try:
            first = await provider.embed_batch(["xy"])
            assert (runner.failures, runner.enabled) == (1, True)
            await provider.embed_batch(["xy"])
            assert (runner.failures, runner.enabled) == (2, False)
            count = len(srv.requests)
            third = await provider.embed_batch(["xyz"])
        finally:
            await provider.aclose()
    assert first == [[2.0, 1.0]] and third == [[3.0, 1.0]]
    assert [r.path for r in srv.requests[count:]] == ["/embeddings"]
    assert [r.path for r in srv.requests].count("/files") == 2
    assert runner.last_error == "openai embedding failed: batch batch_1 failed: invalid model"
    assert runner.failures == 2 and runner.enabled is False


@pytest.mark.anyio
async def test_success_resets_the_failure_counter() -> None:
    service = OpenAIBatchService(["failed"])
    with serve(service) as srv:
        provider = make("openai", srv.url)
        try:
            await provider.embed_batch(["a"])
            assert provider.batch_runner.failures == 1
            service.statuses, service.polls = ["completed"], 0
            assert await provider.embed_batch(["abcd"]) == [[4.0, 1.0]]
        finally:
            await provider.aclose()
    assert provider.batch_runner.failures == 0 and provider.batch_runner.last_error is None
    assert srv.paths()[-1] == "/files/file-out/content"


@pytest.mark.anyio
async def test_wait_false_fails_at_once_and_embeds_inline() -> None:
    service = OpenAIBatchService(["completed"], created="in_progress")
    with serve(service) as srv:
        provider = make("openai", srv.url, wait=False)
        try:
            assert await provider.embed_batch(["abc"]) == [[3.0, 1.0]]
        finally:
            await provider.aclose()
    assert srv.paths() == ["/files", "/batches", "/embeddings"]
    assert provider.batch_runner.last_error == (
        "openai embedding failed: batch batch_1 still in_progress; remote.batch.wait is false")


@pytest.mark.anyio
async def test_timeout_is_retried_once_then_counts_two_failures() -> None:
    service = OpenAIBatchService(["in_progress"])
    with serve(service) as srv:
        provider = make("openai", srv.url, timeoutMinutes=0.0005)  # 30 ms
        try:
            assert await provider.embed_batch(["ab"]) == [[2.0, 1.0]]
        finally:
            await provider.aclose()
    assert srv.paths().count("/files") == 2 and srv.paths()[-1] == "/embeddings"
    assert provider.batch_runner.failures == 2 and not provider.batch_runner.enabled
    assert provider.batch_runner.last_error == (
        "openai embedding failed: batch batch_1 timed out after 0.03s")


@pytest.mark.anyio
async def test_missing_result_line_fails_the_batch() -> None:
    service = OpenAIBatchService(["completed"], drop_last=True)
    with serve(service) as srv:
        provider = make("openai", srv.url)
        try:
            assert await provider.embed_batch(["a", "b"]) == [[1.0, 1.0], [1.0, 1.0]]
        finally:
            await provider.aclose()
    assert provider.batch_runner.last_error == (
        "openai embedding failed: batch batch_1 missing 1 embedding responses")
    assert srv.paths()[-1] == "/embeddings"


def test_result_lines_with_errors_or_empty_embeddings_fail() -> None:
    ok = {"custom_id": "aaa", "response": {"status_code": 200,
                                           "body": {"data": [{"embedding": [1.0]}]}}}
    bad = {"custom_id": "bbb", "response": {"status_code": 400, "body": {
        "error": {"message": "input too long"}}}}
    empty = {"custom_id": "ccc", "response": {"status_code": 200, "body": {"data": [{"embedding": []}]}}}
    text = "\n".join(json.dumps(x) for x in (ok, bad, empty))
    with pytest.raises(EmbeddingProviderError) as info:
        parse_result_lines("openai", "b1", text, ["aaa", "bbb", "ccc"])
    assert str(info.value) == ("openai embedding failed: batch b1 failed: bbb: input too long; "
                               "ccc: empty embedding")
    assert parse_result_lines("openai", "b1", json.dumps(ok), ["aaa"]) == {"aaa": [1.0]}
    gemini = {"key": "k1", "response": {"embedding": {"values": [0.5, 0.5]}}}
    assert parse_result_lines("gemini", "b2", json.dumps(gemini), ["k1"]) == {"k1": [0.5, 0.5]}


@pytest.mark.anyio
async def test_voyage_batch_request_shape() -> None:
    service = OpenAIBatchService(["completed"])
    with serve(service) as srv:
        provider = make("voyage", srv.url)
        try:
            assert await provider.embed_batch(["hello"]) == [[5.0, 1.0]]
        finally:
            await provider.aclose()
    assert service.lines == [{"custom_id": custom_id_for(0, "hello"), "body": {"input": ["hello"]}}]
    assert srv.requests[1].json == {
        "input_file_id": "file-in", "endpoint": "/v1/embeddings", "completion_window": "12h",
        "request_params": {"model": "voyage-4-large", "input_type": "document"},
        "metadata": {"source": "qmdbridge-memory"}}


class GeminiBatchService:
    """Speaks the Gemini Batch API as our best-effort client uses it."""

    def __init__(self, *, create_status: int = 200) -> None:
        self.create_status = create_status
        self.keys: list[str] = []
        self.texts: list[str] = []

    def __call__(self, req: Recorded) -> Reply:
        if req.path == "/upload/v1beta/files?uploadType=multipart":
            body = req.body.decode()
            lines = [json.loads(x) for x in body.splitlines() if x.startswith('{"key"')]
            self.keys = [line["key"] for line in lines]
            self.texts = [line["request"]["content"]["parts"][0]["text"] for line in lines]
            return Reply(200, {"file": {"name": "files/in-1"}})
        if req.path == "/v1beta/models/gemini-embedding-001:asyncBatchEmbedContent":
            if self.create_status != 200:
                return Reply(self.create_status, {"error": {"message": "not found"}})
            return Reply(200, {"name": "batches/b-1", "metadata": {"state": "BATCH_STATE_PENDING"}})
        if req.path == "/v1beta/batches/b-1":
            return Reply(200, {"name": "batches/b-1", "metadata": {
                "state": "BATCH_STATE_SUCCEEDED", "output": {"responsesFile": "files/out-1"}}})
        if req.path == "/download/v1beta/files/out-1:download?alt=media":
            return Reply(200, "\n".join(json.dumps({"key": k, "response": {
                "embedding": {"values": embed(t)}}}) for k, t in zip(self.keys, self.texts,
                                                                      strict=True)))
        if req.path.endswith(":batchEmbedContents"):
            return Reply(200, {"embeddings": [{"values": embed(r["content"]["parts"][0]["text"])}
                                              for r in req.json["requests"]]})
        return Reply(404, {"error": {"message": f"no route {req.path}"}})


@pytest.mark.anyio
async def test_gemini_batch_flow() -> None:
    service = GeminiBatchService()
    with serve(service) as srv:
        provider = make("gemini", f"{srv.url}/v1beta")
        try:
            assert await provider.embed_batch(["one", "three"]) == [[3.0, 1.0], [5.0, 1.0]]
        finally:
            await provider.aclose()
    assert srv.requests[0].headers["x-goog-api-key"] == "gem-key"
    assert srv.requests[1].json == {"batch": {"displayName": "memory-embeddings",
                                              "inputConfig": {"file_name": "files/in-1"}}}
    assert service.texts == ["one", "three"]
    assert provider.batch_runner.failures == 0


@pytest.mark.anyio
async def test_gemini_batch_404_disables_batch_mode_at_once() -> None:
    with serve(GeminiBatchService(create_status=404)) as srv:
        provider = make("gemini", f"{srv.url}/v1beta")
        try:
            assert await provider.embed_batch(["abc"]) == [[3.0, 1.0]]
        finally:
            await provider.aclose()
    assert provider.batch_runner.failures == 1 and not provider.batch_runner.enabled
    assert srv.paths()[-1] == "/v1beta/models/gemini-embedding-001:batchEmbedContents"
