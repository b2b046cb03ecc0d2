"""Start crash-test runs by forking one process that has already imported the agent's libraries.

A run of ``replaysafe crashtest`` is a fresh process, and most of its cost is importing the agent's
framework (seconds, where the run itself takes milliseconds). The discovery run lists the modules it
imported from the standard library and installed packages; a server process imports those once, and each
later run is forked from it: a real process of its own, in a session of its own, with the run's
environment, directory and output, SIGKILLed for real at its point and resumed by another such process.
Only the import of installed code is shared; the agent's own modules, its state and its ledger are not
(nothing of the agent runs in the server).

The crashed runs and the resumes fork from two servers, so that a resume has another hash seed than
the run it follows, as after a real crash. A server serves one ``crashtest`` process: JSON lines on its
stdin ask for runs; JSON lines on its stdout answer with each run's pid, then with its exit code once the
server has reaped it. A server that cannot fork safely (a preloaded module started a thread) says so and
is not used. ``REPLAYSAFE_CRASHTEST_FORK=0`` turns the servers off: every run is then a new interpreter.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from . import _case

#: ``0`` (or ``false``, ``no``, ``off``): every run of a crash test starts a new interpreter.
FORK_ENV = "REPLAYSAFE_CRASHTEST_FORK"
#: In ``env=`` of ``crashtest()``: runs of other groups (agents on other frameworks run from one entry point,
#: as the conformance kit's drivers are) fork from servers of their own.
GROUP_ENV = "REPLAYSAFE_CRASHTEST_GROUP"
#: The servers one process keeps (two per agent module and group), the least recently used closed first.
_KEPT = 8
_MODULE = "replaysafe.testing._forkserver"


def enabled() -> bool:
    return (
        hasattr(os, "fork")
        and sys.platform != "darwin"  # macOS system frameworks are not safe to use after fork
        and os.environ.get(FORK_ENV, "").strip().lower() not in ("0", "false", "no", "off")
    )


# --- the server's side ---------------------------------------------------------------------------------


def _preload(names: Iterable[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException:  # a module that imports only in its own context: the run imports it
            continue


def _serve(replies: int) -> dict[str, Any] | None:
    """Fork a run for each request on stdin until it closes; reap the runs and report their exit codes.
    Returns ``None`` in the server (its stdin closed) and the run's request in each forked run."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that a child's end writes the wakeup fd
    previous_wakeup = signal.set_wakeup_fd(wake_write)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "requests")
    selector.register(wake_read, selectors.EVENT_READ, "children")
    running: dict[int, str] = {}
    pending = b""
    open_input = True

    def answer(**fields: Any) -> None:
        os.write(replies, (json.dumps(fields) + "\n").encode())

    while open_input or running:
        for selected, _ in selector.select():
            if selected.data == "children":
                os.read(wake_read, 4096)
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                open_input = False
                selector.unregister(0)
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:  # the run: leave the server's loop with everything it set up undone
                    signal.set_wakeup_fd(previous_wakeup)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for fd in (wake_read, wake_write, replies):
                        os.close(fd)
                    return request  # type: ignore[no-any-return]
                running[pid] = request["id"]
                answer(id=request["id"], pid=pid)
        while running:  # every run that has ended (a SIGCHLD may stand for several)
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            answer(id=running.pop(pid), code=os.waitstatus_to_exitcode(status))
    return None


def _become_run(request: Mapping[str, Any]) -> int:
    """In the forked process: become the run the request describes (a session of its own, its output file,
    its environment and directory), then run the crash-test child as ``python -m`` would."""
    os.setsid()  # its own process group: a timeout kills it and whatever it started
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    output = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    from .. import _config, _owners
    from . import _crashtest_child

    # What replaysafe read from the environment when the server imported it, read again from the run's.
    _config.reset()
    _owners._owner.machine = _owners._machine()
    _owners._owner.reset()

    sys.argv = [str(_crashtest_child.__file__), *request["argv"]]
    return _crashtest_child.main(list(request["argv"]))


def main() -> None:
    preload = json.loads(sys.stdin.readline())
    given = json.loads(os.environ.get(_case.SYS_PATH_ENV, "[]"))
    sys.path.extend(path for path in given if path not in sys.path)
    from . import _crashtest_child  # noqa: F401  # the run's own code, imported once too

    _preload(preload)
    # Forking a process that runs threads copies their locks mid-use: such a server is not used.
    forks = threading.active_count() == 1
    sys.stdout.flush()
    replies = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # what the preloaded modules or the runs print never mixes with the answers
    os.close(null)
    os.write(replies, (json.dumps({"ready": True, "fork": forks}) + "\n").encode())
    if not forks:
        return
    request = _serve(replies)
    if request is not None:
        sys.exit(_become_run(request))


