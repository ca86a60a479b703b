"""Remote embedding providers against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import math

import pytest

from fallback.embeddings import create_provider, probe
from fallback.embeddings._http import parse_retry_after
from fallback.embeddings.base import CallPolicy, retry_wait_s, sanitize_vector
from fallback.errors import EmbeddingDimensionsError, EmbeddingProviderError
from fallback.settings import MemorySearchSettings
from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

# Fast policy for tests: tiny back-off, short deadlines.
# deadlines only bound a server that answers (a loaded CI host can take seconds); a test of a
# timeout passes its own policy
FAST = CallPolicy(concurrency=1, query_timeout_s=60, batch_timeout_s=60, retry_base_s=0.01)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make(name: str, url: str | None, *, policy: CallPolicy = FAST, env: dict | None = None,
         **settings: object):
    remote = {"baseUrl": url} if url else {}
    remote.update(settings.pop("remote", {}))  # type: ignore[arg-type]
    cfg = MemorySearchSettings.model_validate({"provider": name, "remote": remote, **settings})
    provider = create_provider(name, cfg, env=env if env is not None else {})
    provider.policy = policy
    return provider


def openai_reply(req: Recorded, dims: int = 3) -> Reply:
    texts = req.json["input"]
    data = [{"index": i, "embedding": [float(len(t)), float(i), 1.0][:dims] + [0.5] * (dims - 3)}
            for i, t in enumerate(texts)]
    return Reply(200, {"data": list(reversed(data)), "model": req.json["model"]})


@pytest.mark.anyio
async def test_openai_wire_auth_body_and_order() -> None:
    with serve(openai_reply) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "sk-test-123"},
                 model="openai/text-embedding-3-small", dimensions=3)
        try:
            assert await p.embed_query("hello") == [5.0, 0.0, 1.0]
            assert await p.embed_batch(["a", "bbb"]) == [[1.0, 0.0, 1.0], [3.0, 1.0, 1.0]]
        finally:
            await p.aclose()
    assert srv.paths() == ["/embeddings", "/embeddings"]
    first, second = srv.requests
    assert first.headers["authorization"] == "Bearer sk-test-123"
    assert first.json == {"model": "text-embedding-3-small", "input": ["hello"], "dimensions": 3}
    assert second.json == {"model": "text-embedding-3-small", "input": ["a", "bbb"],
                           "dimensions": 3}
    assert p.dims == 3


@pytest.mark.anyio
async def test_an_env_secret_ref_sends_its_variable_as_the_key() -> None:
    ref = {"source": "env", "provider": "default", "id": "MEMORY_OPENAI_KEY"}
    with serve(openai_reply) as srv:
        p = make("openai", srv.url, env={"MEMORY_OPENAI_KEY": " sk-ref-1 ", "OPENAI_API_KEY": "sk-2"},
                 remote={"apiKey": ref})
        try:
            assert await p.embed_query("hi") == [2.0, 0.0, 1.0]
        finally:
            await p.aclose()
    assert srv.requests[0].headers["authorization"] == "Bearer sk-ref-1"


@pytest.mark.anyio
async def test_batch_split_by_utf8_bytes_keeps_order() -> None:
    texts = ["a" * 3000, "b" * 3000, "c" * 3000, "é" * 1500, "d" * 9000, "e"]
    with serve(openai_reply) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"})
        try:
            vectors = await p.embed_batch(texts)
        finally:
            await p.aclose()
    sizes = [[len(t.encode()) for t in r.json["input"]] for r in srv.requests]
    assert sizes == [[3000, 3000], [3000, 3000], [9000], [1]]
    assert [v[0] for v in vectors] == [3000.0, 3000.0, 3000.0, 1500.0, 9000.0, 1.0]


@pytest.mark.anyio
async def test_429_with_retry_after_then_success_is_two_calls() -> None:
    def handler(req: Recorded) -> Reply:
        if len(srv.requests) == 1:
            return Reply(429, {"error": {"message": "Rate limit reached"}}, {"Retry-After": "0"})
        return openai_reply(req)

    with serve(handler) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"})
        try:
            assert await p.embed_query("abcd") == [4.0, 0.0, 1.0]
        finally:
            await p.aclose()
    assert len(srv.requests) == 2


@pytest.mark.anyio
async def test_always_500_fails_after_exactly_three_calls() -> None:
    with serve(lambda req: Reply(500, {"error": {"message": "upstream broke"}})) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"})
        try:
            with pytest.raises(EmbeddingProviderError) as info:
                await p.embed_batch(["x"])
        finally:
            await p.aclose()
    assert len(srv.requests) == 3
    assert info.value.status == 500 and info.value.retryable
    assert str(info.value) == "openai embedding failed (HTTP 500): upstream broke"


@pytest.mark.anyio
async def test_400_is_not_retried_and_never_shows_the_key() -> None:
    body = {"error": {"message": "Incorrect API key provided: sk-secret-777"}}
    with serve(lambda req: Reply(401, body)) as srv:
        p = make("openai", srv.url, remote={"apiKey": "sk-secret-777"})
        try:
            with pytest.raises(EmbeddingProviderError) as info:
                await p.embed_query("x")
        finally:
            await p.aclose()
    assert len(srv.requests) == 1
    assert not info.value.retryable
    assert str(info.value) == "openai embedding failed (HTTP 401): Incorrect API key provided: ***"


@pytest.mark.anyio
async def test_413_halves_the_batch_recursively() -> None:
    def handler(req: Recorded) -> Reply:
        if len(req.json["input"]) > 1:
            return Reply(413, {"error": {"message": "payload too large"}})
        return openai_reply(req)

    with serve(handler) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"})
        try:
            vectors = await p.embed_batch(["a", "bb", "ccc", "dddd"])
        finally:
            await p.aclose()
    assert [len(r.json["input"]) for r in srv.requests] == [4, 2, 1, 1, 2, 1, 1]
    assert [v[0] for v in vectors] == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.anyio
async def test_max_input_length_message_also_halves() -> None:
    def handler(req: Recorded) -> Reply:
        if len(req.json["input"]) > 2:
            return Reply(400, {"error": {"message": "max input length is 2"}})
        return openai_reply(req)

    with serve(handler) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"})
        try:
            vectors = await p.embed_batch(["a", "b", "c"])
        finally:
            await p.aclose()
    assert [len(r.json["input"]) for r in srv.requests] == [3, 1, 2]
    assert len(vectors) == 3


@pytest.mark.anyio
async def test_timeout_message_and_no_retry() -> None:
    slow = CallPolicy(concurrency=1, query_timeout_s=2, batch_timeout_s=2, retry_base_s=0.01)
    with serve(lambda req: Reply(200, {"data": []}, delay_s=600)) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"}, policy=slow)
        try:
            with pytest.raises(EmbeddingProviderError) as info:
                await p.embed_batch(["x"])
        finally:
            await p.aclose()
        # a provider that did not answer is not asked again at once (a retry is sent before
        # the raise; a loaded server may record the one request after the client gave up)
        assert srv.wait_for_requests(1) == 1
    assert str(info.value) == "openai embedding failed: memory embeddings batch timed out after 2s"
    assert info.value.retryable is False


@pytest.mark.anyio
async def test_wrong_dimensions_is_an_error() -> None:
    with serve(lambda req: openai_reply(req, dims=3)) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"}, dimensions=4)
        try:
            with pytest.raises(EmbeddingProviderError) as info:
                await p.embed_query("x")
        finally:
            await p.aclose()
    assert len(srv.requests) == 1
    assert str(info.value) == ("openai embedding failed: embedding has 3 dimensions, expected 4 "
                               "(model text-embedding-3-small)")


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["openai", "ollama"])
async def test_a_vector_of_non_numbers_is_a_provider_error(name: str) -> None:
    def handler(req: Recorded) -> Reply:
        if name == "ollama":
            return Reply(200, {"embedding": ["0.1", None]})
        return Reply(200, {"data": [{"index": i, "embedding": ["a", "b"]} for i in range(len(req.json["input"]))]})

    with serve(handler) as srv:
        p = make(name, srv.url, env={"OPENAI_API_KEY": "k"}, model="m")
        try:
            for call in (p.embed_query("x"), p.embed_batch(["x", "y"])):
                with pytest.raises(EmbeddingProviderError) as info:
                    await call
                assert str(info.value) == f"{name} embedding failed: response embedding is not a list of numbers (model m)"
        finally:
            await p.aclose()


@pytest.mark.anyio
async def test_a_response_missing_an_embedding_is_a_provider_error() -> None:
    def handler(req: Recorded) -> Reply:  # the first input's embedding only, or none at all
        return Reply(200, {"data": [] if req.json["input"] == ["x"] else openai_reply(req).body["data"][-1:]})

    with serve(handler) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"})
        try:
            for call, message in ((p.embed_query("x"), "no embedding for 1 of 1 inputs"),
                                  (p.embed_batch(["a", "bb", "ccc"]), "no embedding for 2 of 3 inputs")):
                with pytest.raises(EmbeddingProviderError) as info:
                    await call
                assert (str(info.value), info.value.retryable) == (f"openai embedding failed: response has {message}", False)
        finally:
            await p.aclose()


@pytest.mark.anyio
async def test_dimension_change_between_calls_is_an_error() -> None:
    def handler(req: Recorded) -> Reply:
        return openai_reply(req, dims=3 if len(srv.requests) == 1 else 5)

    with serve(handler) as srv:
        p = make("mistral", srv.url, env={"MISTRAL_API_KEY": "k"})
        try:
            await p.embed_query("x")
            with pytest.raises(EmbeddingDimensionsError, match="has 5 dimensions, expected 3") as info:
                await p.embed_query("y")
            assert (info.value.expected, info.value.got, p.dims) == (3, 5, 5)
            assert len(await p.embed_query("z")) == 5  # the new size is adopted
        finally:
            await p.aclose()


@pytest.mark.anyio
async def test_gemini_query_and_batch_wire() -> None:
    def handler(req: Recorded) -> Reply:
        if req.path.endswith(":embedContent"):
            return Reply(200, {"embedding": {"values": [0.1, 0.2]}})
        return Reply(200, {"embeddings": [{"values": [float(i), 1.0]}
                                          for i, _ in enumerate(req.json["requests"])]})

    with serve(handler) as srv:
        p = make("gemini", srv.url, env={"GOOGLE_API_KEY": "g-key"},
                 model="models/gemini-embedding-001", outputDimensionality=2)
        try:
            assert await p.embed_query("   ") == []
            assert await p.embed_query("where") == [0.1, 0.2]
            assert await p.embed_batch(["a", "b"]) == [[0.0, 1.0], [1.0, 1.0]]
        finally:
            await p.aclose()
    assert srv.paths() == ["/models/gemini-embedding-001:embedContent",
                           "/models/gemini-embedding-001:batchEmbedContents"]
    query, batch = srv.requests
    assert query.headers["x-goog-api-key"] == "g-key"
    assert "authorization" not in query.headers
    assert query.json == {"content": {"parts": [{"text": "where"}]}, "taskType": "RETRIEVAL_QUERY",
                          "outputDimensionality": 2}
    assert batch.json == {"requests": [
        {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": t}]},
         "taskType": "RETRIEVAL_DOCUMENT", "outputDimensionality": 2} for t in ("a", "b")]}


@pytest.mark.anyio
async def test_voyage_input_types() -> None:
    with serve(openai_reply) as srv:
        p = make("voyage", srv.url, env={"VOYAGE_API_KEY": "v-key"})
        try:
            await p.embed_query("q")
            await p.embed_batch(["d1", "d2"])
        finally:
            await p.aclose()
    q, d = srv.requests
    assert q.headers["authorization"] == "Bearer v-key"
    assert q.json == {"model": "voyage-4-large", "input": ["q"], "input_type": "query"}
    assert d.json == {"model": "voyage-4-large", "input": ["d1", "d2"], "input_type": "document"}


@pytest.mark.anyio
async def test_mistral_and_openai_compatible_bodies() -> None:
    with serve(openai_reply) as srv:
        m = make("mistral", srv.url, env={"MISTRAL_API_KEY": "m-key"})
        c = make("openai-compatible", srv.url, model="bge-m3", queryInputType="search_query",
                 inputType="passage")
        try:
            await m.embed_batch(["x"])
            await c.embed_query("q")
            await c.embed_batch(["d"])
        finally:
            await m.aclose()
            await c.aclose()
    mreq, cq, cd = srv.requests
    assert mreq.json == {"model": "mistral-embed", "input": ["x"]}
    assert mreq.headers["authorization"] == "Bearer m-key"
    assert "authorization" not in cq.headers
    assert cq.json == {"model": "bge-m3", "input": ["q"], "input_type": "search_query"}
    assert cd.json == {"model": "bge-m3", "input": ["d"], "input_type": "passage"}


@pytest.mark.anyio
async def test_ollama_one_request_per_text_and_normalised() -> None:
    answers = {"a": [3.0, 4.0], "b": [0.0, 0.0], "c": [0.0, 2.0]}

    def handler(req: Recorded) -> Reply:
        return Reply(200, {"embedding": answers[req.json["prompt"]]})

    with serve(handler) as srv:
        p = make("ollama", srv.url, policy=CallPolicy(concurrency=1, retry_base_s=0.01))
        try:
            vectors = await p.embed_batch(["a", "b", "c"])
        finally:
            await p.aclose()
    assert srv.paths() == ["/api/embeddings"] * 3
    assert [r.json for r in srv.requests] == [{"model": "nomic-embed-text", "prompt": t}
                                              for t in "abc"]
    assert vectors == [[0.6, 0.8], [0.0, 0.0], [0.0, 1.0]]
    assert "authorization" not in srv.requests[0].headers


@pytest.mark.anyio
async def test_transport_error_is_retried_then_raised() -> None:
    with serve(openai_reply) as srv:
        url = srv.url  # the port is free again once the server is gone
    p = make("openai", url, env={"OPENAI_API_KEY": "k"})
    try:
        with pytest.raises(EmbeddingProviderError) as info:
            await p.embed_query("x")
    finally:
        await p.aclose()
    assert info.value.retryable and info.value.status is None
    assert str(info.value).startswith("openai embedding failed: request failed: ")


@pytest.mark.anyio
async def test_probe_reports_success_and_failure() -> None:
    with serve(openai_reply) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"})
        try:
            assert await probe(p) == (True, None)
        finally:
            await p.aclose()
    assert srv.requests[0].json["input"] == ["ping"]
    with serve(lambda req: Reply(400, {"error": {"message": "bad model"}})) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"})
        try:
            assert await probe(p) == (False, "openai embedding failed (HTTP 400): bad model")
        finally:
            await p.aclose()
    assert await probe(None) == (False, "No embedding provider available (FTS-only mode)")


def test_parse_retry_after_seconds_and_http_date() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" ") is None
    assert parse_retry_after("soon") is None
    now = 1_700_000_000.0  # 2023-11-14T22:13:20Z
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:25 GMT", now_s=now) == 5.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:00 GMT", now_s=now) == 0.0


def test_retry_wait_doubles_with_jitter_and_caps() -> None:
    assert retry_wait_s(1, jitter=1.0) == 0.5
    assert retry_wait_s(2, jitter=1.2) == pytest.approx(1.2)
    assert retry_wait_s(10, jitter=1.0) == 8.0
    assert retry_wait_s(1, retry_after_s=30) == 8.0
    assert retry_wait_s(3, retry_after_s=2) == 2.0
    for _ in range(20):
        assert 1.0 <= retry_wait_s(2) <= 1.2 + 1e-9
    assert not math.isnan(retry_wait_s(1))


def test_sanitize_vector_zeroes_non_finite_and_normalises() -> None:
    nan, inf = float("nan"), float("inf")
    assert sanitize_vector([nan, 2.0, inf], normalize=False) == [0.0, 2.0, 0.0]
    assert sanitize_vector([nan, 3.0, -inf, 4.0], normalize=True) == [0.0, 0.6, 0.0, 0.8]
    assert sanitize_vector([1e-12, 0.0], normalize=True) == [1e-12, 0.0]


@pytest.mark.anyio
async def test_error_bodies_a_bad_retry_after_and_invalid_json_are_clear_provider_errors() -> None:
    """What providers other than OpenAI answer: ``{"detail": ...}`` (FastAPI servers) and a list of
    errors (Gemini's batch form); a Retry-After date that does not exist is no wait at all; a 200
    that is not JSON (a proxy's HTML page) names the path it came from; an error page that is not
    JSON is quoted, cut to ``MAX_ERROR_TEXT_CHARS``."""
    replies = {"detail": Reply(429, {"detail": "Too many requests, slow down"},
                               {"Retry-After": "Tue, 31 Feb 2023 10:00:00 GMT"}),
               "list": Reply(400, [{"error": {"message": "input must be a string"}}]),
               "html": Reply(200, b"<html>502 Bad Gateway</html>"),
               "page": Reply(400, b"<p>" + b"Bad request. " * 30 + b"</p>")}
    with serve(lambda req: replies[req.json["input"][0]], max_requests=10) as srv:
        p = make("openai", srv.url, env={"OPENAI_API_KEY": "k"})
        errors = {}
        try:
            for text in replies:
                with pytest.raises(EmbeddingProviderError) as info:
                    await p.embed_batch([text])
                errors[text] = info.value
        finally:
            await p.aclose()
    assert [r.json["input"][0] for r in srv.requests] == ["detail"] * 3 + ["list", "html", "page"]
    assert [(str(e), e.status, e.retryable, e.retry_after_s) for e in errors.values()] == [
        ("openai embedding failed (HTTP 429): Too many requests, slow down", 429, True, None),
        ("openai embedding failed (HTTP 400): input must be a string", 400, False, None),
        ("openai embedding failed (HTTP 200): invalid JSON in response from /embeddings", 200, False, None),
        ("openai embedding failed (HTTP 400): <p>" + ("Bad request. " * 30)[:297] + "...", 400, False, None)]
