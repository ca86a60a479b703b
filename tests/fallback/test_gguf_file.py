"""fallback/gguf_file.py: a whole GGUF model, and every way a file can fail to be one,
on the real test model (../shared/models)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.gguf_file import gguf_problem


@pytest.fixture(scope="module")
def model_bytes(gguf_test_model: Path) -> bytes:
    return gguf_test_model.read_bytes()


def test_the_whole_model_is_a_gguf_model(model_bytes: bytes, tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(model_bytes)
    assert gguf_problem(path) is None


def test_a_model_cut_inside_its_tensor_data_is_truncated(model_bytes: bytes, tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(model_bytes[: len(model_bytes) // 2])
    problem = gguf_problem(path)
    assert problem is not None
    assert problem.startswith(f"truncated ({len(model_bytes) // 2} bytes, the tensor data reaches past ")


def test_a_model_cut_inside_its_header_is_truncated(model_bytes: bytes, tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(model_bytes[:4096])
    assert gguf_problem(path) == "truncated (the header ends early)"


@pytest.mark.parametrize(("content", "problem"), [
    (b"", "empty file"),
    (b"<html><body>Sign in to the network</body></html>", "not a GGUF file"),
    (b"GGUF\x03\x00\x00\x00" + (1 << 40).to_bytes(8, "little") + b"\x00" * 8,
     f"damaged header (implausible count {1 << 40})"),
])
def test_files_that_are_no_model(content: bytes, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(content)
    assert gguf_problem(path) == problem
