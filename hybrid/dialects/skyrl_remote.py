"""SkyRL's standalone inference deployment, seen from the trainer: `run_engines_locally=false`
with `external_proxy_url` (the router: generation) and/or `external_server_urls` (each server:
weight sync, pause/resume), onto hybrid's `actor_rollout_ref.rollout.remote.*`, whose servers
`python -m hybrid.serve` starts (SkyRL's `-m skyrl.train.entrypoints.serve`).

SkyRL's rules (skyrl/train/utils/utils.py `_validate_new_inference_cfg`,
inference_servers/setup.py `build_new_inference_client`), kept here: external URLs with
`colocate_all=true` are refused; `run_engines_locally=false` needs one of the URLs; the URLs
are used whatever run_engines_locally says; the proxy alone serves both planes; the servers
alone get a router (hybrid: the trainer spreads requests over them itself). The engines'
tensor_parallel_size "must match the standalone deployment": the trainer checks it against
what each server reports when it connects. An empty value (a script's unset variable) is
passed on and reported when the run starts, like a server that does not answer.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.skyrl_convert import ROLLOUT, _colocated, remote_servers_given
from hybrid.dialects.table import Context, Refusal, custom

IE = "generator.inference_engine"
REMOTE = f"{ROLLOUT}.remote"
_COLOCATED = (
    "SkyRL refuses external_proxy_url / external_server_urls with trainer.placement.colocate_all=true (colocated "
    "engines are the trainer's own); set colocate_all=false"
)


def _run_locally(value: Any, ctx: Context) -> dict[str, Any]:
    if value is True:
        return {}
    if value is not False:
        raise Refusal("true or false")
    if ctx.get(f"{IE}.external_proxy_url", None) is None and not remote_servers_given(ctx):
        raise Refusal(
            f"SkyRL's own check: run_engines_locally=false requires {IE}.external_proxy_url or external_server_urls "
            "(the URLs python -m hybrid.serve prints)"
        )
    return {}


def _proxy_url(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:
        return {}
    if _colocated(ctx):
        raise Refusal(_COLOCATED)
    return {f"{REMOTE}.proxy_url": str(value)}


def _server_urls(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None or value == "" or value == []:
        return {}  # not given (an unset variable in a script: the proxy then serves both planes)
    if not isinstance(value, (list, tuple)) or not all(isinstance(u, str) for u in value):
        raise Refusal("a list of URLs, e.g. ['http://host:8001','http://host:8002']")
    if _colocated(ctx):
        raise Refusal(_COLOCATED)
    return {f"{REMOTE}.server_urls": list(value)}


REMOTE_RULES = (
    custom(
        f"{IE}.run_engines_locally",
        (),
        _run_locally,
        "true: nothing; false: needs external_proxy_url or external_server_urls (which write remote.*)",
    ),
    custom(
        f"{IE}.external_proxy_url",
        (f"{REMOTE}.proxy_url",),
        _proxy_url,
        "same value (needs colocate_all=false)",
        "the router of a deployment started with python -m hybrid.serve: generation goes through it (and the "
        "weight pushes, fanned out to its servers, when external_server_urls is not given)",
    ),
    custom(
        f"{IE}.external_server_urls",
        (f"{REMOTE}.server_urls",),
        _server_urls,
        "same list (needs colocate_all=false); null, '' and [] write nothing",
        "each engine server of that deployment: weight pushes (the trainer's full weights as one safetensors body "
        "over HTTP), pause/resume, versions; without external_proxy_url the trainer also generates on them, "
        "each request to the one with the fewest rows in flight",
    ),
)

__all__ = ["REMOTE_RULES"]
