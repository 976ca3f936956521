"""The Hugging Face folder a checkpoint's `hf_model` content and the merger
(hybrid/model_merge.py, scripts/model_merger.py) write: config.json with the trained class as
its architecture, generation config and tokenizer; the weights in `save_pretrained`'s layout
(`model-0000i-of-0000n.safetensors` of at most a given size, plus the index), one shard in
memory at a time; and the dtype they were written in.
"""

from __future__ import annotations

import copy
import json
import os

import torch

from workers.device import host_device

__all__ = ["HFShardWriter", "model_class_name", "parse_size", "save_hf_metadata", "set_config_dtype"]


def model_class_name(module: torch.nn.Module) -> str:
    """The transformers class under FSDP2's dynamic subclass and peft's wrapper."""
    if hasattr(module, "get_base_model"):
        module = module.get_base_model()
    for cls in type(module).__mro__:
        if not cls.__name__.startswith("FSDP"):
            return cls.__name__
    return type(module).__name__


def save_hf_metadata(out_dir: str, hf_config, tokenizer, model_path: str, architecture: str) -> None:
    """config.json (with the trained class as architecture), generation config, tokenizer."""
    from transformers import GenerationConfig

    os.makedirs(out_dir, exist_ok=True)
    config = copy.deepcopy(hf_config)
    config.architectures = [architecture]
    config.save_pretrained(out_dir)
    if architecture.endswith("ForCausalLM"):
        try:
            generation = GenerationConfig.from_pretrained(model_path)
        except (OSError, ValueError):
            generation = GenerationConfig.from_model_config(config)
        generation.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def parse_size(text: str | int) -> int:
    """'5GB', '500MB', '1024' -> bytes."""
    if isinstance(text, int):
        return text
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
    text = str(text).strip().upper()
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


class HFShardWriter:
    """Writes (name, tensor) pairs into `model-0000i-of-0000n.safetensors` files of at most
    `max_shard_bytes` (a single larger tensor gets a file of its own) plus the index, as
    `save_pretrained` lays them out; only one shard is held in memory at a time."""

    def __init__(self, out_dir: str, max_shard_bytes: int):
        self.out_dir = out_dir
        self.max_shard_bytes = max(int(max_shard_bytes), 1)
        os.makedirs(out_dir, exist_ok=True)
        # Shards of an earlier, differently split write would be mixed into the new index.
        for name in os.listdir(out_dir):
            if name.startswith("model") and (
                name.endswith(".safetensors") or name.endswith(".safetensors.index.json") or name.endswith(".tmp")
            ):
                os.remove(os.path.join(out_dir, name))
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[tuple[str, list[str]]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_shard_bytes:
            self._flush()
        self.pending[name] = tensor.detach().to(host_device()).contiguous()
        self.pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        from safetensors.torch import save_file

        temp = os.path.join(self.out_dir, f"model-{len(self.files) + 1:05d}.tmp")
        save_file(self.pending, temp, metadata={"format": "pt"})
        self.files.append((temp, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> list[str]:
        if self.pending or not self.files:
            self._flush()
        count = len(self.files)
        if count == 1:
            final = os.path.join(self.out_dir, "model.safetensors")
            os.replace(self.files[0][0], final)
            return [final]
        weight_map, finals = {}, []
        for i, (temp, names) in enumerate(self.files, start=1):
            final_name = f"model-{i:05d}-of-{count:05d}.safetensors"
            os.replace(temp, os.path.join(self.out_dir, final_name))
            finals.append(os.path.join(self.out_dir, final_name))
            weight_map.update({n: final_name for n in names})
        with open(os.path.join(self.out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(
                {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}, f, indent=2, sort_keys=True
            )
        return finals


def set_config_dtype(out_dir: str, dtype: torch.dtype) -> None:
    """Record the dtype the weights were written in, so `dtype="auto"` loads them as stored."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        data = json.load(f)
    data["dtype"] = str(dtype).removeprefix("torch.")
    data.pop("torch_dtype", None)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
