"""Turning a sharded checkpoint into a Hugging Face model folder, or checking one against
another: the library behind `python -m scripts.model_merger` (the command line) and
`trainer.merge_on_finish` (hybrid/checkpointing.py calls `merge` in process).

`merge` reads every rank's `model_world_size_W_rank_r.safetensors` (any W), rebuilds each
full tensor from the ranks' dim-0 shards (one shard group's, under hybrid sharding), merges
LoRA adapters into their base weights (base + (B @ A) * scaling, in fp32) and writes config,
generation config, tokenizer and safetensors shards (`--max_shard_size`, with an index when
there are several). With `--save_lora_adapter` it writes a peft adapter folder instead
(adapter_config.json + adapter_model.safetensors, to load on top of the base model). Tensors
are read one at a time from memory-mapped shards, so memory holds about one output shard.

Mistakes in the arguments (a folder that is not a checkpoint, a partial or a step folder
instead of its actor folder, a missing reference) raise InputError naming what to change
(the command line turns it into one line and exit status 2, hybrid/errors.py).

Before reading a checkpoint (`merge`, and `test` on a checkpoint) the command checks the role
folder's files against its step folder's manifest (`verify_against_manifest`, the check
resume makes, hybrid/checkpoint_folders.py): a truncated, missing or corrupted file ends it in
one line naming the folder and the file. `trainer.merge_on_finish` merges the folder it has
just written and skips the check.

`test` compares, tensor by tensor, the model in `--local_dir` (a checkpoint, merged in
memory, or an already merged folder) with `--test_hf_dir`; it prints every difference
and exits 1 when any tensor is missing, differs in shape, or differs by more than `--atol`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import torch
from tqdm import tqdm

from hybrid.checkpoint_folders import PARTIAL_SUFFIX, STEP_DIR, CheckpointError, manifest_problem
from hybrid.errors import InputError
from workers.checkpoint import HF_DIR, META_FILE, HFShardWriter, parse_size, read_meta, set_config_dtype, shard_file
from workers.lora import hf_name, is_adapter_key, merge_lora_weight

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")


class ShardedCheckpoint:
    """Full tensors of a checkpoint folder, rebuilt from every rank's shard on demand."""

    def __init__(self, local_dir: str):
        from safetensors import safe_open

        self.local_dir = local_dir
        check_checkpoint_folder(local_dir)
        self.meta = read_meta(local_dir)
        if "model" not in self.meta["contents"]:
            raise CheckpointError(
                f"{local_dir} holds {self.meta['contents']} and no model shards; "
                f"save with 'model' in checkpoint.save_contents"
            )
        self.world_size = int(self.meta["world_size"])
        paths = [os.path.join(local_dir, shard_file("model", self.world_size, r)) for r in range(self.world_size)]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise CheckpointError(
                f"{local_dir} was saved by {self.world_size} ranks but these shards are missing: {', '.join(missing)}"
            )
        self.shards = [safe_open(p, framework="pt") for p in paths]
        self.layout = self.meta["tensors"]
        self.lora = self.meta.get("lora")

    def names(self) -> list[str]:
        """Stored tensors (tied aliases excluded), in the model's order."""
        return [n for n, info in self.layout.items() if "alias_of" not in info]

    def aliases(self) -> dict[str, str]:
        return {n: info["alias_of"] for n, info in self.layout.items() if "alias_of" in info}

    def full(self, name: str) -> torch.Tensor:
        info = self.layout[name]
        if info["placement"] == "replicate":
            return self.shards[0].get_tensor(name)
        # Under hybrid sharding the shard groups are copies of each other: the first one is whole.
        group = int(self.meta.get("shard_group_size", self.world_size))
        tensor = torch.cat([s.get_tensor(name) for s in self.shards[:group]], dim=0)
        if list(tensor.shape) != info["shape"]:
            raise CheckpointError(
                f"{self.local_dir}: {name} rebuilt to shape {list(tensor.shape)}, expected {info['shape']}"
            )
        return tensor

    @property
    def hf_dir(self) -> str:
        return os.path.join(self.local_dir, HF_DIR)

    @property
    def tied(self) -> bool:
        return bool(self.meta.get("tie_word_embeddings", False))


