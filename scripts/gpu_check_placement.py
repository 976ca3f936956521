"""gpu_check's checks that need neither Ray nor vLLM nor a model folder: where processes land,
and FSDP2's offload_policy on the collectives (issue 38, point 5). They run on a lent GPU
machine as on this CPU one, on the same code path (the CPU runs gloo and keeps parameters on
the host whatever offload_policy says, so there the moves are no-ops):

- `placement`: processes started with torch.multiprocessing, each setting its device from its
  local rank as a worker does (workers/device.set_device_for_local_rank) and reporting it
  (workers/device.device_report: index, GPU uuid); the reports go through the driver's check
  (hybrid/placement.shared_devices). A second round gives every process local rank 0: on a
  GPU the check must name them (two ranks on one device); on the CPU it must not.
- `offload_collectives`: a tiny random Llama under FSDP2 with offload_policy (2 processes
  where there are 2 GPUs or none, else 1; NCCL on GPUs, gloo on the CPU): the weight gather
  (workers/weight_sync.iter_full_weights), the kept export (collect_full_weights: on the host),
  gradient clipping (workers/optimizer_step.clip_grad_norm) and an optimizer step, each
  against the same model unsharded in the same process.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

DEADLINE_S = 300.0  # a check's processes must all end within this


def run_processes(fn, nprocs: int, args: tuple, timeout: float = DEADLINE_S) -> None:
    """`fn(index, *args)` in `nprocs` spawned processes, each ended by `timeout` seconds."""
    import torch.multiprocessing as mp

    from workers.base import find_free_port

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(find_free_port())
    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"{fn.__name__}: {nprocs} processes still running after {timeout:g} s")


def _report_device(index: int, local_ranks: list[int], out: str) -> None:
    from workers.device import device_report, set_device_for_local_rank

    set_device_for_local_rank(local_ranks[index])
    report = {"local_rank": local_ranks[index], "pid": os.getpid(), "node_ip": "127.0.0.1", **device_report()}
    Path(out, f"placement_{index}.json").write_text(json.dumps(report))


def device_count() -> int:
    from workers.device import get_torch_device

    torch_device = get_torch_device()
    return torch_device.device_count() if torch_device is not None else 0


def placement_check(work: Path, nprocs: int = 2) -> dict:
    """Two rounds of `nprocs` processes: local ranks 0..n-1, then all 0; each round's reports
    and the ranks the driver's check finds sharing a device, with what it must find."""
    from hybrid.placement import shared_devices

    gpus = device_count()
    rounds = {"own_local_ranks": list(range(nprocs)), "all_local_rank_0": [0] * nprocs}
    result: dict = {"gpus_visible": gpus}
    for name, local_ranks in rounds.items():
        folder = work / f"placement_{name}"
        folder.mkdir(parents=True, exist_ok=True)
        run_processes(_report_device, nprocs, (local_ranks, str(folder)))
        reports = [json.loads((folder / f"placement_{i}.json").read_text()) for i in range(nprocs)]
        found = shared_devices(reports)
        expected = expected_sharing(local_ranks, gpus)
        result[name] = {"reports": reports, "shared": found, "expected": expected, "ok": found == expected}
    result["ok"] = all(result[name]["ok"] for name in rounds)
    return result


def expected_sharing(local_ranks: list[int], gpus: int) -> list[list[int]]:
    """The ranks the driver's check must name for processes given `local_ranks` on a machine
    with `gpus` visible GPUs (a worker takes GPU local_rank % gpus; CPU ranks never clash)."""
    if gpus == 0:
        return []
    ranks_of: dict[int, list[int]] = {}
    for rank, local_rank in enumerate(local_ranks):
        ranks_of.setdefault(local_rank % gpus, []).append(rank)
    return [ranks for ranks in ranks_of.values() if len(ranks) > 1]


def tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _max_gap(pairs, reference: dict) -> float:
    """The largest absolute difference between the (name, tensor) pairs and `reference`."""
    return max(float((tensor.detach().cpu() - reference[name].cpu()).abs().max()) for name, tensor in pairs)


