"""Both backends implement the one backend protocol (``fallback.contract.MemoryBackend``) with
compatible signatures, and the manager reaches them through nothing else."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from fallback.contract import MemoryBackend
from fallback.engine.builtin import BuiltinEngine
from fallback.settings import EngineSettings, MemorySearchSettings
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.locate import QmdLocation

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_METHODS = ["close", "prepare", "read_file", "search", "start", "status", "sync"]


def _protocol_methods() -> dict[str, object]:
    return {name: fn for name, fn in vars(MemoryBackend).items()
            if callable(fn) and not name.startswith("_")}


def _builtin(tmp_path: Path) -> BuiltinEngine:
    settings = EngineSettings.for_workspace(tmp_path / "ws", search=MemorySearchSettings(provider="none"))
    return BuiltinEngine(settings)


def _qmd(tmp_path: Path) -> QmdBackend:
    agent = resolve_agent(parse_config({"memory": {"backend": "qmd"}}), "main", workspace=tmp_path / "ws",
                          env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    loc = QmdLocation(path="/nonexistent/qmd", found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env="", child_path="")
    return QmdBackend(agent, location=loc, mode="cli", env={})


def test_the_protocol_declares_exactly_the_lifecycle_and_the_tools() -> None:
    assert sorted(_protocol_methods()) == PROTOCOL_METHODS
    for name, fn in _protocol_methods().items():
        assert inspect.getdoc(fn), f"MemoryBackend.{name} has no docstring"


@pytest.mark.parametrize("make", [_builtin, _qmd], ids=["builtin", "qmd"])
def test_backend_satisfies_the_protocol_with_compatible_signatures(tmp_path: Path, make) -> None:
    backend = make(tmp_path)
    assert isinstance(backend, MemoryBackend)
    assert backend.name in ("builtin", "qmd")
    for name, proto_fn in _protocol_methods().items():
        impl = getattr(type(backend), name)
        assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(proto_fn), name
        want = inspect.signature(proto_fn).parameters
        got = inspect.signature(impl).parameters
        for pname, p in want.items():
            assert pname in got, f"{type(backend).__name__}.{name} lacks {pname!r}"
            assert got[pname].kind == p.kind, f"{name}({pname})"
            if p.default is not inspect.Parameter.empty:  # a default may be added, not changed
                assert got[pname].default == p.default, f"{name}({pname})"
        for pname, p in got.items():
            if pname not in want:  # extras are optional keywords, so protocol calls still work
                assert p.default is not inspect.Parameter.empty, f"{name}({pname}) is required"
    # one answer type: the outcome carries the notes, mode and provider (no side channel)
    assert inspect.signature(type(backend).search).return_annotation == "SearchOutcome"
    assert not hasattr(backend, "search_info")


def test_the_manager_uses_no_private_backend_attributes() -> None:
    for rel in ("qmdbridge/manager.py", "qmdbridge/sidecar.py"):
        source = (ROOT / rel).read_text()
        assert "type: ignore" not in source, rel
        assert not re.search(r"\b(?:backend|engine|_qmd|_builtin)\._[a-z]", source), rel
        assert "on_progress" not in source, rel
