"""What the scripts that drive a studio through its API share."""

from __future__ import annotations

import socket
import time


def wait_for_port(port: int, seconds: float = 120) -> None:
    """Wait until `python -m app` listens on 127.0.0.1:`port`, or exit naming the port."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"The app did not open port {port} within {seconds:.0f} s.")
