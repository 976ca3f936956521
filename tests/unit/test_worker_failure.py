"""How a dead Ray worker is described (hybrid/controller/ray_worker_group.py): Ray's
many-line report of a dead actor becomes one line naming the cause, and the group's
message names the rank, the node and that cause. The reports are Ray 2.60's own text, as
captured from a SIGKILLed worker, a removed node and `ray.kill`."""

from __future__ import annotations

import pytest

from hybrid.controller.ray_worker_group import RayWorkerGroup, death_cause

HEAD = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: A\n"
    "\tactor_id: 4a5be47afacecd4b0dd9b66101000000\n"
    "\tpid: 12024\n\tnamespace: 8d37b408-c2b7-492c-a4af-dc8a384b9c51\n\tip: 192.0.2.2\n"
)
SIGKILLED = HEAD + (
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker "
    "unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the process was "
    "killed by the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the worker crashed "
    "unexpectedly due to SIGSEGV or another unexpected error."
)
NODE_DIED = HEAD + (
    "The actor died because its node has died. Node Id: 4b9746c9c1399396ecd509cec79a69e48cf367d88606905de4c4d6e0\n"
    "\tthe actor's node was terminated expectedly: received SIGTERM"
)
RAY_KILL = HEAD + "The actor is dead because it was killed by `ray.kill`."
OOM = HEAD + (
    "The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY Worker exit detail: "
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: 4b9746c9) "
    "was 22.10GB used / 23.00GB limit (0.960870)"
)
USER_EXIT = HEAD + (
    "The actor is dead because its worker process has died. Worker exit type: INTENDED_USER_EXIT Worker exit detail: "
    "Worker exits by an user request. exit_actor() is called."
)


@pytest.mark.parametrize(
    "report, cause",
    [
        (
            SIGKILLED,
            "its process ended without warning: killed by a signal (SIGKILL, the kernel's out-of-memory killer) "
            "or crashed; Ray saw only its connection close",
        ),
        (NODE_DIED, "its node 4b9746c9 died (terminated expectedly: received SIGTERM)"),
        (RAY_KILL, "it was killed with ray.kill"),
        (OOM, "out of memory: Ray's memory monitor killed it (memory on the node was 22.10GB used / 23.00GB limit)"),
        (USER_EXIT, "its process exited (intended user exit: Worker exits by an user request.)"),
        (
            HEAD + "The actor is dead because its owner has died. Owner Id: 01000000",
            "its owner (the driver process) died",
        ),
        (
            "The actor 4a5b is unavailable: The actor is temporarily unavailable: RpcError. The task may or may not "
            "have been executed on the actor.",
            "it became unreachable (The actor is temporarily unavailable: RpcError)",
        ),
        ("something new\nthat Ray may say one day", "that Ray may say one day"),
    ],
    ids=["sigkill", "node", "ray.kill", "oom", "user-exit", "owner", "unavailable", "unknown"],
)
def test_death_cause_is_one_line(report, cause):
    assert death_cause(report) == cause
    assert "\n" not in death_cause(report)


class _Group(RayWorkerGroup):
    def __init__(self, placement):  # no Ray: only what the message needs
        self.name, self.placement = "actor_rollout", placement

        class ActorRolloutRefWorker:
            pass

        self.worker_cls = ActorRolloutRefWorker


def _died(report: str):
    from ray.exceptions import RayActorError

    return RayActorError(actor_id=None, error_msg=report)


def test_message_names_rank_node_and_cause_in_one_line():
    group = _Group([None, {"pid": 4242, "node_ip": "10.0.0.7", "node_id": "6fab353e0837", "hostname": "h"}])
    message = str(group._failure(1, "update_actor", _died(SIGKILLED)))
    assert message.startswith(
        "worker group 'actor_rollout': rank 1 (ActorRolloutRefWorker) died in update_actor() on node 10.0.0.7 "
        "(id 6fab353e, pid 4242): its process ended without warning"
    )
    assert "\n" not in message and "HYBRID_DEBUG=1" in message


def test_a_rank_that_died_while_starting_is_placed_from_rays_report():
    message = str(_Group([None, None])._failure(0, "process_info", _died(NODE_DIED)))
    assert "rank 0 (ActorRolloutRefWorker) died in process_info() on node 192.0.2.2: its node 4b9746c9 died" in message


def test_rays_own_death_paragraph_is_recognised_for_our_ranks_only(monkeypatch):
    from hybrid.controller import ray_worker_group as module

    line = (
        "A worker died or was killed while executing a task by an unexpected system error. Lease ID: 01 Worker ID: 77 "
        "Node ID: 38 Worker IP address: 192.0.2.2 Worker port: 45181 Worker PID: 22855 Worker exit type: SYSTEM_ERROR"
    )
    monkeypatch.setattr(module, "_OWN_WORKER_PIDS", {22855})
    assert module.is_own_death_report(line)
    assert not module.is_own_death_report(line.replace("22855", "22856"))  # another driver's worker: Ray says it
    assert not module.is_own_death_report("Worker PID: 22855")


def test_one_line_for_the_user_and_rays_whole_report_under_debug():
    from hybrid.errors import format_error

    group = _Group([{"pid": 4242, "node_ip": "10.0.0.7", "node_id": "6fab353e0837", "hostname": "h"}])
    died = _died(SIGKILLED)
    exc = group._failure(0, "update_actor", died)
    exc.__cause__ = died  # as `_execute` raises it: `raise ... from err`
    plain, debug = format_error(exc), format_error(exc, debug=True)
    assert plain.startswith("hybrid: worker group 'actor_rollout': rank 0") and plain.count("\n") == 1
    assert "Worker exit detail: Worker unexpectedly exits with a connection error code 2" in debug
