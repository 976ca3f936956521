"""The CUDA paths checked on a lent GPU machine, in one short command, with a table of results.

    python -m scripts.gpu_check --assets DIR --out DIR [--only NAME,...] [--json PATH]

Such a machine has torch, transformers, peft and triton but no Ray and no vLLM, so every run
here is `python -m hybrid.main_ppo` with one in-process rank (the local worker group) and
the Hugging Face rollout engine. `--assets` holds the SmolLM2 tokenizer files and the
SmolLM2-135M config (and, optionally, `gguf/SmolLM2-135M-Instruct.Q4_1.gguf` for the real weights, in a
folder of its own: transformers reads tokenizer files beside it);
models are built there from configs:

- `tiny`: the tests' 2-layer, hidden-64 model, random, fp32;
- `smol135`: the SmolLM2-135M architecture (the real weights when the GGUF file is there);
- `smol1b7`: the SmolLM2-1.7B architecture (hidden 2048, 24 layers), random, for MFU.

Runs (each a subprocess; its metrics.jsonl is read back):

- `tiny_cuda` / `tiny_cpu`: GAE with a critic, greedy rollouts, fp32, 2 steps, once on the GPU
  and once with trainer.device=cpu: the same config end to end on both devices (NCCL vs gloo,
  the in-process worker group). On the first lease the trainer ignored do_sample=false (since
  fixed) and the devices sampled different tokens; greedy now, their numbers may still part
  where the random model's nearly flat logits tie (the real-weights pair below does not).
- `smol135_bf16`: GRPO in bf16 (mixed precision, bf16 engine), 3 steps: step time, MFU, memory.
- `smol135_offload`: the same with parameter and optimizer offload: the first step's metrics
  must equal `smol135_bf16`'s, and the memory held between phases falls.
- `smol135_liger`: the same with liger-kernel: losses close to `smol135_bf16`'s (other kernels).
- `smol135_offload_policy`, `smol135_checkpointing`: FSDP2's CPUOffloadPolicy; gradient checkpointing.
- `smol135_compile`: verl's `actor.use_torch_compile=true` (the entropy through torch.compile, the
  ref following): its metrics against `smol135_bf16`'s.
- `smol135_profile`: the bf16 run with the torch profiler on step 3 (verl's global_profiler keys);
  the trace is summarised as the busiest kernels, CUDA runtime calls and CPU operators (not yet
  run on a GPU: the first lease found the small update overhead-bound and did not profile it).
- `smol1b7_bf16`: the larger architecture, for MFU.
- `sft135`: the SFT trainer on the 135M architecture, 4 steps.

Checks without a model folder (scripts/gpu_check_placement.py; `--assets` is not needed when
`--only` names only these, and they run on a CPU machine too, gloo in place of NCCL):

- `placement`: two processes (torch.multiprocessing) set their device from their local rank
  and report it (index, GPU uuid); the driver's check must find what a worker would get (on
  one GPU both processes share it, and with every local rank 0 they always do).
- `offload_collectives`: a tiny Llama under FSDP2 with offload_policy (2 processes with 2 GPUs
  or none, else 1): weight gather, kept export on the host, gradient clipping and a step,
  against the same model unsharded.

    python -m scripts.gpu_check --only placement,offload_collectives --out DIR --json DIR/placement.json

`--default-job` runs `make run`'s job with the real weights (step 3's actor profiled), then
`real_cuda` / `real_cpu`: the tiny pair's config with the real weights, whose confident greedy
decoding should give both devices the same tokens, so that their losses and gradient norms
compare (not yet run on a GPU). How it ran on a lent H200
(docs/gpus_and_nodes.md has the results): the missing packages travel as wheels (`.whl`:
hydra-core, omegaconf, antlr4-python3-runtime, tensordict, pyvers, codetiming, liger-kernel,
gguf, dill), installed with `pip install --no-index --no-deps --target /tmp/site` and put on
PYTHONPATH; the source as a `git archive` copy, so that uncommitted work in the tree stays
behind; the 98 MB GGUF file over the 64 MiB a call carries in two halves, the first kept in
/root between two calls on the same warm machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scripts.gpu_check_placement import CHECKS, run_checks

SMOL_1B7 = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32)
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Step metrics compared between runs: the device check (fp32) and the offload check (bf16).
COMPARED = (
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/entropy",
    "critic/vf_loss",
    "critic/grad_norm",
    "response_length/mean",
)


def build_models(assets: Path, work: Path, wanted: set[str]) -> dict[str, str]:
    """The model folders the wanted runs need (all when `wanted` is empty)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(assets)
    models = {}
    base = AutoConfig.from_pretrained(assets)
    shapes = {
        "tiny": dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
        ),
        "smol1b7": dict(SMOL_1B7, num_key_value_heads=32, head_dim=64),
    }
    for name, shape in shapes.items():
        if wanted and not any(run.startswith(name) for run in wanted):
            models[name] = "not built"
            continue
        config = AutoConfig.from_pretrained(assets, **shape, torch_dtype="float32")
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        out = work / name
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        models[name] = str(out)
    gguf = assets / "gguf" / GGUF
    if gguf.is_file():
        from hybrid.defaults import convert_gguf_model

        models["smol135"] = str(convert_gguf_model(gguf, work / "smol135"))
        models["smol135_weights"] = "real (converted from the GGUF)"
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(base)
        model.save_pretrained(work / "smol135", safe_serialization=True)
        tokenizer.save_pretrained(work / "smol135")
        models["smol135"] = str(work / "smol135")
        models["smol135_weights"] = "random"
    return models


