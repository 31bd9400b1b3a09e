"""Loopback ports: find a free one, or explain who holds a taken one."""

from __future__ import annotations

import socket

import psutil

from dojo.services.errors import ServiceError

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def holder_of(port: int) -> str:
    """A human description of the process listening on `port`, if we can see it."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    try:
                        proc = psutil.Process(conn.pid)
                        return f"{proc.name()} (pid {conn.pid})"
                    except psutil.Error:
                        return f"pid {conn.pid}"
                return "another process"
    except psutil.Error:
        pass
    return "another process"


def require_free(port: int, what: str, env_var: str) -> None:
    """Raise a ServiceError naming the holder and the fix when `port` is taken."""
    if not is_free(port):
        raise ServiceError(
            f"Port {port} on {HOST}, asked for {what}, is already in use by {holder_of(port)}. "
            f"Fix: stop that process, or pick another port with {env_var}=<port> "
            f"(or unset {env_var} to let dojo choose a free one)."
        )


def choose_port(env_value: str | None, recorded: int | None, what: str, env_var: str) -> int:
    """The port to start on: the one the user asked for, else the recorded one if free, else any."""
    if env_value:
        try:
            port = int(env_value)
        except ValueError as exc:
            raise ServiceError(f"{env_var}={env_value!r} is not a port number.") from exc
        require_free(port, what, env_var)
        return port
    if recorded and is_free(recorded):
        return recorded
    return free_port()
