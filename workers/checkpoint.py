"""Sharded checkpoints of one worker role (actor or critic); the Hugging Face folder writer,
which the merger (scripts/model_merger.py) shares, is workers/hf_folder.py.

One role's folder (`global_step_N/actor`, `global_step_N/critic`), with verl's file names:

    model_world_size_{W}_rank_{r}.safetensors   rank r's local shard of every tensor
    optim_world_size_{W}_rank_{r}.pt            rank r's optimizer state (DTensors as local shards)
    extra_state_world_size_{W}_rank_{r}.pt      LR scheduler, RNG states, rollout sampling counter
    fsdp_config.json                            world size, contents, each tensor's global shape,
                                                dtype, placement and tie; LoRA config and scaling
    huggingface/                                config, generation config, tokenizer; with the
                                                `hf_model` content also full (LoRA-merged) weights

Each rank writes and reads only its own files, so saving costs no gather; loading needs the
same world size and shard group size (the merger turns any into one Hugging Face folder).
FSDP2 shards every parameter on dim 0 (`Shard(0)`, torch.chunk sizes), so the merger rebuilds
a tensor by concatenating the ranks' shards in order. Under hybrid sharding (`fsdp_size` below
the world size: placements `(Replicate(), Shard(0))` on a 2-D mesh) ranks r and
r + fsdp_size hold the same shard; `fsdp_config.json` records the group size
(`shard_group_size`), and the merger concatenates the first group's shards. Tied parameters are stored once and
recorded as an alias. Nothing is loaded with pickle: model shards are safetensors, the rest
`torch.load(weights_only=True)`.

The folder given to `save` is a temporary one; the driver renames it once every rank of
every role has returned (hybrid/checkpointing.py), which is what makes a crash safe.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from workers.device import get_torch_device, host_device

# The Hugging Face folder writer; the merger imports it from here too (hybrid/model_merge.py).
from workers.hf_folder import HFShardWriter, model_class_name, parse_size, save_hf_metadata, set_config_dtype

CONTENTS = ("model", "optimizer", "extra", "hf_model")
META_FILE = "fsdp_config.json"
HF_DIR = "huggingface"
FORMAT_VERSION = 1

# Called with the global step after this rank has written its model shard, before the rest
# of the checkpoint. None in a run; a crash test installs one that holds the save, so it can
# kill the process while a checkpoint is half written.
after_model_shard: Callable[[int], None] | None = None


def shard_file(kind: str, world_size: int, rank: int) -> str:
    ext = "safetensors" if kind == "model" else "pt"
    return f"{kind}_world_size_{world_size}_rank_{rank}.{ext}"


def read_meta(local_path: str) -> dict:
    path = os.path.join(local_path, META_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{local_path} is not a checkpoint folder of this trainer: {META_FILE} is missing")
    with open(path) as f:
        return json.load(f)


def _placement(tensor: torch.Tensor) -> str:
    if not isinstance(tensor, DTensor):
        return "replicate"
    placements = tuple(tensor.placements)
    if placements in ((Shard(0),), (Replicate(), Shard(0))):
        return "shard0"
    if set(placements) == {Replicate()}:
        return "replicate"
    raise ValueError(
        f"cannot checkpoint a DTensor with placements {placements}; FSDP2 gives (Shard(0),) on a 1-D mesh, "
        f"(Replicate(), Shard(0)) on a hybrid-sharded 2-D mesh"
    )


def shard_group_size(model: torch.nn.Module, world_size: int) -> int:
    """Ranks that together hold one copy of the model: the mesh's last (shard) dimension."""
    for param in model.parameters():
        if isinstance(param, DTensor):
            return int(param.device_mesh.shape[-1])
    return world_size


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """{name: first name of the same parameter} for tied parameters (lm_head -> embed_tokens)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


# ----------------------------------------------------------------------------- model


@torch.no_grad()
def save_model_shard(model: torch.nn.Module, path: str, rank: int, world_size: int) -> dict:
    """Write this rank's shard; returns the layout (identical on every rank)."""
    from safetensors.torch import save_file

    aliases = _tied_aliases(model)
    tensors, layout = {}, {}
    for name, tensor in model.state_dict().items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"cannot checkpoint {name}: state of type {type(tensor).__name__} is not a tensor")
        if name in aliases:
            layout[name] = {"alias_of": aliases[name]}
            continue
        layout[name] = {
            "shape": list(tensor.shape),
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "placement": _placement(tensor),
        }
        tensors[name] = _local(tensor).detach().to(host_device()).contiguous()
    save_file(tensors, path, metadata={"format": "pt", "world_size": str(world_size), "rank": str(rank)})
    return layout


