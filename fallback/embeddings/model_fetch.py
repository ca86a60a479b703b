"""Model downloads: GGUF embedding models fetched from a Hugging Face-style hub into the model cache.

``local.modelPath`` names a file, an ``hf:<owner>/<repo>/<file>.gguf`` URI, or nothing (then
:data:`DEFAULT_MODEL`). A URI is downloaded on first use (or by ``qmdbridge models pull``) into
``<cache>/hf/<owner>/<repo>/<file>`` beside its ``.sha256``, through ``.part`` (resumed) under
a ``.lock``; the checks and the hub URL are in docs/configuration.md ("Semantic search"). A body
that cannot be the file (a captive portal's page) is refused before anything is written. Every
failure is a :class:`~fallback.errors.ModelDownloadError` saying what to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING
from urllib.parse import quote, urlsplit

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from fallback.errors import LockTimeoutError, ModelDownloadError
from fallback.fs import state_dir
from fallback.fs.atomic import publish_file, write_atomic
from fallback.fs.lock import PidFileLock
from fallback.gguf_file import GGUF_MAGIC

if TYPE_CHECKING:  # httpx is imported by the download itself, so loading this module is cheap
    import httpx

__all__ = ["DEFAULT_HF_ENDPOINT", "DEFAULT_MODEL", "KNOWN_MODELS", "CachedModel", "FetchResult",
           "ModelRef", "ModelSpec", "ProgressFn", "default_cache_dir", "fetch_model", "find_model",
           "format_bytes", "hub_base_url", "list_cached", "parse_hf_uri", "stderr_progress"]

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
HF_URI_PREFIX = "hf:"
# Transfers that drop mid-body are resumed this many times in all within one fetch.
DOWNLOAD_ATTEMPTS = 3
# Connect and read deadlines of one request, in seconds (a stalled read counts as dropped).
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
# Bytes read per chunk of the response body.
CHUNK_BYTES = 1 << 20
# How long a second process waits for a download another process is running, in ms.
LOCK_TIMEOUT_MS = 30 * 60 * 1000
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_CONTENT_RANGE_RE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

ProgressFn = Callable[[int, "int | None"], None]
"""``on_progress(done_bytes, total_bytes)``: called as a download advances (``total_bytes`` is
``None`` while unknown); ``done_bytes`` counts the resumed part too."""


@dataclass(frozen=True)
class ModelRef:
    """A ``file`` (``/``-separated) in a hub ``repo`` (``<owner>/<name>``) at a ``revision``."""

    repo: str
    file: str
    revision: str = "main"

    @property
    def uri(self) -> str:
        """``hf:<owner>/<repo>/<file>``, the form ``local.modelPath`` takes."""
        return f"{HF_URI_PREFIX}{self.repo}/{self.file}"

    def url(self, base_url: str) -> str:
        """``{base_url}/{repo}/resolve/{revision}/{file}`` (the file's segments URL-quoted)."""
        return f"{base_url.rstrip('/')}/{self.repo}/resolve/{quote(self.revision, safe='')}/{quote(self.file)}"

    def cache_path(self, cache_dir: Path) -> Path:
        """Where the model lives in the cache: ``<cache_dir>/hf/<owner>/<repo>/<file>``."""
        return Path(cache_dir, "hf", *self.repo.split("/"), *self.file.split("/"))


@dataclass(frozen=True)
class ModelSpec:
    """A model known by ``name`` (``qmdbridge models pull <name>``): where it comes from
    (``ref``), its pinned sha256 (hex) and size in bytes (or None), its ``dims``, and the
    ``query_prefix`` its authors put before a search query (not before chunks)."""

    name: str
    ref: ModelRef
    sha256: str | None
    size_bytes: int | None
    dims: int
    query_prefix: str = ""

    @property
    def uri(self) -> str:
        """The ``hf:`` URI of :attr:`ref`."""
        return self.ref.uri


# The default local embedding model: BAAI's bge-small-en-v1.5 (MIT, 384 dimensions) as Q8_0
# GGUF: small enough for a CPU, and better at retrieval than models of its size.
DEFAULT_MODEL = ModelSpec(
    name="bge-small-en-v1.5",
    ref=ModelRef("CompendiumLabs/bge-small-en-v1.5-gguf", "bge-small-en-v1.5-q8_0.gguf"),
    sha256="ec38e8da142596baa913124ae50550de284b6916bf59577ef2f0cb9660c2f514",
    size_bytes=36_806_944,
    dims=384,
    query_prefix="Represent this sentence for searching relevant passages: ",
)
KNOWN_MODELS: Mapping[str, ModelSpec] = {DEFAULT_MODEL.name: DEFAULT_MODEL}


@dataclass(frozen=True)
class FetchResult:
    """What :func:`fetch_model` did: the cached ``path``, its size and sha256, whether it was
    ``downloaded``, the bytes ``resumed_from``, and ``verified_by`` (``pinned``, ``hub``,
    ``sidecar``, ``size`` or ``cache``)."""

    path: Path
    size_bytes: int
    sha256: str
    downloaded: bool
    resumed_from: int = 0
    verified_by: str = "cache"


@dataclass(frozen=True)
class CachedModel:
    """One model file in the cache (``qmdbridge models list``): its ``uri``, ``path`` (the
    ``.part`` file when not ``complete``), bytes on disk, recorded sha256 (or None), and
    whether it is the ``default`` model."""

    uri: str
    path: Path
    size_bytes: int
    sha256: str | None
    complete: bool
    default: bool


@dataclass
class _Expected:
    """What the download must match, filled in from the pin and the hub's headers."""

    sha256: str | None = None
    sha_source: str | None = None
    size: int | None = None
    resumed_from: int = 0


class _Dropped(Exception):
    """The transfer stopped mid-body; what arrived is kept in the ``.part`` file."""


def parse_hf_uri(uri: str) -> ModelRef:
    """Split ``hf:<owner>/<repo>/<file>.gguf`` (the file may sit in folders of the repository).
    Raises ``ValueError``: not of that form (the message says which form is expected)."""
    text = uri.strip()
    parts = text[len(HF_URI_PREFIX):].split("/") if text.startswith(HF_URI_PREFIX) else []
    if (len(parts) < 3 or not all(_SEGMENT_RE.fullmatch(p) for p in parts)
            or not parts[-1].lower().endswith(".gguf")):
        raise ValueError(f"{uri!r} is not a model URI of the form hf:<owner>/<repo>/<file>.gguf")
    return ModelRef(repo=f"{parts[0]}/{parts[1]}", file="/".join(parts[2:]))


def find_model(name_or_uri: str) -> ModelSpec | ModelRef:
    """A known model by name (``bge-small-en-v1.5``) or URI, else the parsed ``hf:`` URI.
    Raises ``ValueError``: neither a known name nor an ``hf:`` URI."""
    text = name_or_uri.strip()
    if text in KNOWN_MODELS:
        return KNOWN_MODELS[text]
    if not text.startswith(HF_URI_PREFIX):
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ValueError(f"unknown model {text!r} (known: {known}; or an hf:<owner>/<repo>/<file>.gguf URI)")
    ref = parse_hf_uri(text)
    return next((s for s in KNOWN_MODELS.values() if s.ref == ref), ref)


def hub_base_url(env: Mapping[str, str]) -> str:
    """``$HF_ENDPOINT`` without a trailing ``/``, else ``https://huggingface.co``."""
    return (env.get("HF_ENDPOINT") or "").strip().rstrip("/") or DEFAULT_HF_ENDPOINT


def default_cache_dir(configured: str | None, env: Mapping[str, str]) -> Path:
    """The model cache: ``local.modelCacheDir`` (``~`` expanded), else ``<stateDir>/models``
    (:func:`fallback.fs.state_dir` of ``env``)."""
    if configured and configured.strip():
        return Path(configured.strip()).expanduser().resolve()
    return Path(state_dir(env), "models")


def format_bytes(n: float) -> str:
    """``36806944`` -> ``"36.8 MB"`` (decimal units, one decimal)."""
    for unit in ("B", "kB", "MB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _digest_in(text: str) -> str | None:
    """The sha256 a ``.sha256`` file's text starts with (``sha256sum`` output), or None."""
    words = text.split()
    return words[0].lower() if words and _SHA256_RE.fullmatch(words[0].lower()) else None


def _read_digest(path: Path) -> str | None:
    try:
        return _digest_in(path.read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def _cached(target: Path, pinned: str | None) -> FetchResult | None:
    """The cached file when it is usable: present, and matching the pin when there is one."""
    try:
        size = target.stat().st_size
    except OSError:
        return None
    digest = _read_digest(_sidecar(target))
    if pinned is not None and digest != pinned:
        if digest is not None or _file_sha256(target) != pinned:
            return None  # another build of the file: download the pinned one over it
        digest = pinned
        write_atomic(_sidecar(target), f"{digest}\n".encode())
    return FetchResult(path=target, size_bytes=size, sha256=digest or _file_sha256(target),
                       downloaded=False)


def list_cached(cache_dir: Path) -> list[CachedModel]:
    """Every model file (and partial download) under ``<cache_dir>/hf``, sorted by URI."""
    root = Path(cache_dir, "hf")
    out: list[CachedModel] = []
    if not root.is_dir():
        return out
    for path in sorted(root.rglob("*")):
        name = path.name
        complete = name.lower().endswith(".gguf")
        if not path.is_file() or not (complete or name.lower().endswith(".gguf.part")):
            continue
        rel = path.relative_to(root).parts
        if len(rel) < 3:
            continue
        file = "/".join(rel[2:])
        uri = f"{HF_URI_PREFIX}{rel[0]}/{rel[1]}/{file if complete else file[:-len('.part')]}"
        out.append(CachedModel(uri=uri, path=path, size_bytes=path.stat().st_size,
                               sha256=_read_digest(_sidecar(path)) if complete else None,
                               complete=complete, default=uri == DEFAULT_MODEL.ref.uri))
    return out


def _normal_etag(value: str | None) -> str | None:
    if not value:
        return None
    tag = value.strip().removeprefix("W/").strip('"').lower()
    return tag if _SHA256_RE.fullmatch(tag) else None


def _learn(expected: _Expected, response: httpx.Response, offset: int) -> None:
    """Take the sha256 and size the hub reports (redirects included) where nothing is pinned."""
    for r in (*response.history, response):
        for name in ("x-linked-etag", "etag"):
            tag = _normal_etag(r.headers.get(name))
            if tag and expected.sha256 is None:
                expected.sha256, expected.sha_source = tag, "hub"
        linked = r.headers.get("x-linked-size", "")
        if expected.size is None and linked.isdigit():
            expected.size = int(linked)
    if expected.size is None:
        match = _CONTENT_RANGE_RE.match(response.headers.get("content-range", ""))
        length = response.headers.get("content-length", "")
        if response.status_code == 206 and match and match.group(3) != "*":
            expected.size = int(match.group(3))
        elif response.status_code == 200 and length.isdigit():
            expected.size = int(length)
        elif response.status_code == 206 and length.isdigit():
            expected.size = offset + int(length)


def _transfer(client: httpx.Client, uri: str, url: str, part: Path, expected: _Expected,
              on_progress: ProgressFn | None) -> None:
    """One GET of the file into ``part``, resuming from its current length when it has one."""
    import httpx

    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        with client.stream("GET", url, headers=headers) as response:
            _learn(expected, response, offset)
            status = response.status_code
            if status == 416 and offset:  # nothing past our offset: complete, or a stale part
                total = response.headers.get("content-range", "").rpartition("/")[2].strip()
                if total.isdigit() and int(total) == offset:
                    return
                part.unlink(missing_ok=True)
                raise _Dropped("the partial download does not fit the file; starting over")
            if status == 404:
                raise ModelDownloadError(uri, f"not found on the hub: {url} (HTTP 404); check the "
                                              "owner, repository and file name of the hf: URI")
            if status == 429 or status >= 500:  # busy or failing for now: retried, the partial kept
                raise _Dropped(f"the hub answered HTTP {status}")
            if status >= 400:
                raise ModelDownloadError(uri, f"download of {url} failed with HTTP {status}; download the "
                                              ".gguf file and set local.modelPath to its path, or set HF_ENDPOINT")
            match = _CONTENT_RANGE_RE.match(response.headers.get("content-range", ""))
            resumed = status == 206 and offset and match and int(match.group(1)) == offset
            blocks = response.iter_bytes()
            head = b""
            for block in blocks:  # the first bytes decide, before the partial file is touched
                head += block
                if len(head) >= len(GGUF_MAGIC):
                    break
            refused = _not_a_model(response, head, whole=not resumed and url.endswith(".gguf"))
            if refused is not None:
                raise ModelDownloadError(uri, f"{url} answered {refused} (HTTP {status}), not the model "
                                              "file: a captive portal or a proxy's login page? Nothing of "
                                              "it was kept; sign in to the network (or set HF_ENDPOINT) "
                                              "and run again")
            if resumed:
                mode = "ab"
                expected.resumed_from = expected.resumed_from or offset
            else:  # the server ignored the range (or we asked for none): from the start
                mode, offset = "wb", 0
            done = offset
            with open(part, mode) as fh:
                if on_progress is not None:
                    on_progress(done, expected.size)
                for block in itertools.chain((head,), blocks):  # as received, so a drop loses nothing
                    fh.write(block)
                    done += len(block)
                    if on_progress is not None:
                        on_progress(done, expected.size)
    except (httpx.ReadError, httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.WriteError) as exc:
        raise _Dropped(f"transfer dropped: {type(exc).__name__}") from exc
    if expected.size is not None and done < expected.size:
        raise _Dropped(f"transfer ended at {done} of {expected.size} bytes")


def _not_a_model(response: httpx.Response, head: bytes, *, whole: bool) -> str | None:
    """What a 2xx body is when it cannot be the model file (by its ``Content-Type``, or, when
    ``whole``, its missing GGUF magic in ``head``), or ``None``."""
    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if "html" in kind:
        return f"an HTML page ({kind})"
    if kind.startswith("text/") or kind.endswith(("/json", "/xml", "+xml")):
        return f"a {kind} document"
    if whole and not head.startswith(GGUF_MAGIC):
        return "an HTML page" if head.lstrip()[:1] == b"<" else "a body that is not a GGUF file"
    return None


def _download(target: Path, cache_dir: Path, uri: str, url: str, expected: _Expected, *,
              on_progress: ProgressFn | None, attempts: int) -> FetchResult:
    import httpx

    part = target.with_name(target.name + ".part")
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    with httpx.Client(follow_redirects=True, timeout=timeout, headers={"User-Agent": "qmdbridge"}) as client:
        retrying = Retrying(retry=retry_if_exception_type(_Dropped), stop=stop_after_attempt(max(1, attempts)),
                            wait=wait_exponential(multiplier=0.2, max=2.0), reraise=True)
        try:
            retrying(_transfer, client, uri, url, part, expected, on_progress)
        except _Dropped as exc:
            kept = part.stat().st_size if part.exists() else 0
            raise ModelDownloadError(
                uri, f"download of {uri} interrupted after {format_bytes(kept)} ({exc}); "
                     f"run again to resume from {part}") from exc
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            host = urlsplit(url)
            raise ModelDownloadError(
                uri, f"offline: cannot reach {host.hostname}:{host.port or (80 if host.scheme == 'http' else 443)} "
                     f"to download {uri} into {cache_dir} ({type(exc).__name__}); run `qmdbridge models "
                     "pull` where the hub is reachable, set HF_ENDPOINT to a mirror, or download the "
                     ".gguf file and set local.modelPath to its path") from exc
        except httpx.HTTPError as exc:
            raise ModelDownloadError(uri, f"download of {url} failed: {type(exc).__name__}: {exc}") from exc
        if expected.sha256 is None:  # the sha256 of a <file>.sha256 published next to the file
            with contextlib.suppress(httpx.HTTPError):
                response = client.get(url + ".sha256")
                found = _digest_in(response.text) if response.status_code == 200 else None
                if found is not None:
                    expected.sha256, expected.sha_source = found, "sidecar"
    size = part.stat().st_size
    if expected.size is not None and size != expected.size:
        part.unlink(missing_ok=True)
        raise ModelDownloadError(uri, f"size mismatch for {uri}: got {size} bytes, expected "
                                      f"{expected.size}; the download was discarded")
    digest = _file_sha256(part)
    if expected.sha256 is not None and digest != expected.sha256:
        part.unlink(missing_ok=True)
        source = {"pinned": "the pinned digest", "hub": "the hub's ETag",
                  "sidecar": "the published .sha256"}[expected.sha_source or "pinned"]
        raise ModelDownloadError(uri, f"checksum mismatch for {uri}: sha256 {digest}, but {source} is "
                                      f"{expected.sha256}; the download was discarded")
    publish_file(part, target)
    write_atomic(_sidecar(target), f"{digest}\n".encode())
    return FetchResult(path=target, size_bytes=size, sha256=digest, downloaded=True,
                       resumed_from=expected.resumed_from,
                       verified_by=expected.sha_source or "size")


def fetch_model(model: ModelSpec | ModelRef, cache_dir: Path, *, base_url: str = DEFAULT_HF_ENDPOINT,
                on_progress: ProgressFn | None = None, attempts: int = DOWNLOAD_ATTEMPTS) -> FetchResult:
    """Make sure ``model`` (a :class:`ModelSpec`, its pins checked, or a bare :class:`ModelRef`)
    is in ``cache_dir``: return it when there, else download it from the hub ``base_url`` and
    verify it (blocking; one process downloads a given file at a time, others wait for it).
    ``on_progress(done_bytes, total_bytes)`` is told as bytes arrive; ``attempts``: transfers
    per call, a dropped one resumed with an HTTP Range request.

    Raises:
        ModelDownloadError: the hub is unreachable (``offline: ...``) or answers an error, the
            transfer kept dropping (the partial file is kept), the file fails its checks, or
            the model cache cannot be written.
        LockTimeoutError: another process held the download lock past :data:`LOCK_TIMEOUT_MS`.
    """
    spec, ref = (model, model.ref) if isinstance(model, ModelSpec) else (None, model)
    cache = Path(cache_dir)
    target = ref.cache_path(cache)
    pinned = spec.sha256 if spec is not None else None
    try:
        found = _cached(target, pinned)
        if found is not None:
            return found
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = PidFileLock(target.with_name(target.name + ".lock"), timeout_ms=LOCK_TIMEOUT_MS)
        with lock.hold_blocking():
            found = _cached(target, pinned)  # another process may have finished it meanwhile
            if found is not None:
                return found
            expected = _Expected(sha256=pinned, sha_source="pinned" if pinned else None,
                                 size=spec.size_bytes if spec is not None else None)
            return _download(target, cache, ref.uri, ref.url(base_url), expected,
                             on_progress=on_progress, attempts=attempts)
    except LockTimeoutError:
        raise  # a TimeoutError, so an OSError too: told as such
    except OSError as exc:  # the file system, not the network (_download maps that)
        raise ModelDownloadError(ref.uri, f"cannot use the model cache {cache_dir}: {exc.strerror or exc} "
                                          f"({exc.filename or cache_dir}); let this user write it, or set "
                                          "local.modelCacheDir to a folder it can write") from exc


def stderr_progress(uri: str, *, stream: IO[str] | None = None, step_percent: int = 10) -> ProgressFn:
    """A plain-text ``on_progress`` on stderr: ``downloading <uri> (36.8 MB)`` (or
    ``resuming ...``), then ``  50% 18.4 MB of 36.8 MB`` every ``step_percent``."""
    next_percent: int | None = None  # None before the first call

    def on_progress(done: int, total: int | None) -> None:
        nonlocal next_percent
        out = stream if stream is not None else sys.stderr
        percent = done * 100 // total if total else 0
        if next_percent is None:
            of = f" of {format_bytes(total)}" if total else ""
            out.write(f"resuming {uri} at {format_bytes(done)}{of}\n" if done
                      else f"downloading {uri}{f' ({format_bytes(total)})' if total else ''}\n")
        elif not total or percent < next_percent:
            return
        else:
            out.write(f"  {percent:3d}% {format_bytes(done)} of {format_bytes(total)}\n")
        next_percent = (percent // step_percent + 1) * step_percent
        out.flush()

    return on_progress

