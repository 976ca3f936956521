"""The rules of remote rollout engines (`actor_rollout_ref.rollout.remote.*`, engines that
`python -m hybrid.serve` runs; hybrid/config/rules_async.py calls `check_remote`): which keys go
with them, and the URLs' form. Whether the servers answer is checked when the run starts
(workers/rollout/remote_engine.py), so composing a config (`--cfg job`) needs none running; an
empty URL (a required variable a script left unset) is reported then too, naming its key."""

from __future__ import annotations

import contextlib
import contextvars

from hybrid.config.schema import HybridConfig
from protocol.config_schema import Problems, valid

REMOTE = "actor_rollout_ref.rollout.remote"
# Set while `python -m hybrid.serve` checks its config: it starts the engines, no training rank.
SERVING = contextvars.ContextVar("serving", default=False)


@contextlib.contextmanager
def serving_only():
    """Config checks for the process that starts the engine servers (hybrid/serve.py): the
    placement check counts no training ranks (rules_async.py), remote URLs are refused."""
    token = SERVING.set(True)
    try:
        yield
    finally:
        SERVING.reset(token)


def check_remote(config: HybridConfig, problems: Problems) -> None:
    arr = config.actor_rollout_ref
    remote = arr.rollout.remote
    if not valid(remote) or not remote.enabled:
        return
    if SERVING.get():
        problems.add(
            f"hybrid.serve starts its own engine servers: remove {REMOTE}.* (SkyRL: external_proxy_url / "
            f"external_server_urls) from its command line"
        )
        return
    if arr.hybrid_engine is True:
        problems.add(
            f"{REMOTE}.* sends generation to engines of a separate deployment, but "
            f"actor_rollout_ref.hybrid_engine=true generates in the training workers' own engines: set "
            f"hybrid_engine=false (SkyRL: colocate_all=false)"
        )
    if valid(config.rollout.n_gpus_per_node) and config.rollout.n_gpus_per_node != 0:
        problems.add(
            f"rollout.n_gpus_per_node={config.rollout.n_gpus_per_node} gives engines of this run devices, but with "
            f"{REMOTE}.* the engines are the deployment's: set rollout.n_gpus_per_node=0"
        )
    if config.reward_model.use_reward_loop is True:
        problems.add(
            f"reward_model.use_reward_loop=true scores trajectories on the engines' side, which {REMOTE}.* servers "
            f"cannot reach (no Ray handles across deployments): set it to false"
        )
    urls = [("proxy_url", remote.proxy_url)] + [
        (f"server_urls[{i}]", url) for i, url in enumerate(remote.server_urls or ())
    ]
    for key, url in urls:
        if url and not str(url).startswith(("http://", "https://")):
            problems.add(f"{REMOTE}.{key}={url!r} is not an http:// or https:// URL")
    if remote.server_urls is not None and len(remote.server_urls) == 0:
        problems.add(f"{REMOTE}.server_urls=[] names no server: give the URLs hybrid.serve printed, or null")


__all__ = ["SERVING", "check_remote", "serving_only"]