def _offload_rank(rank: int, world: int, out: str) -> None:
    import copy

    import torch
    import torch.distributed as dist

    from workers.device import current_device, get_dist_backend, host_device, set_device_for_local_rank
    from workers.fsdp_utils import apply_fsdp2
    from workers.optimizer_step import clip_grad_norm
    from workers.weight_sync import collect_full_weights, iter_full_weights

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    set_device_for_local_rank(rank)
    dist.init_process_group(get_dist_backend(), rank=rank, world_size=world, timeout=timedelta(seconds=120))
    model = tiny_llama().to(current_device())  # as workers/model_loading.py: buffers stay on the device
    reference = copy.deepcopy(model)
    apply_fsdp2(model, torch.float32, reshard_after_forward=True, offload_policy=True)
    params = dict(model.named_parameters())
    result = {"rank": rank, "world": world, "backend": get_dist_backend()}
    result["shard_devices"] = sorted({p.to_local().device.type for p in params.values()})
    state = {name: t.detach().clone() for name, t in reference.state_dict().items()}
    gathered = list(iter_full_weights(model.state_dict(), torch.float32, 1 << 16, False))
    result["gather_max_gap"] = _max_gap(gathered, state)
    kept = collect_full_weights(model.state_dict(), torch.float32, 1 << 16, False, keep=rank == 0)
    if kept is not None:
        result["kept_devices"] = sorted({t.device.type for _, t in kept})
        result["kept_on_host"] = all(t.device == host_device() for _, t in kept)
        result["kept_max_gap"] = _max_gap(kept, state)
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 12))
    for module in (model, reference):
        module(input_ids=ids.to(current_device()), labels=ids.to(current_device())).loss.backward()
    norm = float(clip_grad_norm(model.parameters(), max_norm=0.05))
    ref_norm = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=0.05))
    result.update(grad_norm=norm, reference_grad_norm=ref_norm, grad_norm_rel_gap=abs(norm - ref_norm) / ref_norm)
    for module in (model, reference):
        torch.optim.SGD(module.parameters(), lr=1.0).step()
    stepped = {name: t.detach() for name, t in reference.state_dict().items()}
    after = list(iter_full_weights(model.state_dict(), torch.float32, 1 << 16, False))
    result["after_step_max_gap"] = _max_gap(after, stepped)
    result["step_moved"] = _max_gap(after, state)  # the step changed the weights (> 0)
    Path(out, f"offload_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def offload_collectives_check(work: Path) -> dict:
    """FSDP2 with offload_policy: gather, kept export, clip (the reference norm above the clip
    of 0.05, so it acts) and step against the unsharded model; 2 processes where there are 2
    GPUs or none (the CPU), else 1."""
    gpus = device_count()
    world = 2 if gpus == 0 or gpus >= 2 else 1
    folder = work / "offload_collectives"
    folder.mkdir(parents=True, exist_ok=True)
    run_processes(_offload_rank, world, (world, str(folder)))
    ranks = [json.loads((folder / f"offload_{r}.json").read_text()) for r in range(world)]
    first = ranks[0]
    ok = (
        all(r["gather_max_gap"] <= 1e-6 and r["after_step_max_gap"] <= 1e-5 for r in ranks)
        and all(r["grad_norm_rel_gap"] <= 1e-5 and r["reference_grad_norm"] > 0.05 for r in ranks)
        and all(r["step_moved"] > 0 for r in ranks)
        and first["kept_on_host"]
        and first["kept_max_gap"] <= 1e-6
    )
    return {"world": world, "gpus_visible": gpus, "ranks": ranks, "ok": ok}


CHECKS = {"placement": placement_check, "offload_collectives": offload_collectives_check}


def run_checks(wanted: set[str], work: Path) -> dict:
    """The checks of this module that `wanted` names (all when it is empty), each as a
    gpu_check result: {'name', 'rc' (0, or 'failed' / the error), 'seconds', 'steps': [],
    'log_tail', 'check': the details}."""
    results = {}
    for name, check in CHECKS.items():
        if wanted and name not in wanted:
            continue
        start = time.perf_counter()
        try:
            detail = check(work)
            rc = 0 if detail["ok"] else "failed"
        except Exception as err:  # reported in the table and the JSON, with its type: the other runs go on
            detail, rc = {"error": f"{type(err).__name__}: {err}"}, "error"
        seconds = round(time.perf_counter() - start, 1)
        results[name] = {"name": name, "rc": rc, "seconds": seconds, "steps": [], "log_tail": [], "check": detail}
    return results
