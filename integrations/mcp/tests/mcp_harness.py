"""Starting, connecting to and killing the test server (``mcp_server.py``) over stdio and streamable HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

SERVER = Path(__file__).with_name("mcp_server.py")
WAIT = 60.0
Transport = Literal["stdio", "http"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_env(options: dict[str, Any] | None = None, *, keyed: bool = True, name: str = "payments") -> dict[str, str]:
    return {
        "REPLAYSAFE_TEST_OPTIONS": json.dumps(options or {}),
        "REPLAYSAFE_TEST_KEYED": "1" if keyed else "0",
        "REPLAYSAFE_TEST_NAME": name,
    }


def effects(control: Path) -> list[str]:
    path = control / "effects"
    return path.read_text().splitlines() if path.exists() else []


def kill_server(control: Path) -> None:
    """SIGKILL the server whose pid is in CONTROL/pid, and wait until it is gone."""
    pid = int((control / "pid").read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if _reaped_or_zombie(pid):
            return
        time.sleep(0.02)
    raise AssertionError(f"server {pid} survived SIGKILL")


def _reaped_or_zombie(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


async def wait_for_file(path: Path) -> None:
    with anyio.fail_after(WAIT):
        # Written by another process: there is no event to wait on.
        while not await anyio.Path(path).exists():  # noqa: ASYNC110
            await anyio.sleep(0.02)


class HttpServer:
    """The test server as its own process, serving streamable HTTP on a free port."""

    def __init__(self, control: Path, env: dict[str, str]) -> None:
        self.control = control
        self.env = env
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> HttpServer:
        (self.control / "pid").unlink(missing_ok=True)
        args = [sys.executable, str(SERVER), str(self.control), "http", str(self.port)]
        self.process = subprocess.Popen(args, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the server did not start listening")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(WAIT)
        assert self.process.returncode == -signal.SIGKILL

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT)


@asynccontextmanager
async def connect(
    transport: Transport, control: Path, env: dict[str, str], url: str | None = None
) -> AsyncIterator[Any]:
    """A client of the test server: a ``ClientSession`` over stdio (which starts the server), or an
    ``mcp.Client`` over streamable HTTP (to a server already started)."""
    if transport == "stdio":
        params = StdioServerParameters(
            command=sys.executable, args=[str(SERVER), str(control), "stdio"], env={**os.environ, **env}
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session
    else:
        assert url is not None
        async with Client(url) as client:
            yield client
