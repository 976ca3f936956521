"""The trainer's side of remote rollout engines (`actor_rollout_ref.rollout.remote.*`): engines
that `python -m hybrid.serve` started beforehand, reached over HTTP (routes and formats:
remote_protocol.py).

`RemoteEngineWorker` has the methods of `RolloutEngineWorker` that the engine pool
(hybrid/engines.py) calls, so asynchronous training (one-step-off, hence the synchronous
trainer with its engines apart, and fully async) and SkyRL's simulated trainer run unchanged
over remote servers: the pool makes one such Ray actor per control-plane URL, and each sends
its generations to the data-plane URL and its weight loads, simulated loads and version
queries to its control URL. `load_weights` receives what the trainer's ranks put in Ray's
object store and sends it as one safetensors body.

Which URL does what (SkyRL's matrix, `remote_endpoints`): proxy and servers: generation
through the proxy, control to each server; the proxy alone: both through the proxy (its
router fans the control calls out); the servers alone: each actor generates on its own
server and the pool sends each request to the actor with the fewest rows in flight.

`check_remote_servers` runs on the driver before any actor starts: every URL must answer
`/health` (else one line naming the URL and the key), report the rollout's
tensor_model_parallel_size (SkyRL: "must match the standalone deployment"), and accept the
trainer's sampling settings (`/adopt_sampling`).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

from protocol.data_proto import DataProto
from workers.rollout.remote_protocol import check_url, pack, unpack, weights_to_bytes

KEY = "actor_rollout_ref.rollout.remote"
HEALTH_TIMEOUT_S = 10.0


def remote_endpoints(remote) -> list[tuple[str, str]]:
    """(control URL, data URL) per engine client, from the `remote` section."""
    proxy = None if remote.proxy_url is None else check_url(remote.proxy_url, f"{KEY}.proxy_url")
    servers = None
    if remote.server_urls is not None:
        if not remote.server_urls:
            raise ValueError(f"{KEY}.server_urls is an empty list: give the server URLs hybrid.serve printed, or null")
        servers = [check_url(u, f"{KEY}.server_urls[{i}]") for i, u in enumerate(remote.server_urls)]
    if servers is None:
        if proxy is None:
            raise ValueError(f"{KEY}: set proxy_url and/or server_urls")
        return [(proxy, proxy)]
    return [(server, proxy or server) for server in servers]


def _request(url: str, data: bytes | None = None, timeout: float | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - http(s) URLs only (check_url)
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", body[:200]))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


def check_remote_servers(remote, rollout) -> dict[str, dict]:
    """Every URL of the `remote` section answers, runs `rollout.tensor_model_parallel_size`, and
    takes the trainer's sampling settings; their health answers by URL. Raises RuntimeError with
    one line that starts with the key to change (hybrid/errors.py prints it alone) otherwise."""
    endpoints = remote_endpoints(remote)
    urls = list(dict.fromkeys(url for pair in endpoints for url in pair))
    keys = {remote.proxy_url and remote.proxy_url.rstrip("/"): f"{KEY}.proxy_url"}
    healths = {}
    for url in urls:
        key = keys.get(url, f"{KEY}.server_urls")
        try:
            status, body = _request(f"{url}/health", timeout=HEALTH_TIMEOUT_S)
        except (OSError, urllib.error.URLError) as error:
            reason = getattr(error, "reason", error)
            raise RuntimeError(
                f"{key}: the remote engine server {url} does not answer ({reason}): start it with "
                f"`python -m hybrid.serve ...` or correct the URL"
            ) from None
        if status != 200:
            raise RuntimeError(f"{key}: the remote engine server {url} is not healthy: {_error_text(body)}")
        health = json.loads(body)
        tp = int(rollout.tensor_model_parallel_size)
        if int(health["tensor_parallel_size"]) != tp:
            raise RuntimeError(
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} but the remote engine server {url} runs "
                f"tensor_parallel_size={health['tensor_parallel_size']}: it must match the deployment"
            )
        healths[url] = health
    for control in dict.fromkeys(control for control, _ in endpoints):
        status, body = _request(f"{control}/adopt_sampling", pack(rollout), timeout=HEALTH_TIMEOUT_S)
        if status != 200:
            # The server's reason starts with the key to change (hybrid/errors.py prints it alone).
            raise RuntimeError(f"{_error_text(body)} (the remote engine server {control})")
    return healths


class RemoteEngineWorker:
    """One engine client: `control_url` gets the loads and version queries, `data_url` the
    generations (see the module doc). A Ray async actor: many generations at once."""

    def __init__(self, config, engine_index: int = 0, control_url: str = "", data_url: str = ""):
        self.config = config
        self.engine_index = int(engine_index)
        self.control_url = control_url.rstrip("/")
        self.data_url = data_url.rstrip("/")
        self._dtype: str | None = None
        self._session = None

    def _client(self):
        import aiohttp

        if self._session is None:  # made on the actor's loop
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def _call(self, url: str, route: str, data: bytes | None = None, json_body=None) -> bytes:
        method = self._client().get if data is None and json_body is None else self._client().post
        async with method(f"{url}{route}", data=data, json=json_body) as answer:
            body = await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"remote engine {url}{route}: HTTP {answer.status}: {_error_text(body)}")
        return body

    async def _json(self, url: str, route: str, data: bytes | None = None, json_body=None) -> dict:
        return json.loads(await self._call(url, route, data, json_body))

    # ------------------------------------------------------------------ RolloutEngineWorker's methods
    async def init_engine(self) -> dict:
        health = await self._json(self.control_url, "/health")
        self._dtype = str(health["dtype"])
        return {"dtype": self._dtype, "version": int(health["version"])}

    def engine_dtype(self) -> str:
        if self._dtype is None:
            raise RuntimeError("RemoteEngineWorker.engine_dtype: call init_engine first")
        return self._dtype

    async def version(self) -> int:
        return int((await self._json(self.control_url, "/version"))["version"])

    async def busy_seconds(self) -> float:
        return float((await self._json(self.control_url, "/stats"))["busy_s"])

    async def stats(self) -> dict:
        return await self._json(self.control_url, "/stats")

    def set_reward_loop(self, handles: list, use_reward_fn: bool, reward_fn_key: str) -> None:
        raise RuntimeError(
            "the reward loop scores trajectories on the engines' side, which remote engine servers cannot reach: set "
            "reward_model.use_reward_loop=false with actor_rollout_ref.rollout.remote.*"
        )

    async def load_weights(self, version: int, weights, abort: bool = False) -> float:
        """The trainer's weights (SharedWeights from the object store, a list of pairs or a dict)
        to the control URL as one safetensors body; returns the server's seconds loading."""
        if isinstance(weights, list) and len(weights) == 1 and not isinstance(weights[0], tuple):
            import ray

            weights = ray.get(weights[0])  # export_weights' [ObjectRef], passed on as it came
        pairs = weights.items() if isinstance(weights, dict) else weights
        body = await asyncio.to_thread(weights_to_bytes, pairs)
        route = f"/update_weights?version={int(version)}&abort={int(bool(abort))}"
        return float((await self._json(self.control_url, route, data=body))["seconds"])

    async def simulate_sync(self, version: int, seconds: float, abort: bool = False) -> float:
        body = {"version": int(version), "seconds": float(seconds), "abort": bool(abort)}
        return float((await self._json(self.control_url, "/simulate_sync", json_body=body))["seconds"])

    async def pause(self, abort: bool = False) -> None:
        await self._json(self.control_url, "/pause", json_body={"abort": bool(abort)})

    async def resume(self) -> None:
        await self._json(self.control_url, "/resume", json_body={})

    async def generate(self, prompts: DataProto) -> DataProto:
        output = unpack(await self._call(self.data_url, "/generate", data=pack(prompts)))
        output.meta_info["engine_index"] = self.engine_index
        return output

    async def shutdown(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


__all__ = ["RemoteEngineWorker", "check_remote_servers", "remote_endpoints"]
