"""The public surface: ``qmdbridge.__all__`` is pinned and every name resolves; the import of
``qmdbridge`` alone stays light; the fallback package never imports qmdbridge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import qmdbridge

EXPECTED = {
    "BackendTimeoutError", "BackendUnavailableError", "BlockingMemoryManager", "ConfigError",
    "EmbeddingProviderError", "FallbackInfo", "IndexStoreError", "MEMORY_GET_SCHEMA",
    "MEMORY_SEARCH_SCHEMA", "ManagerClosedError", "MemoryFileNotFoundError", "MemoryManager",
    "MemoryReadResult",
    "MemorySearchError", "MemorySearchResult", "MemoryStatus", "PathRefusedError", "ResolvedAgent",
    "SearchResponse", "UsageError", "handle_memory_get", "handle_memory_search", "load_config",
    "resolve_agent",
}


def test_all_is_pinned_and_resolves() -> None:
    assert set(qmdbridge.__all__) == EXPECTED
    for name in qmdbridge.__all__:
        assert getattr(qmdbridge, name) is not None, name
    assert issubclass(qmdbridge.PathRefusedError, qmdbridge.MemorySearchError)


def test_importing_qmdbridge_loads_no_heavy_module() -> None:
    code = ("import sys, qmdbridge; heavy = [m for m in ('pydantic', 'httpx', 'numpy', 'rich', "
            "'llama_cpp', 'watchdog') if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_fallback_never_imports_qmdbridge() -> None:
    root = Path(__file__).resolve().parents[2] / "fallback"
    offenders = [str(p) for p in root.rglob("*.py")
                 if any(line.lstrip().startswith(("import qmdbridge", "from qmdbridge"))
                        for line in p.read_text().splitlines())]
    assert offenders == []
