"""Tensor-parallel rollout inside the fused worker (`actor_rollout_ref.rollout.tensor_model_parallel_size`).

verl's SPMD rollout, before it moved to servers: `tensor_model_parallel_size` = t consecutive
ranks form a group, and each rank's in-process vLLM engine is one shard of one engine spanning
the group. vLLM's `external_launcher` executor runs the engine's collectives on the ranks' own
processes: vLLM joins the torch.distributed world the worker group already started (RANK and
LOCAL_RANK from the environment, MASTER_* unused once the world exists) and cuts it into TP
groups of t consecutive ranks (vllm/distributed/parallel_state.py `initialize_model_parallel`:
ExternalDP x DP x PP x TP, TP innermost) - the same layout `tensor_parallel_group` builds here.
Every shard schedules the same requests in the same order and returns the same outputs.

Rows: the worker group still splits a batch over all W ranks (`Dispatch.DP_COMPUTE_PROTO`).
Inside `generate_sequences` each TP group gathers its members' prompts (`share_prompts`, the
all-gather Ulysses uses for its rows, workers/ulysses.py), the group's engine generates them
all, and each member returns its own prompts' samples (`own_samples`), which every shard
holds alike: the concatenation is the samples of W/t data-parallel engines, each given its
group's prompts (verl 0.3's FSDPVLLMShardingManager did the same: all-gather in the TP group
before, the rank's chunk after). Weights: every rank gathers the full tensors from FSDP and
hands them to its shard (workers/weight_sync.py); vLLM's loaders keep the shard's part.

The rules vLLM puts on the model (every shard gets whole heads: t divides the attention
heads; key/value heads split when there are at least t of them, else t is a multiple of
them) are checked by `head_problem` at preflight (hybrid/preflight_models.py) and again when
the engine is built; the config rules across keys are hybrid/config/rules_parallel.py.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os

import torch
import torch.distributed as dist

from protocol.data_proto import DataProto
from workers.device import current_device, is_cuda_available
from workers.ulysses import SequenceParallel, gather_group_rows, sequence_parallel_group

TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
WORKER_PROCESSES = "mp"  # vLLM's executor for an engine whose shards are its own worker processes
EXECUTOR = "external_launcher"  # vLLM's executor for one engine shard per launched process
SHM_DIR = "/dev/shm"  # where vLLM's CPU build keeps its TP channels
STEP_WISE_LAST = "step_wise_last"  # workers/rollout/step_wise.py: a trajectory's last sample

# A TP group is the same record as a Ulysses group: `size` consecutive ranks, this one `rank` in it.
TensorParallel = SequenceParallel


def head_problem(size: int, heads: int | None, kv_heads: int | None, where: str) -> str | None:
    """One line when vLLM cannot split the model `where` describes over `size` shards, else None."""
    if size == 1 or heads is None:
        return None
    kv_heads = heads if kv_heads is None else kv_heads
    if heads % size:
        return (
            f"{TP_KEY}={size} does not divide the {heads} attention heads of {where}; vLLM gives each shard whole heads"
        )
    if (kv_heads >= size and kv_heads % size) or (kv_heads < size and size % kv_heads):
        return (
            f"{TP_KEY}={size} does not fit the {kv_heads} key/value heads of {where}: vLLM splits them when "
            f"{size} divides them and repeats them when {size} is a multiple of them"
        )
    return None


def heads_of(model_config: dict) -> tuple[int | None, int | None]:
    """(attention heads, key/value heads) of a config.json as a dict; a vision-language model's
    from its language model's `text_config`."""
    for section in (model_config, model_config.get("text_config") or {}):
        if "num_attention_heads" in section:
            return section["num_attention_heads"], section.get("num_key_value_heads")
    return None, None


def check_engine_heads(hf_config, size: int) -> None:
    """`head_problem` for a loaded transformers config, raised in one line."""
    problem = head_problem(size, *heads_of(hf_config.to_dict()), where="the policy")
    if problem:
        raise ValueError(problem)


def tensor_parallel_group(size: int) -> TensorParallel | None:
    """This rank's TP group (every rank builds every group, in the same order, as vLLM does);
    None for size 1. Needs the worker group's process group."""
    if size == 1:
        return None
    if not dist.is_initialized():
        raise RuntimeError(
            f"{TP_KEY}={size}: a tensor-parallel engine spans several ranks of one worker group, and this "
            f"process has no process group (an engine in a process of its own runs one shard: set it to 1)"
        )
    return sequence_parallel_group(size, TP_KEY)


def engine_kwargs(size: int) -> dict:
    """vLLM's `LLM(...)` arguments: in a worker group's rank, one shard of a `size`-way engine
    over the group's ranks; in a process without a process group (an engine actor of
    asynchronous training, `hybrid.serve`), the whole engine, on vLLM's own executor."""
    if size == 1:
        return {"tensor_parallel_size": 1}
    if not dist.is_initialized():
        # An engine actor: its shards are vLLM's worker processes (vLLM inside a Ray actor
        # would pick its Ray executor, which the CPU platform lacks).
        return {"tensor_parallel_size": size, "distributed_executor_backend": WORKER_PROCESSES}
    if dist.get_world_size() % size:
        raise RuntimeError(
            f"{TP_KEY}={size}: the engine's shards are ranks of this process's worker group, which has "
            f"{dist.get_world_size()} rank(s); {size} must divide them"
        )
    return {"tensor_parallel_size": size, "distributed_executor_backend": EXECUTOR}