@torch.no_grad()
def load_model_shard(model: torch.nn.Module, path: str, layout: dict) -> None:
    """Copy this rank's saved shard into the (already sharded) model in place."""
    from safetensors.torch import load_file

    saved = load_file(path)
    state = model.state_dict()
    missing = sorted(set(state) - set(layout))
    unexpected = sorted(set(layout) - set(state))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''} (was it saved with another "
            f"model or another lora_rank?)"
        )
    for name, tensor in state.items():
        source = layout[name].get("alias_of", name)
        value = saved[source]
        target = _local(tensor)
        if tuple(target.shape) != tuple(value.shape):
            raise ValueError(
                f"checkpoint {path}: {name} has local shape {tuple(value.shape)}, the model's shard is "
                f"{tuple(target.shape)}"
            )
        # The state dict's tensors share storage with the parameters: this writes the shard.
        target.copy_(value)


# ----------------------------------------------------------------------------- optimizer


def _param_names(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


@torch.no_grad()
def save_optimizer_shard(optimizer: torch.optim.Optimizer, model: torch.nn.Module, path: str) -> None:
    state_dict = optimizer.state_dict()
    names = _param_names(model)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state, dtensor_keys = {}, {}
    for index, entry in state_dict["state"].items():
        state[index] = {}
        for key, value in entry.items():
            if isinstance(value, DTensor):
                dtensor_keys.setdefault(index, []).append(key)
                value = value.to_local()
            state[index][key] = value.detach().to(host_device()) if isinstance(value, torch.Tensor) else value
    torch.save(
        {
            "state": state,
            "param_groups": state_dict["param_groups"],
            "dtensor_keys": dtensor_keys,
            "param_names": [names.get(id(p), "?") for p in params],
        },
        path,
    )


@torch.no_grad()
def load_optimizer_shard(optimizer: torch.optim.Optimizer, model: torch.nn.Module, path: str) -> None:
    saved = torch.load(path, map_location=host_device(), weights_only=True)
    names = _param_names(model)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    current = [names.get(id(p), "?") for p in params]
    if current != saved["param_names"]:
        diff = next(
            (i for i, (a, b) in enumerate(zip(current, saved["param_names"])) if a != b),
            min(len(current), len(saved["param_names"])),
        )
        raise ValueError(
            f"optimizer checkpoint {path} was saved for other parameters ({len(saved['param_names'])} saved, "
            f"{len(current)} now; first difference at #{diff}); resume with the same model and lora settings"
        )
    for index, keys in saved["dtensor_keys"].items():
        param = params[index]
        for key in keys:
            saved["state"][index][key] = DTensor.from_local(
                saved["state"][index][key].to(param.device),
                param.device_mesh,
                param.placements,
                run_check=False,
                shape=param.shape,
                stride=param.stride(),
            )
    optimizer.load_state_dict({"state": saved["state"], "param_groups": saved["param_groups"]})


# ----------------------------------------------------------------------------- RNG


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        # numpy's key array as a tensor: weights_only loading refuses numpy objects.
        "numpy": {
            "key": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    device = get_torch_device()
    if device is not None:
        state["device"] = device.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            np_state["key"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    device = get_torch_device()
    if device is not None and "device" in state:
        device.set_rng_state(state["device"])


# ----------------------------------------------------------------------------- one role's checkpointer


class FSDPCheckpointer:
    """Save/load of one worker's model, optimizer, scheduler, RNG and metadata.

    `hf_state_fn` gives the Hugging Face-named state for the `hf_model` content (the merged
    one under LoRA); `extra_state_fn`/`load_extra_fn` carry worker state beyond the model
    (the rollout's sampling counter).
    """

    def __init__(
        self,
        model,
        optimizer,
        lr_scheduler,
        hf_config,
        tokenizer,
        model_path: str,
        hf_state_fn=None,
        extra_state_fn=None,
        load_extra_fn=None,
        tie_word_embeddings: bool = False,
    ):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.hf_config = hf_config
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.hf_state_fn = hf_state_fn or model.state_dict
        self.extra_state_fn = extra_state_fn
        self.load_extra_fn = load_extra_fn
        self.tie_word_embeddings = tie_word_embeddings
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1

    def _barrier(self) -> None:
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()

    def save(self, local_path: str, global_step: int, contents) -> dict:
        """Write this rank's files into `local_path`; returns seconds per part (rank's view)."""
        from workers.lora import adapter_config_dict, is_peft_model, scaling_by_module

        contents = [c for c in contents]
        unknown = sorted(set(contents) - set(CONTENTS))
        if unknown:
            raise ValueError(
                f"checkpoint.save_contents has unknown entries {unknown}; supported: {', '.join(CONTENTS)}"
            )
        os.makedirs(local_path, exist_ok=True)
        timing: dict[str, float] = {}
        W, r = self.world_size, self.rank
        start = time.perf_counter()
        layout = None
        if "model" in contents:
            layout = save_model_shard(self.model, os.path.join(local_path, shard_file("model", W, r)), r, W)
        timing["model"] = time.perf_counter() - start
        if after_model_shard is not None:
            after_model_shard(int(global_step))
        start = time.perf_counter()
        if "optimizer" in contents:
            if self.optimizer is None:
                raise ValueError("checkpoint.save_contents has 'optimizer' but this worker has no optimizer")
            save_optimizer_shard(self.optimizer, self.model, os.path.join(local_path, shard_file("optim", W, r)))
        timing["optimizer"] = time.perf_counter() - start
        start = time.perf_counter()
        if "extra" in contents:
            extra = {
                "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                "rng": rng_state(),
                "worker": self.extra_state_fn() if self.extra_state_fn else {},
            }
            torch.save(extra, os.path.join(local_path, shard_file("extra_state", W, r)))
        timing["extra"] = time.perf_counter() - start
        architecture = model_class_name(self.model)
        hf_dir = os.path.join(local_path, HF_DIR)
        if r == 0:
            save_hf_metadata(hf_dir, self.hf_config, self.tokenizer, self.model_path, architecture)
        start = time.perf_counter()
        if "hf_model" in contents:
            self._save_hf_weights(hf_dir)
        timing["hf_model"] = time.perf_counter() - start
        if r == 0:
            meta = {
                "format_version": FORMAT_VERSION,
                "FSDP_version": 2,
                "world_size": W,
                "shard_group_size": shard_group_size(self.model, W),
                "global_step": int(global_step),
                "contents": contents,
                "architecture": architecture,
                "model_path": self.model_path,
                "tie_word_embeddings": self.tie_word_embeddings,
                "tensors": layout,
                "lora": None,
            }
            if is_peft_model(self.model):
                meta["lora"] = {
                    "adapter_config": adapter_config_dict(self.model),
                    "scaling": scaling_by_module(self.model),
                }
            with open(os.path.join(local_path, META_FILE), "w") as f:
                json.dump(meta, f, indent=2)
        # Return only when every rank's files are on disk: the driver renames after this.
        self._barrier()
        return timing

    def export_hf(self, out_dir: str) -> float:
        """The model alone as a Hugging Face folder (config, tokenizer, safetensors; LoRA
        merged), no shards or optimizer: trainer.hf_save_freq's export. Every rank takes part
        (the full weights are gathered); rank 0 writes. Returns seconds."""
        start = time.perf_counter()
        if self.rank == 0:
            save_hf_metadata(out_dir, self.hf_config, self.tokenizer, self.model_path, model_class_name(self.model))
        self._save_hf_weights(out_dir)
        self._barrier()
        return time.perf_counter() - start

    @torch.no_grad()
    def _save_hf_weights(self, out_dir: str) -> None:
        from workers.weight_sync import iter_full_weights

        writer = HFShardWriter(out_dir, parse_size("5GB")) if self.rank == 0 else None
        # All ranks walk the same gathers; only rank 0 keeps the full tensors.
        for name, tensor in iter_full_weights(self.hf_state_fn(), torch.float32, 1 << 27, False):
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue  # tied: transformers re-ties it from the embedding
            if writer is not None:
                writer.add(name, tensor)
        if writer is not None:
            writer.close()
            set_config_dtype(out_dir, torch.float32)

    def load(self, local_path: str, contents) -> dict:
        if not os.path.isdir(local_path):
            raise FileNotFoundError(f"checkpoint folder {local_path} does not exist")
        meta = read_meta(local_path)
        W, r = self.world_size, self.rank
        if int(meta["world_size"]) != W:
            raise ValueError(
                f"checkpoint {local_path} was saved by {meta['world_size']} ranks and this run has {W}; sharded "
                f"state loads only at the same world size. Merge it into a Hugging Face folder "
                f"(python -m scripts.model_merger merge --backend fsdp --local_dir {local_path} --target_dir <dir>) "
                f"and start from that folder instead"
            )
        saved_group, group = int(meta.get("shard_group_size", W)), shard_group_size(self.model, W)
        if saved_group != group:
            raise ValueError(
                f"checkpoint {local_path} was saved with shard groups of {saved_group} ranks and this run shards "
                f"over {group} (fsdp_config.fsdp_size); resume with the same fsdp_size, or merge it into a "
                f"Hugging Face folder and start from that"
            )
        contents = [c for c in contents if c != "hf_model"]  # the HF folder is an export, never loaded
        missing = [c for c in contents if c not in meta["contents"]]
        if missing:
            raise ValueError(
                f"checkpoint {local_path} holds {meta['contents']}, but checkpoint.load_contents asks for {missing}"
            )
        timing: dict[str, float] = {}
        start = time.perf_counter()
        if "model" in contents:
            load_model_shard(self.model, os.path.join(local_path, shard_file("model", W, r)), meta["tensors"])
        timing["model"] = time.perf_counter() - start
        start = time.perf_counter()
        if "optimizer" in contents and self.optimizer is not None:
            load_optimizer_shard(self.optimizer, self.model, os.path.join(local_path, shard_file("optim", W, r)))
        timing["optimizer"] = time.perf_counter() - start
        start = time.perf_counter()
        if "extra" in contents:
            extra = torch.load(
                os.path.join(local_path, shard_file("extra_state", W, r)), map_location=host_device(), weights_only=True
            )
            if self.lr_scheduler is not None and extra["lr_scheduler"] is not None:
                self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
            set_rng_state(extra["rng"])
            if self.load_extra_fn is not None:
                self.load_extra_fn(extra.get("worker") or {})
        timing["extra"] = time.perf_counter() - start
        self._barrier()
        return timing
