"""Ranks on several machines, launched torchrun-style (``--nnodes/--node-rank/--master-addr/--master-port``).

Node 0 runs the engine and its share of the ranks (``MultiprocExecutor``); every other node runs
``run_worker_node``, which starts that node's ranks and waits for them. torch.distributed joins all ranks at
``master_addr:master_port``; the engine's commands reach the other nodes' ranks over one authenticated connection
each, to ``master_addr:master_port + 1``. Commands are pickles, so that port must only be reachable from the
cluster; set the same ``BRISK_NODE_AUTHKEY`` on every node. A node that does not arrive within the timeout is an
error naming its ranks, on both sides."""

from __future__ import annotations

import os
import pickle
import socket
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

DEFAULT_MASTER_PORT = 29500  # torchrun's


def node_authkey() -> bytes:
    return os.environ.get("BRISK_NODE_AUTHKEY", "brisk-node").encode()


def local_ranks(world_size: int, nnodes: int, node_rank: int) -> range:
    per_node = world_size // nnodes
    return range(node_rank * per_node, (node_rank + 1) * per_node)


def accept_remote_workers(
    addr: str, port: int, ranks: list[int], timeout_s: float, check: Callable[[], None] | None = None
) -> dict[int, Connection]:
    """Node 0: wait for one connection from each of the other nodes' ranks (each says which rank it is).
    ``check`` runs about once a second while waiting and raises when a rank is known to have failed already (a
    Ray actor whose start raised), so that start-up fails then rather than at the timeout."""
    conns: dict[int, Connection] = {}
    deadline = time.monotonic() + timeout_s
    with socket.create_server((addr, port)) as server:
        while len(conns) < len(ranks):
            remaining = deadline - time.monotonic()
            server.settimeout(max(min(remaining, 1.0) if check is not None else remaining, 0.001))
            try:
                sock, _ = server.accept()
            except TimeoutError:
                if check is not None:
                    check()
                    if deadline > time.monotonic():
                        continue
                missing = ", ".join(str(r) for r in ranks if r not in conns)
                raise TimeoutError(
                    f"worker ranks {missing} did not connect to {addr}:{port} within {timeout_s:.0f} s: start "
                    "brisk with the same model and parallel sizes and --node-rank N on the other nodes, and check "
                    "--master-addr, --master-port (and the next port) and BRISK_NODE_AUTHKEY"
                ) from None
            sock.settimeout(None)
            conn = Connection(sock.detach())
            try:
                deliver_challenge(conn, node_authkey())
                answer_challenge(conn, node_authkey())
                kind, rank = pickle.loads(conn.recv_bytes())
            except (OSError, EOFError, ValueError, pickle.UnpicklingError):
                conn.close()  # not one of ours (or a wrong key): keep waiting for the real ones
                continue
            if kind != "hello" or rank not in ranks or rank in conns:
                conn.close()
                continue
            conns[rank] = conn
    return conns


def connect_to_driver(addr: str, port: int, rank: int, timeout_s: float) -> Connection:
    """Another node's rank: connect to node 0 (retrying while it starts) and say which rank this is."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank {rank}: node 0 at {addr}:{port} did not answer within {timeout_s:.0f} s"
                ) from None
            time.sleep(0.5)
    sock.settimeout(None)
    conn = Connection(sock.detach())
    answer_challenge(conn, node_authkey())
    deliver_challenge(conn, node_authkey())
    conn.send_bytes(pickle.dumps(("hello", rank)))
    return conn