@contextlib.contextmanager
def launch_environment(size: int):
    """The variables vLLM's external launcher reads while a shard is built: RANK (the worker
    group's), and on a GPU LOCAL_RANK = the index of the device this rank uses (vLLM places the
    shard on cuda:LOCAL_RANK; a Ray actor that sees one GPU has it at index 0)."""
    if size == 1:
        yield
        return
    if not dist.is_initialized():
        with _worker_process_environment(size):
            yield
        return
    launch = {"RANK": str(dist.get_rank())}
    if is_cuda_available():
        launch["LOCAL_RANK"] = str(current_device().index)
    else:
        launch["LOCAL_RANK"] = os.environ.get("LOCAL_RANK", "0")
        _remove_stale_channels(size)
    with _environment(launch):
        yield


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """`values` set in os.environ for the block, the previous values (or absence) restored after it."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _worker_process_environment(size: int):
    """An engine actor's `size` shards are vLLM's worker processes, which read their threads from
    the environment they start with. On CPU vLLM binds each worker to a NUMA node by default and
    refuses more workers than nodes (a one-node machine has one); the workers run unbound instead,
    splitting the actor's threads (OMP_NUM_THREADS, set to its cores by hybrid/engines.py)."""
    if is_cuda_available():
        yield
        return
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    with _environment(
        {
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            "OMP_NUM_THREADS": str(max(threads // size, 1)),
        }
    ):
        yield


def _remove_stale_channels(size: int) -> None:
    """vLLM's CPU build joins a TP group's shards through shared-memory files named by the group's
    ranks (`/dev/shm/<ident>-tp:<n>-[<ranks>]-cpushm_<rank>`), created exclusively and removed by
    no one: a shard that ended by a kill (Ray ends its actors so) leaves them, and the next engine
    on those ranks fails with "create shm in SHMManager failed. errno: 17". The group's first rank
    removes its ranks' leftovers before the group builds its engine (a mapped file stays valid for
    processes that use it)."""
    rank = dist.get_rank()
    first = rank - rank % size
    if rank == first:
        ranks = "-".join(str(r) for r in range(first, first + size))
        for path in glob.glob(os.path.join(SHM_DIR, f"*-[[]{ranks}[]]-cpushm*")):
            os.remove(path)
    dist.barrier()


def check_same_requests(size: int, prompt_ids: list[list[int]], max_tokens: list[int], group=None) -> None:
    """Every shard must be handed the same requests: a multi-turn loop runs on every rank of the
    group, and an environment or tool that answers the ranks differently would give the shards
    different batches (a hang or garbage in the engine's collectives). One digest per turn is
    compared over vLLM's TP group (`group`: another process group); a difference stops the run in
    one line."""
    if size == 1:
        return
    if group is None:
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group().cpu_group
    digest = hashlib.sha256(repr((prompt_ids, max_tokens)).encode()).hexdigest()
    digests = [None] * size
    dist.all_gather_object(digests, digest, group=group)
    if len(set(digests)) > 1:
        raise RuntimeError(
            f"{TP_KEY}={size}: the ranks of one tensor-parallel engine were given different requests for a turn (an "
            f"environment, tool or interaction answered them differently); the shards must generate the same requests"
        )


def share_prompts(prompts: DataProto, tp: TensorParallel | None) -> DataProto:
    """Every member's prompts, in rank order: what the group's engine generates."""
    return gather_group_rows(prompts, tp)


def own_samples(output: DataProto, tp: TensorParallel | None) -> DataProto:
    """This member's part of the group's samples: those of its own prompts. Samples come in
    the prompts' order (a prompt's n samples adjacent; step-wise trajectories one sample per
    turn, `step_wise_last` closing each), so the part is the member's share of trajectories."""
    if tp is None:
        return output
    rows = len(output)
    if output.batch is not None and STEP_WISE_LAST in output.batch.keys():
        ends = torch.nonzero(output.batch[STEP_WISE_LAST].bool()).flatten().tolist()
        per_rank = _equal_share(len(ends), tp)
        start = 0 if tp.rank == 0 else ends[tp.rank * per_rank - 1] + 1
        stop = ends[(tp.rank + 1) * per_rank - 1] + 1
    else:
        per_rank = _equal_share(rows, tp)
        start, stop = tp.rank * per_rank, (tp.rank + 1) * per_rank
    return output.slice(start, stop)


def _equal_share(count: int, tp: TensorParallel) -> int:
    if count % tp.size:
        raise RuntimeError(
            f"{TP_KEY}={tp.size}: the group's engine returned {count} trajectories, which do not split evenly "
            f"over its {tp.size} ranks"
        )
    return count // tp.size
