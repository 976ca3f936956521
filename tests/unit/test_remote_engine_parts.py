"""Remote rollout engines (`actor_rollout_ref.rollout.remote.*`, `python -m hybrid.serve`) without
starting any: the config rules, SkyRL's keys, which URL gets what, the router's choices, the
check of the trainer's sampling settings against a server's, the weights' wire format, and the
one-line failure when a server does not answer. tests/integration/test_remote_engines.py runs
a deployment and a training step through it."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest
import torch

from hybrid.config import ConfigError, build_config
from tests.unit.dialect_helpers import skyrl, skyrl_error
from workers.rollout.remote_engine import check_remote_servers, remote_endpoints
from workers.rollout.remote_protocol import check_url, weights_from_bytes, weights_to_bytes
from workers.rollout.remote_router import combine_health, least_busy
from workers.rollout.remote_server import sampling_mismatch

R = "actor_rollout_ref.rollout.remote"
APART = ["actor_rollout_ref.hybrid_engine=false", "trainer.worker_group=ray"]
IE = "generator.inference_engine"


def _problems(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        build_config(list(overrides))
    return str(err.value)


# ---------------------------------------------------------------- hybrid's keys


def test_remote_keys_build_with_the_engines_apart_and_no_devices_of_their_own():
    config = build_config([*APART, f"{R}.proxy_url=http://h:1", f"{R}.server_urls=[http://h:2,http://h:3]"])
    remote = config.actor_rollout_ref.rollout.remote
    assert (remote.proxy_url, remote.server_urls, remote.enabled) == ("http://h:1", ("http://h:2", "http://h:3"), True)
    assert config.rollout.n_gpus_per_node == 0
    assert build_config([]).actor_rollout_ref.rollout.remote.enabled is False


def test_remote_keys_refuse_the_fused_engine_devices_of_their_own_the_reward_loop_and_bad_urls():
    message = _problems(f"{R}.proxy_url=http://h:1")
    assert "actor_rollout_ref.hybrid_engine=true generates in the training workers' own engines" in message
    message = _problems(*APART, f"{R}.server_urls=[ftp://h]", "rollout.n_gpus_per_node=1")
    assert f"{R}.server_urls[0]='ftp://h' is not an http:// or https:// URL" in message
    assert "rollout.n_gpus_per_node=1 gives engines of this run devices" in message
    assert f"{R}.server_urls=[] names no server" in _problems(*APART, f"{R}.server_urls=[]")
    message = _problems(*APART, f"{R}.proxy_url=http://h:1", "reward_model.use_reward_loop=true")
    assert "reward_model.use_reward_loop=true scores trajectories on the engines' side" in message


def test_an_empty_url_composes_and_fails_at_start_naming_its_key():
    # A script's unset variable: `--cfg job` must not need servers, the start names the key.
    config = build_config([*APART, f"{R}.proxy_url="])
    with pytest.raises(ValueError, match=rf"^{R}.proxy_url is empty: set it to the URL"):
        remote_endpoints(config.actor_rollout_ref.rollout.remote)


def test_which_url_gets_what():
    section = build_config([]).actor_rollout_ref.rollout.remote
    both = replace(section, proxy_url="http://p:1/", server_urls=("http://s:1", "http://s:2"))
    assert remote_endpoints(both) == [("http://s:1", "http://p:1"), ("http://s:2", "http://p:1")]
    assert remote_endpoints(replace(section, proxy_url="http://p:1")) == [("http://p:1", "http://p:1")]
    servers = replace(section, server_urls=("http://s:1", "http://s:2"))
    assert remote_endpoints(servers) == [("http://s:1", "http://s:1"), ("http://s:2", "http://s:2")]
    with pytest.raises(ValueError, match="not an http:// or https:// URL"):
        check_url("h:1", "k")


def test_a_server_that_does_not_answer_fails_in_one_line_naming_it():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = build_config([*APART, f"{R}.server_urls=[http://127.0.0.1:{port}]"])
    arr = config.actor_rollout_ref
    with pytest.raises(RuntimeError) as err:
        check_remote_servers(arr.rollout.remote, arr.rollout)
    message = str(err.value)
    assert message.startswith(f"{R}.server_urls: the remote engine server http://127.0.0.1:{port} does not answer")
    assert "\n" not in message


# ---------------------------------------------------------------- SkyRL's keys

SKYRL_APART = ["trainer.placement.colocate_all=false", f"{IE}.num_engines=2", f"{IE}.run_engines_locally=false"]


def test_skyrl_external_urls_become_the_remote_keys():
    out = skyrl(
        *SKYRL_APART, f"{IE}.external_proxy_url=http://p:8000", f"{IE}.external_server_urls=['http://s:1','http://s:2']"
    )
    assert out[f"{R}.proxy_url"] == "http://p:8000"
    assert out[f"{R}.server_urls"] == ["http://s:1", "http://s:2"]
    # The deployment's devices are not this run's: no engine devices, the engines apart.
    assert (out["actor_rollout_ref.hybrid_engine"], out["rollout.n_gpus_per_node"]) == (False, 0)
    proxy_only = skyrl(*SKYRL_APART, f"{IE}.external_proxy_url=http://p:8000")
    assert f"{R}.server_urls" not in proxy_only and proxy_only[f"{R}.proxy_url"] == "http://p:8000"


def test_skyrl_refuses_what_skyrl_refuses():
    message = skyrl_error(f"{IE}.external_proxy_url=http://p:8000")  # colocate_all defaults to true
    assert "SkyRL refuses external_proxy_url / external_server_urls with trainer.placement.colocate_all=true" in message
    message = skyrl_error("trainer.placement.colocate_all=false", f"{IE}.run_engines_locally=false")
    assert "run_engines_locally=false requires generator.inference_engine.external_proxy_url or" in message
    message = skyrl_error(*SKYRL_APART, f"{IE}.external_server_urls=http://s:1")
    assert "a list of URLs" in message


# ---------------------------------------------------------------- router and server logic


def test_the_router_picks_the_least_busy_server_and_refuses_mixed_tensor_parallel_sizes():
    assert least_busy([2, 0, 0]) == 1
    assert least_busy([1]) == 0
    health = {"status": "ok", "tensor_parallel_size": 2, "version": 5, "dtype": "bfloat16"}
    combined = combine_health(["a", "b"], [health, {**health, "version": 3}])
    assert (combined["version"], combined["servers"]) == (3, 2)  # the oldest version served
    with pytest.raises(ValueError, match=r"differ in tensor_parallel_size \(a: 2, b: 1\)"):
        combine_health(["a", "b"], [health, {**health, "tensor_parallel_size": 1}])


def test_the_server_samples_as_the_trainer_says_once_its_engine_settings_match():
    server = build_config(["data.max_prompt_length=64", "data.max_response_length=32"]).actor_rollout_ref.rollout
    assert sampling_mismatch(server, replace(server, temperature=0.6, top_p=0.95, n=8, response_length=16)) is None
    assert sampling_mismatch(server, replace(server, tensor_model_parallel_size=2)) == (
        "actor_rollout_ref.rollout.tensor_model_parallel_size is 2 for the trainer but 1 for this server: start "
        "hybrid.serve with the trainer's value"
    )
    message = sampling_mismatch(server, replace(server, response_length=64))
    assert message.startswith(
        "actor_rollout_ref.rollout.max_model_len: the trainer's prompt + response need 128 tokens but this server's "
        "engine holds 96"
    )


def test_weights_travel_as_safetensors_with_tied_tensors_under_both_names():
    embed = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    norm = torch.ones(4)
    pairs = [("model.embed_tokens.weight", embed), ("model.norm.weight", norm), ("lm_head.weight", embed)]
    back = weights_from_bytes(weights_to_bytes(pairs))
    assert list(back) == ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    assert back["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(back["lm_head.weight"], embed) and torch.equal(back["model.norm.weight"], norm)
    with pytest.raises(ValueError, match="'model.norm.weight' is given twice"):
        weights_to_bytes([("model.norm.weight", norm), ("model.norm.weight", norm)])


# ---------------------------------------------------------------- hybrid.serve's config


def test_serve_counts_engines_and_fits_them_to_the_machine_without_training_ranks():
    import os

    from hybrid.serve import engine_count, serve_config

    cores = os.cpu_count() or 1  # no GPU here: a device is a core
    keys = ["actor_rollout_ref.model.path=/models/policy", "actor_rollout_ref.hybrid_engine=false"]
    assert engine_count(serve_config([*keys, f"rollout.n_gpus_per_node={cores}"])) == cores
    # A trainer beside the same engines needs a core more.
    assert f"1 training ranks + rollout.n_gpus_per_node={cores} engine devices" in _problems(
        *keys, f"rollout.n_gpus_per_node={cores}"
    )
    assert f"rollout.n_gpus_per_node={cores + 1} engine devices, but this machine has {cores} CPU cores" in str(
        pytest.raises(ConfigError, serve_config, [*keys, f"rollout.n_gpus_per_node={cores + 1}"]).value
    )
    with pytest.raises(ConfigError, match=r"  - hybrid.serve starts its own engine servers: remove"):
        serve_config([*keys, "rollout.n_gpus_per_node=1", f"{R}.proxy_url=http://h:1"])
    with pytest.raises(ConfigError, match=r"^set rollout.n_gpus_per_node \(and rollout.nnodes\)"):
        engine_count(serve_config(["actor_rollout_ref.model.path=/models/policy"]))
