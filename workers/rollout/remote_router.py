"""The router in front of the engine servers of `python -m hybrid.serve`: SkyRL's proxy_url, the
data plane. It serves the engine servers' routes (remote_protocol.py) itself:

- `POST /generate` goes to the server with the fewest generation requests in flight (ties: the
  first), its answer comes back unchanged;
- the control routes (`/pause`, `/resume`, `/update_weights`, `/simulate_sync`,
  `/adopt_sampling`) go to every server at once, so a trainer given only the proxy URL still
  pushes its weights to all of them (SkyRL: "external_proxy_url only: the proxy serves both
  planes"); the first failing server's error comes back, naming it;
- `GET /health`, `/version` and `/stats` combine the servers': the oldest version, the summed
  busy seconds, and one tensor-parallel size (servers that disagree are reported as an error).
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from workers.rollout.remote_protocol import MAX_BODY_BYTES

CONTROL_ROUTES = ("/pause", "/resume", "/update_weights", "/simulate_sync", "/adopt_sampling")


def least_busy(in_flight: list[int]) -> int:
    """The index of the server with the fewest requests in flight (the first of equals)."""
    return min(range(len(in_flight)), key=lambda i: in_flight[i])


def combine_health(urls: list[str], answers: list[dict]) -> dict:
    """One health answer for the servers behind the router; ValueError when their tensor-parallel
    sizes differ (a trainer could not match them all)."""
    sizes = {a["tensor_parallel_size"] for a in answers}
    if len(sizes) != 1:
        detail = ", ".join(f"{u}: {a['tensor_parallel_size']}" for u, a in zip(urls, answers))
        raise ValueError(f"the servers behind the router differ in tensor_parallel_size ({detail})")
    first = answers[0]
    return {**first, "version": min(a["version"] for a in answers), "servers": len(answers)}


class Router:
    def __init__(self, server_urls: list[str]):
        if not server_urls:
            raise ValueError("Router needs at least one server URL")
        self.urls = [u.rstrip("/") for u in server_urls]
        self.in_flight = [0] * len(self.urls)
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/generate", self._generate)
        for route in CONTROL_ROUTES:
            app.router.add_post(route, self._fan_out)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/stats", self._stats)
        app.on_cleanup.append(self._close)
        return app

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on the router's loop
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def _close(self, app) -> None:
        if self._session is not None:
            await self._session.close()

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.read()
        index = least_busy(self.in_flight)
        self.in_flight[index] += 1
        try:
            async with self.session().post(f"{self.urls[index]}/generate", data=body) as answer:
                return web.Response(body=await answer.read(), status=answer.status, content_type=answer.content_type)
        finally:
            self.in_flight[index] -= 1

    async def _fan_out(self, request: web.Request) -> web.Response:
        body = await request.read()
        path = request.rel_url.path_qs

        async def one(url: str):
            async with self.session().post(f"{url}{path}", data=body) as answer:
                return answer.status, await answer.json()

        answers = await asyncio.gather(*(one(url) for url in self.urls))
        for url, (status, answer) in zip(self.urls, answers):
            if status != 200:
                return web.json_response({"error": f"server {url}: {answer.get('error', answer)}"}, status=status)
        return web.json_response({"servers": [answer for _, answer in answers]} | answers[0][1])

    async def _gather_get(self, route: str) -> list[dict]:
        async def one(url: str) -> dict:
            async with self.session().get(f"{url}{route}") as answer:
                answer.raise_for_status()
                return await answer.json()

        return list(await asyncio.gather(*(one(url) for url in self.urls)))

    async def _health(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(combine_health(self.urls, await self._gather_get("/health")))
        except (ValueError, aiohttp.ClientError) as error:
            return web.json_response({"error": str(error)}, status=502)

    async def _version(self, request: web.Request) -> web.Response:
        answers = await self._gather_get("/version")
        return web.json_response({"version": min(a["version"] for a in answers)})

    async def _stats(self, request: web.Request) -> web.Response:
        answers = await self._gather_get("/stats")
        return web.json_response(
            {
                "version": min(a["version"] for a in answers),
                "busy_s": sum(a["busy_s"] for a in answers),
                "servers": answers,
            }
        )


__all__ = ["CONTROL_ROUTES", "Router", "combine_health", "least_busy"]
