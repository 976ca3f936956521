"""A standalone inference deployment: `python -m hybrid.serve key=value ... [--host H] [--port P]
[--server-port Q] [--urls-file PATH]` (SkyRL's `-m skyrl.train.entrypoints.serve`; `--dialect skyrl` reads SkyRL's
keys as main_ppo does).

It starts `rollout.nnodes x rollout.n_gpus_per_node / actor_rollout_ref.rollout.tensor_model_parallel_size`
engine servers, each a process of its own holding one rollout engine built from the
`actor_rollout_ref` keys as a trainer builds it (workers/rollout/remote_server.py), plus a router
in front of them (workers/rollout/remote_router.py), prints the router's URL (`proxy_url`, the
data plane: generation) and the servers' (`server_urls`, the control plane: weight pushes,
pause/resume, versions), writes both to `--urls-file` as JSON when asked, and stays up until
SIGTERM or Ctrl-C (or until a server process dies, which stops the rest). A trainer then runs
with `actor_rollout_ref.rollout.remote.proxy_url=...` and/or `.server_urls=[...]`.

The engines start on the model folder's weights (as SkyRL's deployment does; a dummy
`load_format` is read as `auto`), and serve them as version 0 until a trainer pushes its own.
On CPU the machine's cores are split between the servers (OMP_NUM_THREADS); on GPUs each server
gets `tensor_model_parallel_size` of the visible devices.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from hybrid.config.loading import ConfigError
from hybrid.errors import exit_on_error


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m hybrid.serve", add_help=True)
    parser.add_argument("--host", default="127.0.0.1", help="the address the router and servers listen on")
    parser.add_argument("--port", type=int, default=0, help="the router's port (0: a free one)")
    parser.add_argument(
        "--server-port",
        type=int,
        default=0,
        help="server i listens on this port + i (0: free ones), so its URL is known",
    )
    parser.add_argument("--urls-file", default=None, help="write {proxy_url, server_urls} there as JSON")
    return parser.parse_known_args(argv)


def serve_config(argv: list[str]):
    """The checked HybridConfig of the command line's keys (dialects translated first)."""
    from hybrid.config import build_config, check_override_keys, default_config, normalize_overrides
    from hybrid.config.loading import rewrite_foreign_overrides
    from hybrid.config.rules_remote import serving_only
    from hybrid.defaults import register_resolvers
    from hybrid.dialects import translate_argv

    argv = translate_argv(argv)
    flags = [a for a in argv if a.startswith("-")]
    if flags:
        raise ConfigError(
            f"python -m hybrid.serve takes key=value overrides and --host/--port/--urls-file, not {flags}"
        )
    register_resolvers()
    overrides, _ = rewrite_foreign_overrides(argv)
    defaults = default_config()
    check_override_keys(overrides, defaults)
    with serving_only():  # the placement check counts the engines' devices alone
        return build_config(normalize_overrides(overrides, defaults))


def engine_count(config) -> int:
    """How many engine servers the config asks for; ConfigError naming the key otherwise."""
    arr = config.actor_rollout_ref
    if arr.rollout.remote.enabled:
        raise ConfigError(
            "hybrid.serve starts its own engine servers: remove actor_rollout_ref.rollout.remote.* (SkyRL: "
            "external_proxy_url / external_server_urls) from its command line"
        )
    if str(arr.model.path).startswith("hybrid-default:"):
        raise ConfigError("hybrid.serve needs actor_rollout_ref.model.path (the model folder the engines serve)")
    devices, tp = config.rollout.devices, int(arr.rollout.tensor_model_parallel_size)
    if devices < 1:
        raise ConfigError(
            "set rollout.n_gpus_per_node (and rollout.nnodes): the engines' devices, engines x "
            "actor_rollout_ref.rollout.tensor_model_parallel_size (SkyRL: generator.inference_engine.num_engines "
            "with trainer.placement.colocate_all=false)"
        )
    if devices % tp:
        raise ConfigError(
            f"rollout.nnodes x rollout.n_gpus_per_node = {devices} devices do not split into engines of "
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"
        )
    return devices // tp


def server_section(config):
    """The `actor_rollout_ref` section the servers build their engines from: the model folder's
    weights where the load format would leave random ones."""
    from workers.rollout.base import DUMMY_LOAD_FORMATS

    arr = config.actor_rollout_ref
    if arr.rollout.load_format in DUMMY_LOAD_FORMATS:
        arr = replace(arr, rollout=replace(arr.rollout, load_format="auto"))
    return arr


