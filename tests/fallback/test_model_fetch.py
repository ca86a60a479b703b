"""Model downloads against a stand-in hub on 127.0.0.1 serving the real GGUF test model:
redirect with the hub's sha256, checksum and size refusals, offline error, resume by Range."""

from __future__ import annotations

import hashlib
import io
import socket
from pathlib import Path

import pytest

from fallback.embeddings.model_fetch import (
    DEFAULT_MODEL,
    ModelRef,
    ModelSpec,
    default_cache_dir,
    fetch_model,
    find_model,
    format_bytes,
    hub_base_url,
    list_cached,
    parse_hf_uri,
    stderr_progress,
)
from fallback.errors import ModelDownloadError
from tests.conftest import TEST_MODEL_NAME
from tests.fallback.hub_server import HubFile, serve_hub

REPO = "test-org/all-MiniLM-L6-v2-GGUF"
KEY = f"{REPO}/{TEST_MODEL_NAME}"
REF = ModelRef(REPO, TEST_MODEL_NAME)


@pytest.fixture(scope="module")
def model_data(gguf_test_model: Path) -> bytes:
    return gguf_test_model.read_bytes()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_uris_urls_and_cache_paths(tmp_path: Path) -> None:
    ref = parse_hf_uri("hf:ggml-org/embeddinggemma-300M-GGUF/embeddinggemma-300M-Q8_0.gguf")
    assert ref == ModelRef("ggml-org/embeddinggemma-300M-GGUF", "embeddinggemma-300M-Q8_0.gguf")
    assert ref.url("https://huggingface.co/") == (
        "https://huggingface.co/ggml-org/embeddinggemma-300M-GGUF/resolve/main/embeddinggemma-300M-Q8_0.gguf")
    assert parse_hf_uri("hf:o/r/sub/m.gguf").cache_path(tmp_path) == tmp_path / "hf" / "o" / "r" / "sub" / "m.gguf"
    for bad in ("hf:o/m.gguf", "hf:o/r/m.bin", "hf:o/../m.gguf", "o/r/m.gguf", "hf:o/r/.m.gguf"):
        with pytest.raises(ValueError, match="hf:<owner>/<repo>/<file>.gguf"):
            parse_hf_uri(bad)
    assert find_model("bge-small-en-v1.5") is DEFAULT_MODEL
    assert find_model(DEFAULT_MODEL.ref.uri) is DEFAULT_MODEL
    with pytest.raises(ValueError, match=r"unknown model 'minilm' \(known: bge-small-en-v1.5"):
        find_model("minilm")
    assert hub_base_url({"HF_ENDPOINT": "http://mirror:8080/"}) == "http://mirror:8080"
    assert hub_base_url({}) == "https://huggingface.co"
    assert default_cache_dir(None, {"OPENCLAW_STATE_DIR": str(tmp_path)}) == tmp_path.resolve() / "models"
    assert default_cache_dir(str(tmp_path / "m"), {}) == (tmp_path / "m").resolve()
    assert (format_bytes(36_806_944), format_bytes(512), format_bytes(2_500_000_000)) == (
        "36.8 MB", "512 B", "2.5 GB")


