"""Ranks as Ray actors (``distributed_executor_backend="ray"``), for a Ray cluster of one or more machines.

Ray only places and starts the ranks: a placement group with one bundle per rank (a GPU each on GPUs), packed
so that ranks share a machine where they fit, and one actor per bundle that runs the ordinary worker
(``worker_process.worker_main``). Each actor connects back to the engine like another node's rank does
(``nodes.py``), so steps, results and failures travel the same way as with ``--nnodes``."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys

from brisk.executor.worker_process import WorkerSpec, worker_main


class RankActor:
    """One rank's process in the Ray cluster."""

    def address(self) -> tuple[str, int]:
        """This machine's address and a free port on it (rank 0's: torch.distributed's rendezvous)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def run(self, spec: WorkerSpec) -> None:
        worker_main(spec, None, None)  # until the engine shuts it down or goes away


class RayRanks:
    def __init__(self, world_size: int, device_type: str, timeout_s: float):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():  # RAY_ADDRESS, or a cluster started on this machine, or a new local one
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
        gpu = device_type == "cuda"
        bundle = {"GPU": 1, "CPU": 1} if gpu else {"CPU": 1}
        self.placement_group = placement_group([bundle] * world_size, strategy="PACK")
        ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(self.placement_group)
            raise TimeoutError(
                f"the Ray cluster could not place {world_size} ranks of {bundle} within {timeout_s:.0f} s "
                f"(its resources: {ray.cluster_resources()}); add nodes or lower the parallel sizes"
            )
        actor_class = ray.remote(num_cpus=1, num_gpus=1 if gpu else 0)(RankActor)

        def in_bundle(i: int):
            return PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=i)

        self.actors = [actor_class.options(scheduling_strategy=in_bundle(i)).remote() for i in range(world_size)]
        host, port = ray.get(self.actors[0].address.remote(), timeout=timeout_s)
        self.rendezvous = f"tcp://{host}:{port}"
        self.driver_ip = ray.util.get_node_ip_address()
        self._runs = []

    def start(self, spec: WorkerSpec, driver_address: tuple[str, int]) -> None:
        """Every actor becomes its rank (one GPU each: Ray shows it to the actor as device 0)."""
        _pickle_remote_code_by_value()
        for rank, actor in enumerate(self.actors):
            rank_spec = dataclasses.replace(spec, rank=rank, local_rank=0, watch_parent=False)
            rank_spec.init_method, rank_spec.driver_address = self.rendezvous, driver_address
            self._runs.append(actor.run.remote(rank_spec))

    def check_started(self) -> None:
        """Raise when a rank has already ended: a rank runs until shutdown, so one that ended while the engine
        waits for the ranks to connect failed to start (its arguments did not unpickle, its process died)."""
        import ray

        ended, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=0)
        for rank, run in enumerate(self._runs):
            if run in ended:
                try:
                    ray.get(run)
                except Exception as exc:  # the rank's own error, with its traceback's last line
                    lines = str(exc).strip().splitlines()
                    raise RuntimeError(f"Ray rank {rank} failed to start: {lines[-1] if lines else exc!r}") from None
                raise RuntimeError(f"Ray rank {rank} ended before it connected to the engine")

    def stop(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        ray.util.remove_placement_group(self.placement_group)


def _pickle_remote_code_by_value() -> None:
    """Send the classes of a model folder's own Python (``trust_remote_code``: transformers imports them as
    ``transformers_modules.*`` from a cache of this machine) to the ranks by value: the ranks' processes, on
    other machines too, cannot import them, so unpickling the model config failed there."""
    from ray import cloudpickle

    for name, module in list(sys.modules.items()):  # transformers registers the leaf modules alone
        if name.startswith("transformers_modules.") and module is not None:
            cloudpickle.register_pickle_by_value(module)
