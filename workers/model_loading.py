"""Loading a Hugging Face tokenizer and model, and sharding the model with FSDP2.

Every worker builds its models here: the actor and reference policy (causal LMs), the
critic (a token classifier with one label) and the reward model (a sequence classifier).
The caller passes what its own config section says; nothing here reads a section key that
only some sections have. `model_path_in_shm` is where a model folder's path is resolved
for `actor_rollout_ref.model.use_shm` (verl's key): copied once into /dev/shm.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager

import torch

from workers.device import current_device, require_cuda
from workers.engine_logs import debug_enabled
from workers.fsdp_utils import apply_fsdp2, resolve_mixed_precision
from workers.lora import apply_lora
from workers.packed_attention import register_packed_attention

SHM_ROOT = "/dev/shm"
USE_SHM = "actor_rollout_ref.model.use_shm"


@contextmanager
def _no_progress_bar():
    """transformers' "Loading weights" bar, one line per model per rank, says nothing a run
    needs (HYBRID_DEBUG=1 keeps it)."""
    from transformers.utils import logging as hf_logging

    if debug_enabled() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def _folder_files(folder: str) -> list[str]:
    return [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]


def model_path_in_shm(path: str, shm_root: str | None = None) -> str:
    """The path of a copy of the model folder `path` in shared memory, made on first use.

    The copy's name carries the source's path, size and newest mtime, so a changed folder
    gets a fresh copy and an unchanged one is reused (by later runs, and by the other
    ranks of this node). It is written under a temporary name and renamed, so a reader
    never sees half a folder; when two ranks copy at once, the first rename wins and the
    other drops its copy. Without `shm_root` (not Linux) the folder is loaded in place.
    """
    shm_root = shm_root or SHM_ROOT  # read at call time: tests point it elsewhere
    if not os.path.isdir(shm_root):
        print(f"{USE_SHM}=true: this machine has no {shm_root}; loading the model from {path}")
        return path
    source = os.path.realpath(path)
    if not os.path.isdir(source):
        raise FileNotFoundError(
            f"{USE_SHM}=true copies a local model folder, and {path!r} is not one; set {USE_SHM}=false or point "
            f"model.path at a folder"
        )
    files = _folder_files(source)
    size = sum(os.path.getsize(f) for f in files)
    newest = max((os.path.getmtime(f) for f in files), default=0.0)
    key = hashlib.sha1(f"{source}|{size}|{newest}".encode()).hexdigest()[:12]
    parent = os.path.join(shm_root, "hybrid-models")
    target = os.path.join(parent, f"{os.path.basename(source)}-{key}")
    if os.path.isdir(target):
        return target
    free = shutil.disk_usage(shm_root).free
    if size > free:
        raise OSError(
            f"{USE_SHM}=true: the model folder {path} holds {size / 2**30:.2f} GiB but {shm_root} has only "
            f"{free / 2**30:.2f} GiB free; free space there (in a container: a larger --shm-size) or set "
            f"{USE_SHM}=false"
        )
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", dir=parent)
    try:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        os.rename(staging, target)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        if os.path.isdir(target):  # another rank renamed its copy first
            return target
        raise OSError(
            f"{USE_SHM}=true: copying {path} into {shm_root} failed ({err}); set {USE_SHM}=false or free space there"
        ) from err
    print(f"{USE_SHM}=true: copied {path} ({size / 2**20:.1f} MiB) to {target}")
    return target


def load_tokenizer(path: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@torch.no_grad()
def init_missing_weights(module: torch.nn.Module, missing_keys, hf_config, seed: int) -> None:
    """Initialise the weights the checkpoint lacks (the critic's value head) from a generator of
    their own seeded with `seed` on the host, so every rank and device starts from the same head
    whatever the global generator met before (transformers draws from the global one; today,
    right after a manual_seed, its draws are these same ones). Weights ~ N(0, initializer_range),
    as transformers initialises linear layers; biases zero. A missing name tied to a loaded
    weight (an output layer tied to the embedding) is left alone."""
    generator = torch.Generator().manual_seed(seed)
    std = float(getattr(hf_config, "initializer_range", 0.02))
    params = dict(module.named_parameters(remove_duplicate=False))
    missing = set(missing_keys)
    loaded = {params[name].data_ptr() for name in params if name not in missing}
    for name in sorted(missing_keys):
        param = params.get(name)
        if param is None or param.data_ptr() in loaded:
            continue
        if name.endswith("bias"):
            param.zero_()
        else:
            param.copy_(torch.empty(param.shape, dtype=torch.float32).normal_(0.0, std, generator=generator))


def load_hf_model(
    auto_cls,
    path: str,
    fsdp_config,
    *,
    seed: int,
    trainable: bool,
    trust_remote_code: bool = False,
    override_config: dict | None = None,
    gradient_checkpointing: bool = False,
    use_liger: bool = False,
    lora_config=None,
    lora_causal_lm: bool = True,
    offload_policy: bool = False,
    forward_prefetch: bool = False,
    fsdp_size: int = -1,
    language_model_only: str | None = None,
    **hf_config_overrides,
):
    """fp32 master weights on the host, then FSDP2 over all ranks (hybrid-sharded groups of
    `fsdp_size` ranks when it is below the world size, workers/fsdp_utils.fsdp_mesh) with the
    compute dtype of `fsdp_config.mixed_precision`; returns (module, hf_config).

    `override_config` and `hf_config_overrides` are set on the Hugging Face config before the
    weights load. With `lora_config` (the actor's model section, lora_rank > 0 or lora_adapter_path;
    the critic's with `lora_causal_lm=False`) the model is wrapped in peft LoRA adapters before
    sharding (workers/lora.py). A frozen model (`trainable=False`) gets no gradients and no
    gradient checkpointing.

    `language_model_only` (the config key that asks for it, e.g.
    "actor_rollout_ref.model.language_model_only"; None: the whole checkpoint) loads the language
    model of a multimodal checkpoint alone, under its text config (workers/language_model.py);
    the returned hf_config is then that text config.
    """
    from transformers import AutoConfig

    from workers.language_model import LanguageModelLoad

    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    model_class, key_mapping, text_only = auto_cls, {}, None
    if language_model_only:
        text_only = LanguageModelLoad.resolve(auto_cls, path, hf_config, language_model_only)
        model_class, hf_config, key_mapping = text_only.model_class, text_only.config, text_only.key_mapping
    for key, value in {**dict(override_config or {}), **hf_config_overrides}.items():
        setattr(hf_config, key, value)
    with _no_progress_bar():
        module, loading = model_class.from_pretrained(
            path,
            config=hf_config,
            dtype=torch.float32,
            attn_implementation=register_packed_attention(),
            trust_remote_code=trust_remote_code,
            output_loading_info=True,
            **({"key_mapping": key_mapping} if key_mapping else {}),
        )
    if text_only is not None:
        text_only.check_loaded(loading["missing_keys"], path)
    init_missing_weights(module, loading["missing_keys"], hf_config, seed)
    if use_liger:
        require_cuda("actor_rollout_ref.model.use_liger")
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=module)
    checkpointing = trainable and gradient_checkpointing
    if checkpointing:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not trainable:
        module.requires_grad_(False)
    if lora_config is not None:
        if checkpointing:
            # Frozen embeddings give checkpointed blocks inputs without grad; peft's fix.
            module.enable_input_require_grads()
        module = apply_lora(module, lora_config, lora_causal_lm)
    module.to(current_device())
    param_dtype = resolve_mixed_precision(fsdp_config.mixed_precision)
    apply_fsdp2(module, param_dtype, fsdp_config.reshard_after_forward, offload_policy, forward_prefetch, fsdp_size)
    return module, hf_config