def test_download_verified_by_the_hub_etag_then_cached(tmp_path: Path, model_data: bytes) -> None:
    sha = hashlib.sha256(model_data).hexdigest()
    seen: list[tuple[int, int | None]] = []
    with serve_hub({KEY: HubFile(model_data)}) as hub:
        result = fetch_model(REF, tmp_path, base_url=hub.url, on_progress=lambda d, t: seen.append((d, t)))
        again = fetch_model(REF, tmp_path, base_url=hub.url)
        paths = [r.path for r in hub.requests]
    target = tmp_path / "hf" / "test-org" / "all-MiniLM-L6-v2-GGUF" / TEST_MODEL_NAME
    assert (result.path, result.size_bytes, result.sha256) == (target, len(model_data), sha)
    assert (result.downloaded, result.verified_by, result.resumed_from) == (True, "hub", 0)
    assert target.read_bytes() == model_data
    assert (target.parent / f"{TEST_MODEL_NAME}.sha256").read_text() == f"{sha}\n"
    assert not (target.parent / f"{TEST_MODEL_NAME}.part").exists()
    assert seen[0] == (0, len(model_data)) and seen[-1] == (len(model_data), len(model_data))
    assert (again.downloaded, again.sha256, again.verified_by) == (False, sha, "cache")
    assert paths == [f"/{REPO}/resolve/main/{TEST_MODEL_NAME}", f"/cdn/{KEY}"]  # the 2nd fetch asked nothing
    listed = list_cached(tmp_path)
    assert [(m.uri, m.size_bytes, m.sha256, m.complete, m.default) for m in listed] == [
        (f"hf:{KEY}", len(model_data), sha, True, False)]


def test_checksum_and_size_mismatches_are_refused_and_nothing_is_kept(tmp_path: Path,
                                                                      model_data: bytes) -> None:
    target = REF.cache_path(tmp_path)
    wrong = "0" * 64
    with serve_hub({KEY: HubFile(model_data, etag=wrong)}) as hub:
        with pytest.raises(ModelDownloadError) as hub_says:
            fetch_model(REF, tmp_path, base_url=hub.url)
    sha = hashlib.sha256(model_data).hexdigest()
    assert str(hub_says.value.reason) == (
        f"checksum mismatch for hf:{KEY}: sha256 {sha}, but the hub's ETag is {wrong}; "
        "the download was discarded")
    assert not target.exists() and list(target.parent.glob("*.part")) == []
    pinned = ModelSpec("x", REF, sha256="f" * 64, size_bytes=len(model_data), dims=384)
    with serve_hub({KEY: HubFile(model_data)}) as hub, pytest.raises(ModelDownloadError, match="the pinned digest is f{64}"):
        fetch_model(pinned, tmp_path, base_url=hub.url)
    assert not target.exists()
    # the default model's pins: the test model served under its name fails the pinned size
    bge = f"{DEFAULT_MODEL.ref.repo}/{DEFAULT_MODEL.ref.file}"
    with serve_hub({bge: HubFile(model_data)}) as hub, pytest.raises(ModelDownloadError) as size:
        fetch_model(DEFAULT_MODEL, tmp_path, base_url=hub.url)
    assert size.value.reason == (
        f"size mismatch for {DEFAULT_MODEL.ref.uri}: got {len(model_data)} bytes, expected 36806944; "
        "the download was discarded")
    assert list_cached(tmp_path) == []


def test_published_sha256_file_is_used_when_the_hub_reports_none(tmp_path: Path, model_data: bytes) -> None:
    sha = hashlib.sha256(model_data).hexdigest()
    with serve_hub({KEY: HubFile(model_data, announce=False, sidecar=f"{sha}  {TEST_MODEL_NAME}\n")}) as hub:
        result = fetch_model(REF, tmp_path, base_url=hub.url)
    assert (result.verified_by, result.sha256) == ("sidecar", sha)
    with serve_hub({KEY: HubFile(model_data, announce=False, sidecar="1" * 64)}) as hub, \
            pytest.raises(ModelDownloadError, match=r"but the published \.sha256 is 1{64}"):
        fetch_model(REF, tmp_path / "other", base_url=hub.url)
    with serve_hub({KEY: HubFile(model_data, announce=False)}) as hub:
        bare = fetch_model(REF, tmp_path / "bare", base_url=hub.url)
    assert (bare.verified_by, bare.sha256) == ("size", sha)