def check_checkpoint_folder(local_dir: str) -> None:
    """Raise CheckpointError saying what `local_dir` is when it is not an actor or critic
    checkpoint folder (the usual mix-ups: the step folder, a partial save, a model folder)."""
    path = os.path.normpath(local_dir)
    name = os.path.basename(path)
    if not os.path.exists(path):
        raise CheckpointError(f"--local_dir {local_dir} does not exist")
    if not os.path.isdir(path):
        raise CheckpointError(f"--local_dir {local_dir} is a file; give a global_step_N/actor (or /critic) folder")
    if name.endswith(PARTIAL_SUFFIX) or os.path.basename(os.path.dirname(path)).endswith(PARTIAL_SUFFIX):
        raise CheckpointError(
            f"--local_dir {local_dir} is (inside) a partial checkpoint: its save never finished; "
            f"use a complete global_step_N folder"
        )
    if os.path.isfile(os.path.join(path, META_FILE)):
        return
    roles = [r for r in ("actor", "critic") if os.path.isfile(os.path.join(path, r, META_FILE))]
    if roles:
        raise CheckpointError(
            f"--local_dir {local_dir} is a step folder; give one of its roles: "
            f"{', '.join(os.path.join(local_dir, r) for r in roles)}"
        )
    if STEP_DIR.match(name):
        raise CheckpointError(f"--local_dir {local_dir} holds no actor or critic checkpoint (removed by retention?)")
    if os.path.isfile(os.path.join(path, "config.json")):
        raise CheckpointError(
            f"--local_dir {local_dir} is a Hugging Face model folder already, not a checkpoint: nothing to merge"
        )
    raise CheckpointError(
        f"--local_dir {local_dir} is not a checkpoint folder of this trainer ({META_FILE} is missing); "
        f"give trainer.default_local_dir/global_step_N/actor"
    )


def verify_against_manifest(local_dir: str) -> None:
    """Raise CheckpointError when `local_dir` (global_step_N/actor or /critic) does not match
    its step folder's manifest; a folder outside a step folder, or one without a manifest (an
    older checkpoint: a notice says so), is not checked."""
    path = os.path.normpath(os.path.abspath(local_dir))
    step_folder = os.path.dirname(path)
    if not os.path.isfile(os.path.join(path, META_FILE)) or not STEP_DIR.match(os.path.basename(step_folder)):
        return
    problem = manifest_problem(step_folder, under=os.path.basename(path))
    if problem:
        raise CheckpointError(f"--local_dir {local_dir}: {step_folder} fails its check: {problem}")


def merged_items(ckpt: ShardedCheckpoint) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, full tensor) with LoRA merged; a tied output layer is left out,
    as `save_pretrained` does (transformers and vLLM re-tie it from the embedding)."""
    lora = ckpt.lora
    for name in ckpt.names():
        if lora and is_adapter_key(name):
            continue
        if lora and name.endswith(".base_layer.weight"):
            prefix = name[: -len(".base_layer.weight")]
            base = ckpt.full(name)
            merged = merge_lora_weight(
                base,
                ckpt.full(f"{prefix}.lora_A.default.weight"),
                ckpt.full(f"{prefix}.lora_B.default.weight"),
                lora["scaling"][prefix],
            )
            yield hf_name(name), merged.to(base.dtype)
        else:
            yield (hf_name(name) if lora else name), ckpt.full(name)
    for alias, source in ckpt.aliases().items():
        out = hf_name(alias) if lora else alias
        if not (ckpt.tied and out == "lm_head.weight"):
            yield out, ckpt.full(source)


def adapter_items(ckpt: ShardedCheckpoint) -> Iterator[tuple[str, torch.Tensor]]:
    """peft's adapter_model.safetensors names: the adapter name dropped from each key."""
    for name in ckpt.names():
        if is_adapter_key(name):
            yield name.replace(".default.weight", ".weight"), ckpt.full(name)


def _copy_metadata(src: str, target_dir: str, model_config: bool = True) -> None:
    """Config, generation config and tokenizer files: everything but weights. An adapter
    folder gets the tokenizer only: with a config.json beside it, transformers would take
    it for a full model."""
    if not os.path.isdir(src):
        raise InputError([f"{src} (config and tokenizer of the checkpoint) does not exist; pass --hf_model_path"])
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if not os.path.isfile(path) or name.startswith(("model-", "model.")) or name in WEIGHT_FILES:
            continue
        if not model_config and name in ("config.json", "generation_config.json"):
            continue
        target = os.path.join(target_dir, name)
        if not (os.path.exists(target) and os.path.samefile(path, target)):  # --target_dir <local_dir>/huggingface
            shutil.copy2(path, target)


