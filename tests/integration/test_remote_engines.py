"""Remote rollout engines end to end: `python -m hybrid.serve` starts one vLLM engine server and
its router on the tiny model (a process of its own, as a user starts it), and a trainer with
`actor_rollout_ref.rollout.remote.*` (engines apart, one-step-off at lag 0: the synchronous
trainer) trains one step through them: generation through the proxy, the first weights pushed
to the server. Then a second push, of the trained weights, is checked on the server: its greedy
tokens' log-probs are the trained model's (computed here by transformers from the weights the
trainer exported), not the first weights'; before that push they were the first weights'."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from tests.integration.checkpoint_helpers import response_log_probs, tiny_run, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The engine's settings, the same for the server and the trainer (the server checks they match);
# a small batch budget keeps vLLM's start-up profiling run short.
ENGINE = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.dtype=float32",
    "actor_rollout_ref.rollout.max_num_batched_tokens=256",
    "actor_rollout_ref.rollout.max_num_seqs=16",
]
LENGTHS = ["data.max_prompt_length=64", "data.max_response_length=8"]


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=8, n_val=4, seed=3)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture
def deployment(tiny_model_dir, tmp_path):
    """`python -m hybrid.serve` with one engine server on ports chosen here, so the trainer can be
    built while the engine starts; `ready()` waits for the URLs file it writes once it answers."""
    urls_file = tmp_path / "urls.json"
    router, server = _free_ports(2)
    command = [
        sys.executable,
        "-m",
        "hybrid.serve",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.hybrid_engine=false",
        "rollout.n_gpus_per_node=1",
        *ENGINE,
        *LENGTHS,
        f"--port={router}",
        f"--server-port={server}",
        f"--urls-file={urls_file}",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below, after the process
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def ready() -> dict:
        deadline = time.monotonic() + 120
        while not urls_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"hybrid.serve did not start:\n{(tmp_path / 'serve.log').read_text()[-3000:]}")
            time.sleep(0.2)
        return json.loads(urls_file.read_text())

    try:
        yield {"proxy_url": f"http://127.0.0.1:{router}", "server_urls": [f"http://127.0.0.1:{server}"], "ready": ready}
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def test_a_training_step_through_a_remote_deployment_and_the_pushed_weights_on_the_server(
    tiny_model_dir, arithmetic_files, tmp_path, deployment, monkeypatch
):
    from transformers import AutoModelForCausalLM

    from hybrid.engines import EnginePool

    # The trainer starts Ray and its worker while the engine starts; it connects once the
    # deployment has written its URLs (they must be the ones chosen above).
    connect = EnginePool.start

    def start_when_served(pool):
        urls = deployment["ready"]()
        assert urls == {k: deployment[k] for k in ("proxy_url", "server_urls")}
        connect(pool)

    monkeypatch.setattr(EnginePool, "start", start_when_served)

    from hybrid.config import load_config, validate_config
    from protocol.data_proto import DataProto

    base = [
        o
        for o in tiny_run(tiny_model_dir, arithmetic_files, tmp_path)
        if not o.startswith(("actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.dtype", "data.max_"))
    ]
    cfg = load_config(
        [
            *base,
            *ENGINE,
            *LENGTHS,
            "trainer.merge_on_finish=false",
            "trainer.n_gpus_per_node=1",
            "trainer.worker_group=auto",
            "trainer.total_training_steps=1",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.hybrid_engine=false",
            "rollout.n_gpus_per_node=0",
            "async_training.mode=one_step_off",
            "async_training.max_staleness_steps=0",
            "async_training.use_rollout_log_probs=false",
            f"actor_rollout_ref.rollout.remote.proxy_url={deployment['proxy_url']}",
            f"actor_rollout_ref.rollout.remote.server_urls=[{','.join(deployment['server_urls'])}]",
        ]
    )
    validate_config(cfg)
    prompts = torch.randint(5, 1000, (2, 6), generator=torch.Generator().manual_seed(0))
    probe = DataProto.from_dict(
        {
            "input_ids": prompts,
            "attention_mask": torch.ones_like(prompts),
            "position_ids": torch.arange(6).expand(2, 6).clone(),
        },
        meta_info={"validate": True},  # greedy, one sample each
    )

    def inspect(trainer):
        import ray

        first = trainer.engines.generate_sequences(probe)  # the weights pushed after the step
        trainer.engines.push(trainer.actor_rollout_wg, version=7)
        trained = trainer.engines.generate_sequences(probe)
        trainer.engines.simulate_push(8, 0.0)  # the simulated trainer's push: the same weights as version 8
        simulated = trainer.engines.generate_sequences(probe)
        (ref,) = trainer.actor_rollout_wg.export_weights("float32")[0]
        with urllib.request.urlopen(f"{deployment['server_urls'][0]}/version") as answer:
            version = json.loads(answer.read())["version"]
        weights = dict(ray.get(ref))
        return {"first": first, "trained": trained, "simulated": simulated, "weights": weights, "version": version}

    out = train(cfg, inspect=inspect)
    assert len(out["history"]) == 1 and out["history"][0]["async/engine_version"] == 0.0
    # The trainer pushed its trained weights after the update (version 1); the extra push is 7.
    assert set(out["first"].non_tensor_batch["policy_version"]) == {1}
    assert set(out["trained"].non_tensor_batch["policy_version"]) == {7}
    assert set(out["simulated"].non_tensor_batch["policy_version"]) == {8} and out["version"] == 8
    assert torch.equal(out["simulated"].batch["responses"], out["trained"].batch["responses"])

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trained_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trained_model.load_state_dict({k: torch.as_tensor(v).clone() for k, v in out["weights"].items()})

    def gap(model, gen) -> float:
        mask = gen.batch["response_mask"].bool()
        theirs = gen.batch["rollout_log_probs"][mask]
        return (response_log_probs(model, gen)[mask] - theirs).abs().max().item()

    # The server's log-probs are the trained model's (fp32 engine and transformers agree to ~1e-6),
    # and not the first weights', which give log-probs well apart from them.
    pushed, again, before = (
        gap(trained_model, out["first"]),
        gap(trained_model, out["trained"]),
        gap(initial, out["first"]),
    )
    assert pushed < 2e-5 and again < 2e-5 and before > 10 * max(pushed, 1e-6), (pushed, again, before)