def test_server_down_is_a_clear_offline_error(tmp_path: Path) -> None:
    port = closed_port()
    with pytest.raises(ModelDownloadError) as info:
        fetch_model(DEFAULT_MODEL, tmp_path, base_url=f"http://127.0.0.1:{port}")
    err = info.value
    assert err.uri == DEFAULT_MODEL.ref.uri and list(tmp_path.rglob("*.part")) == []
    assert err.reason == (
        f"offline: cannot reach 127.0.0.1:{port} to download {DEFAULT_MODEL.ref.uri} into {tmp_path} "
        "(ConnectError); run `qmdbridge models pull` where the hub is reachable, set HF_ENDPOINT to a "
        "mirror, or download the .gguf file and set local.modelPath to its path")
    with serve_hub({}) as hub, pytest.raises(ModelDownloadError, match=r"not found on the hub: .* \(HTTP 404\)"):
        fetch_model(REF, tmp_path, base_url=hub.url)


def test_dropped_transfer_resumes_with_a_range_request(tmp_path: Path, model_data: bytes) -> None:
    cut = 10_000_000
    with serve_hub({KEY: HubFile(model_data)}, drop_after=cut, drops_left=1) as hub:
        result = fetch_model(REF, tmp_path, base_url=hub.url)
        ranges = [(r.path, r.range) for r in hub.requests if r.path.startswith("/cdn/")]
        sent = hub.body_bytes_sent
    assert ranges == [(f"/cdn/{KEY}", None), (f"/cdn/{KEY}", f"bytes={cut}-")]
    assert sent == len(model_data)  # nothing was sent twice
    assert (result.resumed_from, result.verified_by) == (cut, "hub")
    assert result.path.read_bytes() == model_data


def test_interrupted_download_is_kept_and_resumed_by_the_next_run(tmp_path: Path, model_data: bytes) -> None:
    cut = 4_000_000
    part = REF.cache_path(tmp_path).with_name(TEST_MODEL_NAME + ".part")
    with serve_hub({KEY: HubFile(model_data)}, drop_after=cut, drops_left=5) as hub, \
            pytest.raises(ModelDownloadError) as info:
        fetch_model(REF, tmp_path, base_url=hub.url, attempts=2)
    assert part.stat().st_size == 2 * cut
    assert info.value.reason.startswith(f"download of hf:{KEY} interrupted after 8.0 MB (")
    assert info.value.reason.endswith(f"run again to resume from {part}")
    listed = list_cached(tmp_path)
    assert [(m.complete, m.size_bytes, m.sha256) for m in listed] == [(False, 2 * cut, None)]
    with serve_hub({KEY: HubFile(model_data)}, ranges=True) as hub:
        result = fetch_model(REF, tmp_path, base_url=hub.url)
        assert [r.range for r in hub.requests if r.path.startswith("/cdn/")] == [f"bytes={2 * cut}-"]
        assert hub.body_bytes_sent == len(model_data) - 2 * cut
    assert result.resumed_from == 2 * cut and result.path.read_bytes() == model_data
    assert not part.exists()


def test_a_busy_hub_is_retried_and_the_partial_download_kept(tmp_path: Path, model_data: bytes) -> None:
    cut = 4_000_000
    part = REF.cache_path(tmp_path).with_name(TEST_MODEL_NAME + ".part")
    with serve_hub({KEY: HubFile(model_data)}, drop_after=cut, drops_left=1) as hub:
        with pytest.raises(ModelDownloadError):
            fetch_model(REF, tmp_path, base_url=hub.url, attempts=1)
        hub.unavailable_left = 3  # every attempt of the next run
        with pytest.raises(ModelDownloadError) as info:
            fetch_model(REF, tmp_path, base_url=hub.url)
        assert info.value.reason == (f"download of hf:{KEY} interrupted after 4.0 MB (the hub answered HTTP "
                                     f"503); run again to resume from {part}")
        assert part.stat().st_size == cut
        hub.unavailable_left = 2  # the third attempt gets the rest
        result = fetch_model(REF, tmp_path, base_url=hub.url)
        assert [r.range for r in hub.requests if r.path.startswith("/cdn/")][-3:] == [f"bytes={cut}-"] * 3
    assert result.resumed_from == cut and result.path.read_bytes() == model_data


