"""Provider selection rules, provider keys and settings plumbing (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.embeddings import AUTO_ORDER, PROVIDERS, ProviderSelection, select_provider
from fallback.embeddings.base import compute_provider_key, max_input_tokens_for
from fallback.embeddings.local_gguf import LLAMA_CPP_MISSING, is_llama_cpp_installed
from fallback.errors import EmbeddingProviderUnavailableError
from fallback.settings import MemorySearchSettings

NO_KEYS = "no API key found for openai, gemini, voyage, mistral"


def cfg(**values: object) -> MemorySearchSettings:
    return MemorySearchSettings.model_validate(values)


def test_auto_without_keys_is_keyword_only_with_joined_reasons() -> None:
    sel = select_provider(cfg(), env={})
    assert sel == ProviderSelection(None, "auto",
                                    unavailable_reason=f"{NO_KEYS}; no local model configured")


def test_auto_order_and_key_sources() -> None:
    assert AUTO_ORDER == ("local", "openai", "gemini", "voyage", "mistral")
    both = select_provider(cfg(), env={"OPENAI_API_KEY": "sk-1", "GEMINI_API_KEY": "g-1"})
    assert both.provider is not None and both.provider.provider_id == "openai"
    google = select_provider(cfg(), env={"GOOGLE_API_KEY": "g-2", "MISTRAL_API_KEY": "m-1"})
    assert google.provider is not None and google.provider.provider_id == "gemini"
    mistral = select_provider(cfg(), env={"MISTRAL_API_KEY": "m-1"})
    assert mistral.provider is not None
    assert (mistral.provider.provider_id, mistral.provider.model) == ("mistral", "mistral-embed")
    configured = select_provider(cfg(remote={"apiKey": "sk-conf"}), env={})
    assert configured.provider is not None and configured.provider.provider_id == "openai"


def test_auto_prefers_local_when_model_file_exists(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    sel = select_provider(cfg(local={"modelPath": str(model)}), env={"OPENAI_API_KEY": "sk"})
    assert sel.provider is not None
    if is_llama_cpp_installed():
        assert sel.provider.provider_id == "local"
        assert sel.provider.model == str(model)
    else:
        assert sel.provider.provider_id == "openai"


def test_auto_reports_local_reasons(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    sel = select_provider(cfg(local={"modelPath": str(missing)}), env={})
    assert sel.unavailable_reason == f"{NO_KEYS}; local model file not found: {missing}"
    # auto never downloads: an hf: URI counts only once it is in the model cache
    sel = select_provider(cfg(local={"modelPath": "hf:org/repo/model.gguf"}),
                          env={"OPENCLAW_STATE_DIR": str(tmp_path)})
    assert sel.provider is None and sel.error is None
    assert sel.unavailable_reason == (
        f"{NO_KEYS}; local.modelPath hf:org/repo/model.gguf is not downloaded yet; set provider: "
        '"local" to download it on first use, or run `qmdbridge models pull hf:org/repo/model.gguf`')
    cached = tmp_path / "models" / "hf" / "org" / "repo" / "model.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF")
    sel = select_provider(cfg(local={"modelPath": "hf:org/repo/model.gguf"}),
                          env={"OPENCLAW_STATE_DIR": str(tmp_path)})
    if is_llama_cpp_installed():
        assert sel.provider is not None and sel.provider.model == "hf:org/repo/model.gguf"
        assert sel.provider.model_path == cached and sel.provider.download is None  # type: ignore[attr-defined]
    bad = select_provider(cfg(local={"modelPath": "https://example.com/m.gguf"}), env={})
    assert bad.unavailable_reason == (
        f"{NO_KEYS}; local.modelPath https://example.com/m.gguf is a URL; give a file path or an "
        "hf:<owner>/<repo>/<file>.gguf URI (downloaded on first use)")


def test_none_is_keyword_only_on_purpose() -> None:
    sel = select_provider(cfg(provider="none"), env={"OPENAI_API_KEY": "sk"})
    assert sel == ProviderSelection(None, "none", unavailable_reason="provider set to none")


def test_explicit_provider_falls_back() -> None:
    sel = select_provider(cfg(provider="openai", fallback="gemini"), env={"GEMINI_API_KEY": "g"})
    assert sel.provider is not None and sel.provider.provider_id == "gemini"
    assert (sel.requested, sel.error) == ("openai", None)
    assert sel.unavailable_reason == "no API key found for openai"


def test_explicit_provider_unavailable_is_an_error() -> None:
    sel = select_provider(cfg(provider="voyage"), env={"OPENAI_API_KEY": "sk"})
    assert (sel.provider, sel.requested, sel.unavailable_reason, sel.error) == (
        None, "voyage", "no API key found for voyage",
        "memory search unavailable: voyage: no API key found for voyage")
    assert sel.failure is not None and (sel.failure.provider, sel.failure.reason) == (
        "voyage", "no API key found for voyage")
    both = select_provider(cfg(provider="openai", fallback="mistral"), env={})
    assert both.error == ("memory search unavailable: openai: no API key found for openai; "
                          "fallback mistral: no API key found for mistral")
    same = select_provider(cfg(provider="openai", fallback="openai"), env={})
    assert same.error == "memory search unavailable: openai: no API key found for openai"
    unknown = select_provider(cfg(provider="openai", fallback="cohere"), env={})
    assert unknown.error == ("memory search unavailable: openai: no API key found for openai; "
                             "fallback cohere: unknown embedding provider 'cohere'")


def test_a_secret_ref_key_is_read_from_its_variable_or_says_why_not() -> None:
    ref = {"source": "env", "provider": "default", "id": "MEMORY_OPENAI_KEY"}
    sel = select_provider(cfg(provider="openai", remote={"apiKey": ref}),
                          env={"MEMORY_OPENAI_KEY": "sk-ref"})
    assert sel.provider is not None and sel.provider.provider_id == "openai"
    unset = select_provider(cfg(provider="openai", remote={"apiKey": ref}), env={})
    assert unset.error == ("memory search unavailable: openai: no API key found for openai "
                           "(remote.apiKey names $MEMORY_OPENAI_KEY, which is not set)")
    in_file = {"source": "file", "provider": "filemain", "id": "/providers/openai/apiKey"}
    file_ref = select_provider(cfg(provider="openai", remote={"apiKey": in_file}), env={})
    assert file_ref.error == ("memory search unavailable: openai: no API key found for openai "
                              "(remote.apiKey is a 'file' SecretRef; qmdbridge reads only 'env' ones)")
    auto = select_provider(cfg(remote={"apiKey": ref}), env={"MEMORY_OPENAI_KEY": "sk-ref"})
    assert auto.provider is not None and auto.provider.provider_id == "openai"
    with pytest.raises(ValueError, match=r"a key, or a SecretRef such as \{source: \"env\""):
        cfg(remote={"apiKey": {"source": "vault", "id": "x"}})


def test_openclaws_other_adapters_load_and_search_says_it_cannot_use_them() -> None:
    sel = select_provider(cfg(provider="bedrock"), env={"OPENAI_API_KEY": "sk"})
    assert sel.error == ("memory search unavailable: bedrock: OpenClaw's bedrock embeddings are not "
                         "among qmdbridge's providers (openai, openai-compatible, gemini, voyage, "
                         "mistral, ollama, local)")
    fell = select_provider(cfg(provider="github-copilot", fallback="openai"), env={"OPENAI_API_KEY": "sk"})
    assert fell.provider is not None and fell.provider.provider_id == "openai"
    assert select_provider(cfg(provider="deepinfra"), env={}).provider is None
    with pytest.raises(ValueError, match="openia"):  # a typo stays a config error
        cfg(provider="openia")


def test_openai_compatible_needs_base_url_not_key() -> None:
    sel = select_provider(cfg(provider="openai-compatible", model="bge"), env={})
    assert sel.error == "memory search unavailable: openai-compatible: remote.baseUrl is required"
    ok = select_provider(cfg(provider="openai-compatible", model="bge",
                             remote={"baseUrl": "http://127.0.0.1:9/v1"}), env={})
    assert ok.provider is not None and ok.provider.provider_id == "openai-compatible"


def test_local_explicit_without_llama_or_model(tmp_path: Path) -> None:
    # provider "local" without a modelPath: the default model, downloaded on first use
    from fallback.embeddings.model_fetch import DEFAULT_MODEL

    sel = select_provider(cfg(provider="local"), env={"OPENCLAW_STATE_DIR": str(tmp_path),
                                                      "HF_ENDPOINT": "http://127.0.0.1:9"})
    if is_llama_cpp_installed():
        p = sel.provider
        assert p is not None and sel.error is None and p.model == DEFAULT_MODEL.ref.uri
        assert p.model_path == DEFAULT_MODEL.ref.cache_path(tmp_path / "models")  # type: ignore[attr-defined]
        download = p.download  # type: ignore[attr-defined]
        assert (download.model, download.base_url) == (DEFAULT_MODEL, "http://127.0.0.1:9")
        assert p.query_prefix == DEFAULT_MODEL.query_prefix  # type: ignore[attr-defined]
    else:
        assert sel.error == f"memory search unavailable: local: {LLAMA_CPP_MISSING}"
    bad = select_provider(cfg(provider="local", local={"modelPath": "hf:just-a-name"}), env={})
    assert bad.error == ("memory search unavailable: local: local.modelPath: 'hf:just-a-name' is not "
                         "a model URI of the form hf:<owner>/<repo>/<file>.gguf")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    sel = select_provider(cfg(provider="local", local={"modelPath": str(model)}), env={})
    if is_llama_cpp_installed():
        assert sel.provider is not None and sel.error is None
    else:
        assert sel.error == f"memory search unavailable: local: {LLAMA_CPP_MISSING}"


def test_registry_override_uses_the_same_lookup() -> None:
    def broken(settings: MemorySearchSettings, *, env: object) -> object:
        raise EmbeddingProviderUnavailableError("openai", "demo refusal")

    registry = {**PROVIDERS, "openai": broken}
    sel = select_provider(cfg(provider="openai"), env={"OPENAI_API_KEY": "sk"}, registry=registry)
    assert sel.error == "memory search unavailable: openai: demo refusal"


def test_defaults_prefixes_and_settings_plumbing() -> None:
    env = {"OPENAI_API_KEY": "sk", "GEMINI_API_KEY": "g", "VOYAGE_API_KEY": "v"}
    openai = select_provider(cfg(provider="openai", model="openai/text-embedding-3-large",
                                 sync={"embeddingBatchTimeoutSeconds": 30},
                                 remote={"nonBatchConcurrency": 2}), env=env).provider
    assert openai is not None
    assert (openai.model, openai.max_input_tokens) == ("text-embedding-3-large", 8192)
    assert (openai.policy.batch_timeout_s, openai.policy.query_timeout_s) == (30, 60)
    assert openai.policy.concurrency == 2
    gemini = select_provider(cfg(provider="gemini", model="google/text-embedding-004"),
                             env=env).provider
    assert gemini is not None
    assert (gemini.model, gemini.max_input_tokens) == ("text-embedding-004", 2048)
    ollama = select_provider(cfg(provider="ollama"), env={}).provider
    assert ollama is not None
    assert (ollama.model, ollama.policy.concurrency) == ("nomic-embed-text", 1)
    assert max_input_tokens_for("voyage", "voyage-3-lite") == 16000
    assert max_input_tokens_for("local", "x") == 2048
    assert max_input_tokens_for("mistral", "mistral-embed") == 8192


def test_provider_key_ignores_credentials_but_not_endpoint() -> None:
    base = compute_provider_key("openai", "m", base_url="https://a/v1",
                                headers={"X-Team": "t1", "Authorization": "Bearer one"})
    assert base == compute_provider_key("openai", "m", base_url="https://a/v1",
                                        headers={"authorization": "Bearer two", "X-Team": "t1"})
    assert base != compute_provider_key("openai", "m", base_url="https://b/v1",
                                        headers={"X-Team": "t1"})
    assert base != compute_provider_key("openai", "m", base_url="https://a/v1",
                                        headers={"X-Team": "t2"})
    assert base != compute_provider_key("openai", "m", base_url="https://a/v1",
                                        headers={"X-Team": "t1"}, extra={"dimensions": 256})
    # {"provider":"openai","baseUrl":"https://a/v1","model":"m","headers":[]}
    assert compute_provider_key("openai", "m", base_url="https://a/v1") == (
        "f40c85665ecef620e7d83e5e41f607f09aaa9cc8ec7b2f17db1dbf4f0c8df166")


def test_provider_key_of_selected_providers_is_key_free() -> None:
    one = select_provider(cfg(provider="gemini", remote={"apiKey": "k-1"}), env={}).provider
    two = select_provider(cfg(provider="gemini", remote={"apiKey": "k-2"}), env={}).provider
    dims = select_provider(cfg(provider="gemini", remote={"apiKey": "k-1"}, outputDimensionality=768),
                           env={}).provider
    assert one is not None and two is not None and dims is not None
    assert one.provider_key == two.provider_key != dims.provider_key
    assert len(one.provider_key) == 64


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_every_registered_factory_makes_no_network_call(name: str, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    settings = cfg(provider=name, model="m", remote={"baseUrl": "http://127.0.0.1:9",
                                                     "apiKey": "key-123456"},
                   local={"modelPath": str(model)})
    sel = select_provider(settings, env={})
    if name == "local" and not is_llama_cpp_installed():
        assert sel.provider is None
    else:
        assert sel.provider is not None and sel.provider.provider_id == name
