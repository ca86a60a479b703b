"""qmd's GGUF models: which a command needs, whether they are on disk, whether they can be
downloaded from here, so model work fails fast with a reason instead of hanging offline."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import anyio

from fallback.gguf_file import gguf_problem
from qmdbridge.problems import CI_REFUSAL

__all__ = ["DEFAULT_MODELS", "MODEL_OVERRIDES", "ModelState", "damaged_models", "default_kinds",
           "missing_models", "model_cache_state", "model_kinds", "model_problem", "reachable"]

# The models qmd 2.8.3 resolves by default (spec 1.8); YAML or QMD_*_MODEL may override them.
DEFAULT_MODELS = {
    "embed": "hf:ggml-org/embeddinggemma-300M-GGUF/embeddinggemma-300M-Q8_0.gguf",
    "rerank": "hf:ggml-org/Qwen3-Reranker-0.6B-Q8_0-GGUF/qwen3-reranker-0.6b-q8_0.gguf",
    "generate": "hf:tobil/qmd-query-expansion-1.7B-gguf/qmd-query-expansion-1.7B-q4_k_m.gguf",
}
# The environment variables that replace a default model (the user's business, never checked).
MODEL_OVERRIDES = {"embed": "QMD_EMBED_MODEL", "rerank": "QMD_RERANK_MODEL", "generate": "QMD_GENERATE_MODEL"}
# How long the connectivity check may take, in seconds.
REACH_TIMEOUT_S = 3.0


def model_kinds(mode: str, rerank: bool | None) -> tuple[str, ...]:
    """The models a search in ``mode`` loads: ``vsearch`` embed; ``query`` embed, generate and,
    unless ``rerank`` is ``False``, rerank; ``search`` none."""
    if mode == "vsearch":
        return ("embed",)
    if mode == "query":
        return ("embed", "generate") if rerank is False else ("embed", "rerank", "generate")
    return ()


def default_kinds(kinds: tuple[str, ...], env: Mapping[str, str]) -> tuple[str, ...]:
    """The ``kinds`` whose default model qmd uses under ``env`` (no :data:`MODEL_OVERRIDES` set)."""
    return tuple(k for k in kinds if not env.get(MODEL_OVERRIDES[k]))


def missing_models(models_dir: Path, kinds: tuple[str, ...]) -> list[str]:
    """The default model URIs of ``kinds`` whose file is not in ``models_dir``."""
    have = {p.name.lower() for p in models_dir.glob("*.gguf")} if models_dir.is_dir() else set()
    return [DEFAULT_MODELS[k] for k in kinds if _file_name(k).lower() not in have]


def _file_name(kind: str) -> str:
    return DEFAULT_MODELS[kind].rsplit("/", 1)[-1]


def damaged_models(models_dir: Path, kinds: tuple[str, ...], *,
                   checked: dict[tuple[str, int, int], str | None] | None = None) -> list[str]:
    """The default model files of ``kinds`` in ``models_dir`` that are not whole GGUF models
    (:func:`fallback.gguf_file.gguf_problem`); ``checked`` caches answers by ``(path, size,
    mtime_ns)``."""
    checked = {} if checked is None else checked
    out = []
    for kind in kinds:
        path = models_dir / _file_name(kind)
        try:
            st = path.stat()
            key = (str(path), st.st_size, st.st_mtime_ns)
            if key not in checked:
                checked[key] = gguf_problem(path)
        except OSError:
            continue  # missing (missing_models) or unreadable
        if checked[key] is not None:
            out.append(str(path))
    return out


def model_cache_state(models_dir: Path, kinds: tuple[str, ...], *,
                      checked: dict[tuple[str, int, int], str | None] | None = None) -> dict[str, object]:
    """Status of qmd's model cache for ``kinds``: ``{dir, present, missing, damaged}`` (file names)."""
    damaged = {Path(p).name for p in damaged_models(models_dir, kinds, checked=checked)}
    missing = {m.rsplit("/", 1)[-1] for m in missing_models(models_dir, kinds)}
    names = [_file_name(k) for k in kinds]
    return {"dir": str(models_dir), "present": [n for n in names if n not in missing | damaged],
            "missing": [n for n in names if n in missing], "damaged": [n for n in names if n in damaged]}


async def reachable(host: str, port: int, timeout_s: float = REACH_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout_s`` seconds."""
    try:
        with anyio.fail_after(timeout_s):
            stream = await anyio.connect_tcp(host, port)
            await stream.aclose()
        return True
    except (OSError, TimeoutError):
        return False


async def model_problem(models_dir: Path, env: Mapping[str, str], *,
                        kinds: tuple[str, ...], reach: Callable[[str, int], Awaitable[bool]] | None = None,
                        checked: dict[tuple[str, int, int], str | None] | None = None) -> str | None:
    """Why model work for ``kinds`` cannot succeed here (``CI`` set, a damaged model file, models
    missing and the host unreachable: the reason and the fix), or ``None`` when it may; ``env``
    is qmd's (``CI``, ``HF_ENDPOINT``, ``QMD_*_MODEL``), ``reach`` defaults to :func:`reachable`,
    ``checked`` is the :func:`damaged_models` cache."""
    if env.get("CI"):
        return f"{CI_REFUSAL}; unset CI to embed or warm up the models"
    kinds = default_kinds(kinds, env)
    damaged = damaged_models(models_dir, kinds, checked=checked)
    if damaged:
        return (f"model file(s) {', '.join(damaged)} empty, truncated or not GGUF; "
                "delete them and run `qmdbridge warmup` where huggingface.co is reachable")
    missing = missing_models(models_dir, kinds)
    if not missing:
        return None
    from fallback.embeddings.model_fetch import hub_base_url  # tenacity & co: only when a model is missing

    parts = urlsplit(hub_base_url(env))
    host, port = parts.hostname or "huggingface.co", parts.port or (80 if parts.scheme == "http" else 443)
    if await (reach or reachable)(host, port):
        return None
    return (f"offline: cannot reach {host}:{port} to download the missing model(s) "
            f"{', '.join(missing)} (about 2 GB in all) into {models_dir}; run "
            "`qmdbridge warmup` where the host is reachable, set HF_ENDPOINT to a mirror, or point "
            "QMD_EMBED_MODEL / QMD_RERANK_MODEL / QMD_GENERATE_MODEL at local .gguf files")


class ModelState:
    """:func:`model_problem` for one agent's qmd, remembering reachability for ``reach_ttl_s``
    seconds and GGUF checks while a file is unchanged (:attr:`gguf_checked`)."""

    def __init__(self, models_dir: Path, env: Mapping[str, str], *, reach_ttl_s: float = 60.0) -> None:
        self.models_dir = models_dir
        self.env = env
        self.reach_ttl_s = reach_ttl_s
        self._reach: dict[tuple[str, int], tuple[float, bool]] = {}
        self.gguf_checked: dict[tuple[str, int, int], str | None] = {}

    async def _reachable(self, host: str, port: int) -> bool:
        now = time.monotonic()
        known = self._reach.get((host, port))
        if known is not None and now - known[0] < self.reach_ttl_s:
            return known[1]
        ok = await reachable(host, port)
        self._reach[(host, port)] = (time.monotonic(), ok)
        return ok

    async def problem(self, kinds: tuple[str, ...]) -> str | None:
        """:func:`model_problem` for ``kinds`` with the remembered reachability."""
        return await model_problem(self.models_dir, self.env, kinds=kinds, reach=self._reachable,
                                   checked=self.gguf_checked)