def merge(
    local_dir: str,
    target_dir: str,
    max_shard_size: str = "5GB",
    save_lora_adapter: bool = False,
    dtype: str | None = None,
    hf_model_path: str | None = None,
    progress: bool = True,
) -> list[str]:
    """Write the Hugging Face folder (or peft adapter folder); returns the weight files written."""
    ckpt = ShardedCheckpoint(local_dir)
    # Every argument checked before the target folder is made.
    if os.path.exists(target_dir) and not os.path.isdir(target_dir):
        raise InputError([f"--target_dir {target_dir} is a file; give a folder (created if missing)"])
    if save_lora_adapter and not ckpt.lora:
        raise InputError(
            [f"{local_dir} has no LoRA adapter (trained with lora_rank=0); merge without --save_lora_adapter"]
        )
    try:
        shard_limit = parse_size(max_shard_size)
    except ValueError as err:
        raise InputError([f"--max_shard_size {max_shard_size!r} is not a size (e.g. 5GB, 500MB, 1000000)"]) from err
    os.makedirs(target_dir, exist_ok=True)
    _copy_metadata(hf_model_path or ckpt.hf_dir, target_dir, model_config=not save_lora_adapter)
    cast = DTYPES[dtype] if dtype else None
    if save_lora_adapter:
        from safetensors.torch import save_file

        tensors = {
            n: (t.to(cast) if cast else t).contiguous()
            for n, t in tqdm(adapter_items(ckpt), desc="adapter", disable=not progress)
        }
        adapter_config = dict(ckpt.lora["adapter_config"])
        adapter_config["base_model_name_or_path"] = ckpt.meta.get("model_path")
        with open(os.path.join(target_dir, "adapter_config.json"), "w") as f:
            json.dump(adapter_config, f, indent=2, sort_keys=True)
        path = os.path.join(target_dir, "adapter_model.safetensors")
        save_file(tensors, path, metadata={"format": "pt"})
        return [path]
    writer = HFShardWriter(target_dir, shard_limit)
    written_dtype = None
    total = len(ckpt.names()) - (sum(1 for n in ckpt.names() if is_adapter_key(n)) if ckpt.lora else 0)
    for name, tensor in tqdm(merged_items(ckpt), total=total, desc="merging", unit="tensor", disable=not progress):
        tensor = tensor.to(cast) if cast else tensor
        written_dtype = written_dtype or tensor.dtype
        writer.add(name, tensor)
    files = writer.close()
    set_config_dtype(target_dir, written_dtype or torch.float32)
    return files


# ----------------------------------------------------------------------------- test


def folder_items(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a Hugging Face folder's safetensors files."""
    from safetensors import safe_open

    if not os.path.isdir(path):
        raise InputError(
            [f"{path} {'is a file' if os.path.exists(path) else 'does not exist'}; give a Hugging Face model folder"]
        )
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise InputError([f"{path} has no .safetensors weights"])
    for file in files:
        with safe_open(os.path.join(path, file), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def _tied(path: str) -> bool:
    try:
        with open(os.path.join(path, "config.json")) as f:
            return bool(json.load(f).get("tie_word_embeddings", False))
    except OSError:
        return False


def compare(local_dir: str, reference_dir: str, atol: float = 1e-6, progress: bool = True) -> tuple[bool, list[str]]:
    """(all equal within atol, one line per problem)."""
    if os.path.isfile(os.path.join(local_dir, META_FILE)):
        ckpt = ShardedCheckpoint(local_dir)
        items, tied = merged_items(ckpt), ckpt.tied
    else:
        items, tied = folder_items(local_dir), _tied(local_dir)
    reference = dict(folder_items(reference_dir))
    if tied or _tied(reference_dir):
        reference.pop("lm_head.weight", None)  # re-tied from the embedding on load
    problems, seen, worst = [], set(), 0.0
    for name, tensor in tqdm(items, desc="comparing", unit="tensor", disable=not progress):
        if tied and name == "lm_head.weight":
            continue
        seen.add(name)
        if name not in reference:
            problems.append(f"{name}: not in {reference_dir}")
            continue
        ref = reference[name]
        if tuple(ref.shape) != tuple(tensor.shape):
            problems.append(f"{name}: shape {tuple(tensor.shape)} vs {tuple(ref.shape)} in the reference")
            continue
        diff = (tensor.float() - ref.float()).abs().max().item() if tensor.numel() else 0.0
        worst = max(worst, diff)
        if diff > atol:
            problems.append(f"{name}: max abs diff {diff:.3e} > atol {atol:g}")
    for name in sorted(set(reference) - seen):
        problems.append(f"{name}: only in the reference {reference_dir}")
    problems.append(f"compared {len(seen)} tensors; largest difference {worst:.3e}")
    return len(problems) == 1, problems


# ----------------------------------------------------------------------------- command line