def data_files(work: Path) -> dict[str, str]:
    from hybrid.arithmetic_task import write_arithmetic_parquet

    paths = write_arithmetic_parquet(work / "data", n_train=512, n_val=64, seed=3)
    return {k: str(v) for k, v in paths.items()}


def ppo_args(
    model: str, files: dict, batch: int, n: int, response: int, steps: int, micro: int | None = None
) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        f"data.train_batch_size={batch}",
        "data.max_prompt_length=64",
        f"data.max_response_length={response}",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro or batch * n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch * n}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.merge_on_finish=false",
        "trainer.plot_on_finish=false",
        "trainer.logger=[file]",
    ]


def device_pair_args(model: str, files: dict, lr: float) -> list[str]:
    """GAE with a critic, greedy rollouts, fp32 everywhere, 2 steps of 4 prompts x 2."""
    return ppo_args(model, files, batch=4, n=2, response=16, steps=2) + [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.rollout.do_sample=false",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
        "critic.model.fsdp_config.mixed_precision=fp32",
        "critic.ppo_micro_batch_size_per_gpu=8",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"critic.optim.lr={lr}",
    ]


def profile_args(save_path: Path, step: int = 3) -> list[str]:
    """verl's global_profiler keys: the torch profiler on the actor for one step."""
    return [
        "global_profiler.tool=torch",
        f"global_profiler.steps=[{step}]",
        "actor_rollout_ref.actor.profiler.enable=true",
        f"global_profiler.save_path={save_path}",
    ]


def runs(models: dict, files: dict, work: Path) -> dict[str, tuple[list[str], dict]]:
    tiny = device_pair_args(models["tiny"], files, lr=1e-3)
    smol = ppo_args(models["smol135"], files, batch=32, n=4, response=128, steps=3)
    big = ppo_args(models["smol1b7"], files, batch=32, n=4, response=256, steps=2, micro=32)
    offload = [
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
    ]
    return {
        "tiny_cuda": (tiny, {}),
        "tiny_cpu": (tiny + ["trainer.device=cpu"], {}),
        "smol135_bf16": (smol, {}),
        "smol135_offload": (smol + offload, {}),
        "smol135_liger": (smol + ["actor_rollout_ref.model.use_liger=true"], {}),
        "smol135_offload_policy": (smol + ["actor_rollout_ref.actor.fsdp_config.offload_policy=true"], {}),
        "smol135_checkpointing": (smol + ["actor_rollout_ref.model.enable_gradient_checkpointing=true"], {}),
        "smol135_profile": (smol + profile_args(work / "profile"), {}),
        "smol135_compile": (smol + ["actor_rollout_ref.actor.use_torch_compile=true"], {}),
        "smol1b7_bf16": (big, {}),
    }


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(int(row.get("step", 0)), {}).update(row.get("data", row))
    return [steps[k] for k in sorted(steps)]