# --- the crash test's side ---------------------------------------------------------------------------------


class ForkServer:
    """A server process that forks the runs of one agent, started with the modules to import ahead."""

    def __init__(self, preload: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", _MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the crash test, which closes it
        )
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._requests: IO[bytes] = self._process.stdin
        self._answers: IO[bytes] = self._process.stdout
        self._lock = threading.Lock()
        self._pids: dict[str, concurrent.futures.Future[int]] = {}
        self._codes: dict[str, concurrent.futures.Future[int]] = {}
        self._count = 0
        self.preload = list(preload)
        self.usable = False
        try:
            self._requests.write((json.dumps(list(preload)) + "\n").encode())
            self._requests.flush()
            ready = json.loads(self._answers.readline() or b"{}")
        except (OSError, ValueError):
            ready = {}
        self.usable = bool(ready.get("fork"))
        if not self.usable:
            self.close()
            return
        threading.Thread(target=self._read_answers, name="replaysafe-crashtest-forkserver", daemon=True).start()

    def _read_answers(self) -> None:
        for line in self._answers:
            answer = json.loads(line)
            with self._lock:
                if "pid" in answer:
                    self._pids[answer["id"]].set_result(answer["pid"])
                else:
                    self._codes.pop(answer["id"]).set_result(answer["code"])
        with self._lock:  # the server is gone: no run it started will be reported
            self.usable = False
            for future in [*self._pids.values(), *self._codes.values()]:
                if not future.done():
                    future.set_exception(OSError("the crash test's fork server ended"))

    def run(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, output: Path, timeout: float) -> int | None:
        """Fork one run and wait for it: its exit code (negative: the signal that ended it), or ``None`` when
        it passed ``timeout`` and was killed with its process group."""
        with self._lock:
            self._count += 1
            run_id = str(self._count)
            pid_future: concurrent.futures.Future[int] = concurrent.futures.Future()
            code_future: concurrent.futures.Future[int] = concurrent.futures.Future()
            self._pids[run_id], self._codes[run_id] = pid_future, code_future
            request = {"id": run_id, "argv": list(argv), "env": dict(env), "cwd": str(cwd), "output": str(output)}
            self._requests.write((json.dumps(request) + "\n").encode())
            self._requests.flush()
        try:
            pid = pid_future.result()
        finally:
            with self._lock:
                self._pids.pop(run_id, None)
        try:
            return code_future.result(timeout)
        except concurrent.futures.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # it and anything it started; the server reaps it
            code_future.result()
            return None

    def close(self) -> None:
        self.usable = False
        with contextlib.suppress(OSError):
            self._requests.close()  # the server ends once its runs have
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._answers.close()


_servers: dict[tuple[Any, ...], ForkServer] = {}
_servers_lock = threading.Lock()
#: A discovery run that imported this many installed modules more than its server holds gets a new server
#: holding both (an agent on another framework); a few modules imported late are not worth one.
_GROWTH = 50


def server_for(
    key: tuple[Any, ...], modules: Sequence[str] | None, env: Mapping[str, str], cwd: Path
) -> ForkServer | None:
    """The server kept for ``key``, started (or restarted, holding more) to import ``modules`` when they are
    given: the installed modules a discovery run imported. ``None``: no server (turned off, or unsafe)."""
    if not enabled():
        return None
    with _servers_lock:
        server = _servers.pop(key, None)
        if server is not None and not server.usable:
            server = None
        if modules is not None:
            held = set(server.preload) if server is not None else set()
            more = [name for name in modules if name not in held]
            if server is None or len(more) > _GROWTH:
                if server is not None:
                    server.close()
                    more = [*server.preload, *more]
                server = ForkServer(more, env, cwd)
                if not server.usable:
                    return None
        if server is not None:
            _servers[key] = server  # the most recently used
            while len(_servers) > _KEPT:
                _servers.pop(next(iter(_servers))).close()
        return server


@atexit.register
def close_all() -> None:
    with _servers_lock:
        while _servers:
            _servers.popitem()[1].close()


if __name__ == "__main__":
    main()