def test_a_partial_download_longer_than_the_file_starts_over(tmp_path: Path, model_data: bytes) -> None:
    """A ``.part`` left by another version of the file: the hub answers 416 with the real size,
    so the part is dropped and the file fetched from the start in the same run."""
    part = REF.cache_path(tmp_path).with_name(TEST_MODEL_NAME + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * (len(model_data) + 10))
    with serve_hub({KEY: HubFile(model_data)}) as hub:
        result = fetch_model(REF, tmp_path, base_url=hub.url)
        assert [r.range for r in hub.requests if r.path.startswith("/cdn/")] == [f"bytes={len(model_data) + 10}-", None]
    assert (result.resumed_from, result.verified_by) == (0, "hub")
    assert result.path.read_bytes() == model_data and not part.exists()


def test_a_server_without_ranges_restarts_from_zero(tmp_path: Path, model_data: bytes) -> None:
    with serve_hub({KEY: HubFile(model_data)}, drop_after=3_000_000, drops_left=1, ranges=False) as hub:
        result = fetch_model(REF, tmp_path, base_url=hub.url)
        sent = hub.body_bytes_sent
    assert result.resumed_from == 0 and sent == len(model_data) + 3_000_000
    assert result.path.read_bytes() == model_data


def test_stderr_progress_lines() -> None:
    out = io.StringIO()
    progress = stderr_progress("hf:o/r/m.gguf", stream=out)
    for done in (0, 5, 9, 10, 55, 100):
        progress(done, 100)
    assert out.getvalue() == ("downloading hf:o/r/m.gguf (100 B)\n"
                              "   10% 10 B of 100 B\n"
                              "   55% 55 B of 100 B\n"
                              "  100% 100 B of 100 B\n")
    resumed = io.StringIO()
    progress = stderr_progress("hf:o/r/m.gguf", stream=resumed)
    progress(42, 100)
    progress(60, 100)
    assert resumed.getvalue() == "resuming hf:o/r/m.gguf at 42 B of 100 B\n   60% 60 B of 100 B\n"


def test_a_captive_portal_page_is_refused_and_nothing_of_it_is_kept(tmp_path: Path, model_data: bytes) -> None:
    """A network that answers every request with its login page (200, HTML): before, the page
    was written as the download (a partial to resume, or over a real partial)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    page = b"<!DOCTYPE html><html><body>Sign in to Airport WiFi</body></html>"

    class Portal(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_response(200)
            self.send_header("Content-Type", self.server.kind)  # type: ignore[attr-defined]
            self.send_header("Content-Length", str(len(page) * 1000))  # cut short: a "dropped" transfer
            self.end_headers()
            self.wfile.write(page)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Portal)
    Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    part = REF.cache_path(tmp_path).with_name(TEST_MODEL_NAME + ".part")
    try:
        server.kind = "text/html; charset=utf-8"  # type: ignore[attr-defined]
        with pytest.raises(ModelDownloadError) as info:
            fetch_model(REF, tmp_path, base_url=url)
        assert info.value.reason == (
            f"{REF.url(url)} answered an HTML page (text/html) (HTTP 200), not the model file: a captive "
            "portal or a proxy's login page? Nothing of it was kept; sign in to the network (or set "
            "HF_ENDPOINT) and run again")
        assert not part.exists() and list_cached(tmp_path) == []
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(model_data[:1000])  # a real partial download from before
        server.kind = "application/octet-stream"  # a portal that lies about the type
        with pytest.raises(ModelDownloadError, match=r"answered an HTML page \(HTTP 200\), not the model file"):
            fetch_model(REF, tmp_path, base_url=url)
        assert part.read_bytes() == model_data[:1000]  # untouched, still resumable
    finally:
        server.shutdown()
        server.server_close()
