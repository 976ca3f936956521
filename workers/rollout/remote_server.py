"""One rollout engine behind HTTP, in a process of its own: what `python -m hybrid.serve`
(hybrid/serve.py) starts N of, and a trainer with `actor_rollout_ref.rollout.remote.*` talks to
(workers/rollout/remote_engine.py). The routes and wire formats are in remote_protocol.py.

The engine is the one asynchronous training runs in a Ray actor: a `RolloutEngineWorker`
(workers/rollout_engine_worker.py), built from the `actor_rollout_ref` section serve was given.
Its generation, weight loads (pausing or aborting the requests in flight), simulated loads and
policy versions are that worker's; this module adds the HTTP routes, SkyRL's explicit
pause/resume, and the trainer's sampling settings (`/adopt_sampling`): the server samples as
the trainer's rollout section says, once the settings the engine was built with (engine, mode,
dtype, tensor parallelism, batch limits, multi-turn and agent settings, the longest sequence)
are found to match; sampling keys (temperature, top-p/k, n, penalties, stops, lengths that fit,
validation's) come from the trainer. A mismatch is a 409 naming the first key that differs.

Why aiohttp: as for the OpenAI endpoint (openai_server.py), it comes with vLLM, and its
handlers run on the loop the worker's coroutines need, with no second server life cycle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import traceback

from aiohttp import web

from workers.rollout.remote_protocol import MAX_BODY_BYTES, pack, unpack, weights_from_bytes

logger = logging.getLogger(__name__)

# The rollout keys the trainer's section decides per request: sampling, lengths (checked to fit
# the engine), and keys only the trainer reads. Every other key must match the server's own.
ADOPTED_KEYS = (
    "temperature",
    "top_k",
    "top_p",
    "do_sample",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "n",
    "calculate_log_probs",
    "val_kwargs",
    "prompt_length",
    "response_length",
    "max_model_len",
    "load_format",
    "gpu_memory_utilization",
    "cpu_kvcache_space_gb",
    "free_cache_engine",
    "log_prob_micro_batch_size",
    "log_prob_micro_batch_size_per_gpu",
    "log_prob_use_dynamic_bsz",
    "log_prob_max_token_len_per_gpu",
    "update_weights_bucket_megabytes",
    "layered_summon",
    "remote",
)


def sampling_mismatch(server_rollout, trainer_rollout) -> str | None:
    """Why the server cannot sample with the trainer's rollout section, or None: the first
    engine key that differs, or a longest sequence (prompt + response) the engine does not hold."""
    from workers.rollout.base import engine_max_model_len

    for field in dataclasses.fields(server_rollout):
        if field.name in ADOPTED_KEYS:
            continue
        ours, theirs = getattr(server_rollout, field.name), getattr(trainer_rollout, field.name)
        if ours != theirs:
            return (
                f"actor_rollout_ref.rollout.{field.name} is {theirs!r} for the trainer but {ours!r} for this server: "
                f"start hybrid.serve with the trainer's value"
            )
    need, have = engine_max_model_len(trainer_rollout), engine_max_model_len(server_rollout)
    if need > have:
        return (
            f"actor_rollout_ref.rollout.max_model_len: the trainer's prompt + response need {need} tokens but this "
            f"server's engine holds {have}: start hybrid.serve with max_model_len (or the lengths) >= {need}"
        )
    return None


class EngineServer:
    """The HTTP routes over one `RolloutEngineWorker`; `config`: the `actor_rollout_ref` section."""

    def __init__(self, config, engine_index: int = 0):
        from workers.rollout_engine_worker import RolloutEngineWorker

        self.config = config
        self.worker = RolloutEngineWorker(config, engine_index=engine_index)
        self.info: dict = {}
        self._open: asyncio.Event | None = None  # set while generation is not paused
        self._paused_driver = False
        self._in_flight = 0
        self._idle: asyncio.Condition | None = None

    def build(self) -> None:
        """The engine (minutes for a large model): before the server listens."""
        self.info = self.worker.init_engine()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/stats", self._stats)
        app.router.add_post("/pause", self._pause)
        app.router.add_post("/resume", self._resume)
        app.router.add_post("/update_weights", self._update_weights)
        app.router.add_post("/simulate_sync", self._simulate_sync)
        app.router.add_post("/adopt_sampling", self._adopt_sampling)
        app.router.add_post("/generate", self._generate)
        return app

    def _state(self) -> None:
        if self._open is None:  # made on the server's loop
            self._open, self._idle = asyncio.Event(), asyncio.Condition()
            self._open.set()

    # ------------------------------------------------------------------ routes
    async def _health(self, request: web.Request) -> web.Response:
        rollout = self.worker.config.rollout
        return web.json_response(
            {
                "status": "ok",
                "version": self.worker.version(),
                "tensor_parallel_size": int(rollout.tensor_model_parallel_size),
                "dtype": self.info.get("dtype"),
                "model": self.config.model.path,
                "engine": rollout.name,
                "mode": rollout.mode,
                "servers": 1,
            }
        )

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.worker.version()})

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.worker.stats())

    async def _pause(self, request: web.Request) -> web.Response:
        """New generations wait; those running finish (mode=sync, and mode=async with abort=false)
        or are aborted and sampled again after resume (mode=async, abort=true)."""
        self._state()
        body = await request.json() if request.can_read_body else {}
        if not self._open.is_set():
            return web.json_response({"paused": True})
        self._open.clear()
        if self.worker.driver is not None:
            await asyncio.to_thread(self.worker.driver.pause, bool(body.get("abort", False)))
            self._paused_driver = True
        else:
            async with self._idle:
                await self._idle.wait_for(lambda: self._in_flight == 0)
        return web.json_response({"paused": True})

    async def _resume(self, request: web.Request) -> web.Response:
        self._state()
        if self._paused_driver:
            self.worker.driver.resume()
            self._paused_driver = False
        self._open.set()
        return web.json_response({"paused": False})

    async def _update_weights(self, request: web.Request) -> web.Response:
        try:
            version = int(request.query["version"])
        except (KeyError, ValueError):
            return _error(400, "update_weights needs ?version=<int>")
        abort = request.query.get("abort", "0") == "1"
        weights = weights_from_bytes(await request.read())
        seconds = await self.worker.load_weights(version, weights, abort=abort)
        return web.json_response({"version": self.worker.version(), "seconds": seconds})

    async def _simulate_sync(self, request: web.Request) -> web.Response:
        body = await request.json()
        seconds = await self.worker.simulate_sync(
            int(body["version"]), float(body["seconds"]), abort=bool(body.get("abort", False))
        )
        return web.json_response({"version": self.worker.version(), "seconds": seconds})

    async def _adopt_sampling(self, request: web.Request) -> web.Response:
        trainer_rollout = unpack(await request.read())
        why = sampling_mismatch(self.worker.config.rollout, trainer_rollout)
        if why is not None:
            return _error(409, why)
        self.worker.config = dataclasses.replace(self.worker.config, rollout=trainer_rollout)
        self.worker.rollout.config = trainer_rollout
        return web.json_response({"adopted": True})

    async def _generate(self, request: web.Request) -> web.Response:
        self._state()
        prompts = unpack(await request.read())
        await self._open.wait()
        self._in_flight += 1
        try:
            output = await self.worker.generate(prompts)
        finally:
            self._in_flight -= 1
            async with self._idle:
                self._idle.notify_all()
        return web.Response(body=pack(output), content_type="application/octet-stream")


@web.middleware
async def _errors(request: web.Request, handler):
    """An exception in a route: a 500 with its one-line text (the trace goes to the log)."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as error:  # reported to the caller, never swallowed: the client raises it
        logger.error("%s %s failed:\n%s", request.method, request.path, traceback.format_exc())
        return _error(500, f"{type(error).__name__}: {error}")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def run_engine_server(config, engine_index: int, host: str, port: int, ready) -> None:
    """A child process's body: build the engine, listen on host:port (0: a free port), report
    ("ok", url) or ("error", one line) on the `ready` connection, serve until killed."""
    try:
        server = EngineServer(config, engine_index)
        server.build()
    except Exception as error:
        ready.send(("error", f"engine {engine_index}: {type(error).__name__}: {error}"))
        raise
    app = server.app()

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # port 0: the one the system chose
        ready.send(("ok", f"http://{host}:{bound}"))
        await asyncio.Event().wait()

    asyncio.run(main())