def run_one(name: str, args: list[str], work: Path, out: Path, timeout: float, module: str = "hybrid.main_ppo") -> dict:
    """`python -m module args` in a run folder of its own; its exit status, seconds, step
    metrics, and the end of its log when it failed."""
    run_dir = work / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    args = [*args, f"trainer.default_local_dir={run_dir}"]
    log = out / f"{name}.log"
    start = time.perf_counter()
    with open(log, "w") as handle:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", module, *args], stdout=handle, stderr=subprocess.STDOUT, timeout=timeout
            )
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    seconds = time.perf_counter() - start
    metrics = read_metrics(run_dir / "metrics.jsonl")
    tail = log.read_text().splitlines()[-6:] if code != 0 else []
    return {"name": name, "rc": code, "seconds": round(seconds, 1), "steps": metrics, "log_tail": tail}


def relative_gap(a: dict, b: dict) -> dict[str, float]:
    gaps = {}
    for key in COMPARED:
        if key in a and key in b:
            x, y = float(a[key]), float(b[key])
            # Relative, except near zero (a GRPO loss of 1e-8 is zero in all but rounding).
            gaps[key] = abs(x - y) / max(abs(x), abs(y), 1e-3)
    return gaps


def summary(results: dict) -> list[tuple[str, str]]:
    rows = []
    for name, result in results.items():
        steps = result["steps"]
        last = steps[-1] if steps else {}
        parts = [f"rc={result['rc']}", f"{result['seconds']} s", f"{len(steps)} steps"]
        for key in (
            "perf/time_per_step",
            "timing_s/gen",
            "timing_s/update_actor",
            "perf/mfu/actor",
            "perf/max_memory_allocated_gb",
            "perf/max_memory_reserved_gb",
        ):
            if key in last:
                parts.append(f"{key.split('/')[-1]}={float(last[key]):.4g}")
        rows.append((name, " ".join(parts)))
    variants = (
        "smol135_offload",
        "smol135_liger",
        "smol135_offload_policy",
        "smol135_checkpointing",
        "smol135_compile",
    )
    pairs = [("tiny_cuda", "tiny_cpu"), ("real_cuda", "real_cpu")] + [("smol135_bf16", name) for name in variants]
    for a, b in pairs:
        if results.get(a, {}).get("steps") and results.get(b, {}).get("steps"):
            gaps = [relative_gap(x, y) for x, y in zip(results[a]["steps"], results[b]["steps"])]
            worst = {k: max(g.get(k, 0.0) for g in gaps) for k in gaps[0]}
            rows.append((f"{a} vs {b}", " ".join(f"{k}={v:.2e}" for k, v in worst.items())))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", type=Path, help="needed unless --only names only " + ", ".join(CHECKS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_check"))
    parser.add_argument("--only", default="")
    parser.add_argument("--timeout", type=float, default=150.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--default-job", action="store_true", help="only the default job (the GGUF in --assets)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.default_job:
        if args.assets is None:
            parser.error("--default-job needs --assets (the GGUF file under gguf/)")
        results = run_default_job(args.assets, args.work, args.out, args.timeout)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
        for step in results["default_job"]["steps"]:
            vals = {k: round(float(v), 3) for k, v in step.items() if k.startswith("val-core/")}
            if vals:
                print(step["step"], vals)
        for table in results["default_job"]["profile"]:
            print(json.dumps(table, indent=1), flush=True)
        for name, text in summary(results):
            print(f"{name:32} {text}")
        return

    import torch

    from workers import device

    env = {
        "torch": torch.__version__,
        "device": device.get_device_name(),
        "backend": device.get_dist_backend(),
        "accelerator": device.accelerator_name(),
        "bf16": device.supports_bf16(),
        "auto_dtype": device.resolve_dtype_name("auto"),
    }
    if device.is_cuda_available():
        env["matmul_bf16_tflops"] = round(measure_matmul_tflops(), 1)
    print(json.dumps(env), flush=True)

    wanted = set(filter(None, args.only.split(",")))
    # Placement and offload_policy on the collectives: no model folder, Ray or vLLM needed.
    results = run_checks(wanted, args.work)
    for name, result in results.items():
        print(name, result["rc"], result["seconds"], "s", json.dumps(result["check"]), flush=True)
    if wanted and wanted <= set(CHECKS):
        finish(args, env, {}, results)
        return
    if args.assets is None:
        parser.error("--assets is needed for the training runs (or name only " + ", ".join(CHECKS) + " in --only)")
    models = build_models(args.assets, args.work, wanted)
    files = data_files(args.work)
    for name, (run_args, _) in runs(models, files, args.work).items():
        if wanted and name not in wanted:
            continue
        results[name] = run_one(name, run_args, args.work, args.out, args.timeout)
        print(name, results[name]["rc"], results[name]["seconds"], "s", results[name]["log_tail"], flush=True)
        if name == "smol135_profile":
            traces = sorted((args.work / "profile").rglob("*.json"))
            results[name]["profile"] = [summarize_trace(path) for path in traces]
            for table in results[name]["profile"]:
                print(json.dumps(table, indent=1), flush=True)
    if not wanted or "sft135" in wanted:
        results["sft135"] = run_sft(models["smol135"], args.work, args.out, args.timeout)
    finish(args, env, models, results)


def finish(args, env: dict, models: dict, results: dict) -> None:
    """The JSON report (with --json) and the summary table."""
    report = {"env": env, "models": models, "results": results, "summary": summary(results)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    print()
    for name, text in report["summary"]:
        print(f"{name:32} {text}")


def summarize_trace(path: Path, top: int = 12) -> dict:
    """A chrome trace (one profiled step) as the milliseconds of its busiest names per category:
    GPU kernels, CUDA runtime calls (launches) and CPU operators, with their counts and totals."""
    events = json.loads(path.read_text()).get("traceEvents", [])
    by_category: dict[str, dict[str, list[float]]] = {}
    for event in events:
        category, duration = event.get("cat"), event.get("dur")
        if category in ("kernel", "cuda_runtime", "cpu_op") and duration is not None:
            entry = by_category.setdefault(category, {}).setdefault(event.get("name", "?"), [0, 0.0])
            entry[0] += 1
            entry[1] += duration / 1000
    table = {"trace": path.name}
    for category, names in by_category.items():
        ranked = sorted(names.items(), key=lambda item: -item[1][1])
        table[category] = {
            "total_ms": round(sum(ms for _, ms in names.values()), 1),
            "calls": sum(count for count, _ in names.values()),
            "top": [(name[:80], count, round(ms, 2)) for name, (count, ms) in ranked[:top]],
        }
    return table


def run_sft(model: str, work: Path, out: Path, timeout: float) -> dict:
    from hybrid.sft_data import write_arithmetic_sft_parquet

    paths = write_arithmetic_sft_parquet(work / "sft_data")
    args = [
        f"model.partial_pretrain={model}",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['val']}",
        "data.train_batch_size=32",
        "data.micro_batch_size_per_gpu=32",
        "trainer.total_training_steps=4",
        "trainer.logger=[file]",
    ]
    return run_one("sft135", args, work, out, timeout, module="hybrid.sft_trainer")


def run_default_job(assets: Path, work: Path, out: Path, timeout: float) -> dict:
    """`make run`'s job (every default: 30 GRPO steps, validation every 5) with the real
    SmolLM2-135M-Instruct weights and the Hugging Face engine in place of vLLM."""
    from hybrid.defaults import convert_gguf_model

    os.environ["HYBRID_CACHE_DIR"] = str(work / "cache")
    model = convert_gguf_model(assets / "gguf" / GGUF, work / "smol135_real")
    args = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.logger=[console,file]",
        "trainer.merge_on_finish=false",
        "trainer.plot_on_finish=false",
    ]
    # Step 3's update profiled: the first lease measured this small update overhead-bound.
    args += profile_args(work / "profile_default")
    results = {"default_job": run_one("default_job", args, work, out, timeout)}
    results["default_job"]["profile"] = [summarize_trace(p) for p in sorted((work / "profile_default").rglob("*.json"))]
    # The same fp32 config on the GPU and on its host: with the real weights greedy decoding is
    # confident, so both devices generate the same tokens and the step metrics can be compared.
    pair = device_pair_args(str(model), data_files(work), lr=1e-5)
    results["real_cuda"] = run_one("real_cuda", pair, work, out, timeout)
    results["real_cpu"] = run_one("real_cpu", [*pair, "trainer.device=cpu"], work, out, timeout)
    return results


def measure_matmul_tflops(size: int = 8192, repeats: int = 10) -> float:
    """The bf16 matrix-product rate this GPU reaches (the ceiling the MFU's datasheet peak
    stands in for), on random data, median of `repeats` after warm-up."""
    import statistics

    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * size**3 / statistics.median(times) / 1e12 if not math.isnan(times[0]) else float("nan")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
