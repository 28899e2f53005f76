"""Ray for aha: joining or starting a cluster, placing actors, and waits that always end."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"
"""Where a local Ray instance (and its learners' collectives) listens: nothing leaves the machine."""


def reachable(address: str, timeout_s: float) -> None:
    """Raise ConnectionError naming `address` (host:port) when nothing accepts a connection there within
    `timeout_s`: ray.init itself would wait for it without end."""
    import socket
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" or a ray:// URL: Ray finds or reports it itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"ray_address={address!r}: no Ray cluster answers there ({e}); start one with "
                              "`ray start --head` or leave ray_address unset for a local one") from e


def connect(address: str | None, num_cpus: int, timeout_s: float = 60.0) -> bool:
    """Join the cluster at `address` ("auto" or host:port), or start a local Ray instance on 127.0.0.1 with at
    least `num_cpus` logical CPUs (so every actor fits; Ray's CPUs are slots, not cores). Returns whether
    this call started Ray (and so should shut it down). The local instance hands its workers this process's
    import path, so reward functions and engines defined in the user's modules unpickle there."""
    import ray
    if address is not None:
        reachable(address, timeout_s)
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")  # calls of dead workers that were re-issued
    if address is not None:
        local = address.split(":")[0] in (LOOPBACK, "localhost")  # a cluster on this machine's loopback
        with loopback_only() if local else contextlib.nullcontext():
            ray.init(address=address, log_to_driver=False)
        return False
    path = os.pathsep.join(p for p in sys.path if p)
    with loopback_only():
        ray.init(address="local", _node_ip_address=LOOPBACK, num_cpus=max(num_cpus, os.cpu_count() or 1),
                 include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path, "GLOO_SOCKET_IFNAME": "lo"}})
    return True


@contextlib.contextmanager
def loopback_only():
    """While a local Ray node starts: make Ray take 127.0.0.1 as the node's address, so its GCS, raylet and
    workers listen on loopback only. Ray does this itself on macOS and Windows
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0); on Linux it would pick the machine's outward address and listen
    there. The processes the node spawns read the variable, this one the constant it imported; both are
    restored afterwards, so a later connection to a real cluster is unaffected."""
    from ray._private import ray_constants
    saved = os.environ.get(CLUSTER_SWITCH), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[CLUSTER_SWITCH], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved[1]
        if saved[0] is None:
            os.environ.pop(CLUSTER_SWITCH, None)
        else:
            os.environ[CLUSTER_SWITCH] = saved[0]


def placement(num_bundles: int, strategy: str, timeout_s: float):
    """A placement group of one 1-CPU bundle per actor, spread over nodes by `strategy` (PACK, SPREAD, ...)."""
    import ray
    from ray.util.placement_group import placement_group
    group = placement_group([{"CPU": 1}] * num_bundles, strategy=strategy)
    if not group.wait(timeout_seconds=timeout_s):
        ray.util.remove_placement_group(group)
        raise TimeoutError(f"Ray could not place {num_bundles} one-CPU actors with strategy {strategy} within "
                           f"{timeout_s:.0f} s: the cluster has {ray.cluster_resources().get('CPU', 0):.0f} CPUs")
    return group


def actor(cls: type, group, bundle: int, restarts: int):
    """`cls` as a Ray actor class pinned to one bundle of `group`, restarted up to `restarts` times."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
    return ray.remote(cls).options(num_cpus=1, max_restarts=restarts, max_task_retries=0,
                                   scheduling_strategy=strategy)


def get(ref, timeout_s: float, what: str) -> Any:
    """ray.get with a deadline; past it, a TimeoutError that names the component."""
    import ray
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"{what} did not answer within {timeout_s:.0f} s (dist_timeout)") from None


def died(error: BaseException) -> bool:
    """Whether `error` (from ray.get) means the actor process died, not that its code raised."""
    import ray
    if isinstance(error, ray.exceptions.RayActorError):
        return True
    cause = getattr(error, "cause", None)
    return isinstance(error, ray.exceptions.RayTaskError) and isinstance(cause, ray.exceptions.RayActorError)


RESTART_POLL_S = 0.2
"""How often a restarting actor is asked whether it is back."""


def wait_alive(handle, timeout_s: float, what: str) -> None:
    """Block until a restarted actor answers again (calls made while Ray restarts it fail at once)."""
    import ray
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(handle.pid.remote(), timeout=max(0.0, deadline - time.monotonic()))
            return
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                break
            time.sleep(RESTART_POLL_S)
        except ray.exceptions.GetTimeoutError:
            break
        except ray.exceptions.ActorDiedError as e:
            raise RuntimeError(f"{what} died and Ray will not restart it (max_worker_restarts reached)") from e
    raise TimeoutError(f"{what} was not back within {timeout_s:.0f} s of dying (dist_timeout)")
