"""The identity an index is built for (spec §4.3-4.4): what it holds and how, so a sync knows
when it must rebuild rather than update, and the chunk primary key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fallback.index.windows import EMBED_WINDOW_OVERLAP, EMBED_WINDOW_TOKENS
from fallback.sources.memory_files import extra_roots
from fallback.text.chunking import CHUNKING_VERSION
from fallback.text.scripts import sha256_hex

if TYPE_CHECKING:  # annotations only: the one-shot search compares identities without them
    from fallback.embeddings.base import EmbeddingProvider
    from fallback.settings import EngineSettings

__all__ = ["FTS_ONLY_MODEL", "WORKSPACE_META", "chunk_id", "full_reindex_reason", "index_identity",
           "other_workspace", "workspace_switch_note"]

# Model name recorded for chunks written without an embedding provider (spec §3).
FTS_ONLY_MODEL = "fts-only"
# ``meta`` key of the workspace an index holds (its absolute path), written by every scan.
WORKSPACE_META = "workspace_dir"


def chunk_id(*, source: str, path: str, start_line: int, end_line: int, content_hash: str,
             model: str) -> str:
    """Chunk primary key: ``sha256_hex("<source>:<path>:<start>:<end>:<hash>:<model>")`` (spec §3)."""
    return sha256_hex(f"{source}:{path}:{start_line}:{end_line}:{content_hash}:{model}")


def index_identity(settings: EngineSettings, provider: EmbeddingProvider | None) -> dict[str, Any]:
    """The identity an index is built for (spec §4.3); any change forces a full reindex.

    Returns:
        ``{model, provider, providerKey, vectorDims, sources, chunkTokens, chunkOverlap,
        chunkSections, chunkingVersion, scopeHash, ftsTokenizer, embedWindows}`` (without a
        provider: model ``fts-only``, provider ``none``, embedWindows ``None``; ``vectorDims``
        ``None`` while unknown; ``scopeHash``: sha256 of the sorted absolute extra paths and
        the multimodal settings).
    """
    import orjson

    s = settings.search
    roots = extra_roots(settings.workspace_dir, s.extra_paths)
    extra = sorted({str(r.entry).replace("\\", "/") for r in roots})
    scope = {"extraPaths": extra,
             "multimodal": {"enabled": False, "modalities": [], "maxFileBytes": s.max_file_bytes}}
    return {
        "model": provider.model if provider else FTS_ONLY_MODEL,
        "provider": provider.provider_id if provider else "none",
        "providerKey": (provider.provider_key if provider
                        else sha256_hex(orjson.dumps({"provider": "none", "model": FTS_ONLY_MODEL}))),
        "vectorDims": provider.dims if provider else None,
        "sources": sorted(s.sources),
        "chunkTokens": s.chunking.tokens,
        "chunkOverlap": s.chunking.overlap,
        "chunkSections": s.chunking.sections,
        "chunkingVersion": CHUNKING_VERSION,
        "scopeHash": sha256_hex(orjson.dumps(scope, option=orjson.OPT_SORT_KEYS)),
        "ftsTokenizer": s.store.fts.tokenizer,
        "embedWindows": ({"tokens": EMBED_WINDOW_TOKENS, "overlap": EMBED_WINDOW_OVERLAP}
                         if provider else None),
    }


def other_workspace(stored: Any, workspace: str) -> str | None:
    """The workspace an index holds (``stored``, the :data:`WORKSPACE_META` value) when it is
    a path other than the absolute ``workspace``, else ``None``."""
    return stored if isinstance(stored, str) and stored != workspace else None


def workspace_switch_note(db_path: str, held: str, workspace: str) -> str:
    """What a sync that re-indexes a store for another workspace tells the user (one line)."""
    return (f"index store {db_path} held workspace {held}; re-indexing it for {workspace} "
            "(one index per agent: every switch re-indexes it; to keep both indexed, give each "
            "workspace its own agent (--agent, agents.list) or state dir (OPENCLAW_STATE_DIR))")


def full_reindex_reason(meta: Any, identity: dict[str, Any]) -> str | None:
    """Why the stored ``meta`` requires a full reindex for ``identity``, or ``None`` (spec §4.4):
    ``no index metadata``, ``model changed (<old> -> <new>)``, ``provider changed``, ``provider
    settings changed``, ``embedding dimensions changed (<old> -> <new>)``, ``sources changed``,
    ``scope changed``, ``chunking changed``, ``embedding windows changed``, ``FTS tokenizer
    changed``."""
    if not isinstance(meta, dict):
        return "no index metadata"
    for key in ("model", "provider"):
        if meta.get(key) != identity[key]:
            return f"{key} changed ({meta.get(key)} -> {identity[key]})"
    if meta.get("providerKey") != identity["providerKey"]:
        return "provider settings changed"
    old_dims, new_dims = meta.get("vectorDims"), identity.get("vectorDims")
    if isinstance(old_dims, int) and isinstance(new_dims, int) and old_dims != new_dims:
        return f"embedding dimensions changed ({old_dims} -> {new_dims})"
    if sorted(meta.get("sources") or ["memory"]) != identity["sources"]:
        return "sources changed"
    if meta.get("scopeHash") != identity["scopeHash"]:
        return "scope changed"
    chunking = {"chunkTokens": None, "chunkOverlap": None, "chunkSections": False, "chunkingVersion": 1}
    if any(meta.get(key, old_default) != identity[key] for key, old_default in chunking.items()):
        return "chunking changed"
    if meta.get("embedWindows") != identity["embedWindows"]:
        return "embedding windows changed"
    if (meta.get("ftsTokenizer") or "unicode61") != identity["ftsTokenizer"]:
        return "FTS tokenizer changed"
    return None
