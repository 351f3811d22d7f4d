"""A free TCP port on loopback, for servers a test starts in a process of their own."""

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