def _child_env(index: int, count: int, tp: int) -> dict[str, str]:
    from workers.device import is_cuda_available

    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    if is_cuda_available():
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        if len(devices) < count * tp:
            raise ConfigError(
                f"{count} engines x tensor_model_parallel_size {tp} need {count * tp} GPUs; {len(devices)} are visible"
            )
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[index * tp : (index + 1) * tp])
        env["OMP_NUM_THREADS"] = "1"
    else:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // count))
    return env


class Deployment:
    """The engine server processes and the router; `start` returns once all answer."""

    def __init__(self, config, host: str = "127.0.0.1", port: int = 0, server_port: int = 0):
        self.config, self.host, self.port, self.server_port = config, host, port, server_port
        self.count = engine_count(config)
        self.processes: list = []
        self.server_urls: list[str] = []
        self.proxy_url: str | None = None
        self._runner = None

    def start_servers(self) -> None:
        from workers.rollout.remote_server import run_engine_server

        context = multiprocessing.get_context("spawn")
        arr = server_section(self.config)
        tp = int(arr.rollout.tensor_model_parallel_size)
        pipes = []
        for index in range(self.count):
            ours, theirs = context.Pipe(duplex=False)
            saved = dict(os.environ)
            os.environ.update(_child_env(index, self.count, tp))  # a spawned child copies the environment
            try:
                process = context.Process(
                    target=run_engine_server,
                    args=(arr, index, self.host, self.server_port + index if self.server_port else 0, theirs),
                    name=f"engine-server-{index}",
                )
                process.start()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            theirs.close()
            self.processes.append(process)
            pipes.append(ours)
        for index, (process, pipe) in enumerate(zip(self.processes, pipes)):
            while not pipe.poll(1.0):
                if not process.is_alive():
                    raise RuntimeError(f"engine server {index} exited with status {process.exitcode} while starting")
            status, text = pipe.recv()
            if status != "ok":
                raise RuntimeError(f"engine server {index} failed to start: {text}")
            self.server_urls.append(text)

    async def start_router(self) -> None:
        from aiohttp import web

        from workers.rollout.remote_router import Router

        self._runner = web.AppRunner(Router(self.server_urls).app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.proxy_url = f"http://{self.host}:{site._server.sockets[0].getsockname()[1]}"

    def dead(self) -> str | None:
        for index, process in enumerate(self.processes):
            if not process.is_alive():
                url = self.server_urls[index] if index < len(self.server_urls) else "starting"
                return f"engine server {index} ({url}) exited with status {process.exitcode}"
        return None

    async def stop_router(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def stop_servers(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
                process.join()


def write_urls(path: str, proxy_url: str, server_urls: list[str]) -> None:
    """{proxy_url, server_urls} as JSON, written whole (a reader polling for it never sees half)."""
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps({"proxy_url": proxy_url, "server_urls": server_urls}, indent=2) + "\n")
    partial.replace(target)


async def _serve(deployment: Deployment, urls_file: str | None) -> None:
    await deployment.start_router()
    urls = ",".join(deployment.server_urls)
    print(
        f"hybrid.serve: {deployment.count} engine server(s) up\n"
        f"  proxy_url (data plane):      {deployment.proxy_url}\n"
        f"  server_urls (control plane): {deployment.server_urls}\n"
        f"  trainer: actor_rollout_ref.rollout.remote.proxy_url={deployment.proxy_url} "
        f"actor_rollout_ref.rollout.remote.server_urls=[{urls}]\n"
        "Ctrl-C or SIGTERM stops them.",
        flush=True,
    )
    if urls_file:
        write_urls(urls_file, deployment.proxy_url, deployment.server_urls)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        while not stop.is_set():
            why = deployment.dead()
            if why is not None:
                raise RuntimeError(f"{why}; stopping the deployment")
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                pass
    finally:
        await deployment.stop_router()


def main(argv: list[str] | None = None) -> None:
    # Before torch loads (vLLM's CPU backend drops to one thread unless this is set).
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    with exit_on_error():
        options, rest = parse_args(sys.argv[1:] if argv is None else argv)
        deployment = Deployment(serve_config(rest), options.host, options.port, options.server_port)
        try:
            deployment.start_servers()
            asyncio.run(_serve(deployment, options.urls_file))
        finally:
            deployment.stop_servers()


if __name__ == "__main__":
    main()
