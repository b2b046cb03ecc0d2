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
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from . import _case

#: ``0`` (or ``false``, ``no``, ``off``): every run of a crash test starts a new interpreter.
FORK_ENV = "REPLAYSAFE_CRASHTEST_FORK"
#: In ``env=`` of ``crashtest()``: runs of other groups (agents on other frameworks run from one entry point,
#: as the conformance kit's drivers are) fork from servers of their own.
GROUP_ENV = "REPLAYSAFE_CRASHTEST_GROUP"
#: Set for a run of ``run_python`` that starts as a new interpreter: the file it writes its installed modules to.
MODULES_ENV = "REPLAYSAFE_FORK_MODULES"
#: The servers one process keeps (two per agent module and group), the least recently used closed first.
_KEPT = 16
_MODULE = "replaysafe.testing._forkserver"
#: A learning run's command: ``-c``, not ``-m``, which would warn that the package imported this module first.
_LEARN = f"from {_MODULE} import main; main()"


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
                    gc.enable()
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
    """In the forked process: become the run the request describes (a session of its own, its input and output
    files, its environment and directory), then run what it names as ``python`` would."""
    os.setsid()  # its own process group: a timeout kills it and whatever it started
    _redirect(0, request.get("stdin", os.devnull), os.O_RDONLY)
    _redirect(1, request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    if "errors" in request:
        _redirect(2, request["errors"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    else:  # one output for both: one open file, so that neither overwrites what the other wrote
        os.dup2(1, 2)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    from .. import _config, _owners

    # What replaysafe read from the environment when the server imported it, read again from the run's.
    _config.reset()
    _owners._owner.machine = _owners._machine()
    _owners._owner.reset()

    kind, argv = request.get("kind", "crashtest"), list(request["argv"])
    if kind == "crashtest":
        from . import _crashtest_child

        sys.argv = [str(_crashtest_child.__file__), *argv]
        return _crashtest_child.main(argv)
    _run_as_main(kind, request["target"], argv, cwd=request["cwd"])
    return 0


def _redirect(fd: int, path: str, flags: int) -> None:
    opened = os.open(path, flags, 0o600)
    os.dup2(opened, fd)
    os.close(opened)


def _run_as_main(kind: str, target: str, argv: Sequence[str], *, cwd: str) -> None:
    """Run a script (``kind`` "path") or a module ("module") as ``python FILE ARGS`` or ``python -m MODULE ARGS``
    would: its ``sys.argv``, its first import path entry (the script's folder, or the working directory), and
    ``__name__ == "__main__"``. What it raises ends the process as it would end the interpreter."""
    if kind == "path":
        sys.argv = [target, *argv]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(os.path.abspath(target), run_name="__main__")  # __file__ absolute, as python makes it
    else:
        sys.argv = [target, *argv]  # runpy sets argv[0] to the module's file
        sys.path[0] = cwd
        with warnings.catch_warnings():
            # The module may be imported already (a server imports ahead): runpy warns, python -m would not.
            warnings.filterwarnings("ignore", r".* found in sys\.modules after import of package", RuntimeWarning)
            runpy.run_module(target, run_name="__main__", alter_sys=True)


def _learn(kind: str, target: str, argv: Sequence[str]) -> None:
    """A run that starts as a new interpreter (``python -c _LEARN run KIND TARGET ARG ...``) and, when it ends
    (not when it is killed), writes the installed modules it imported to the file ``MODULES_ENV`` names: what a
    server imports ahead of the next runs of the same target."""
    from ._crashtest_child import installed_modules

    report = os.environ.pop(MODULES_ENV)

    @atexit.register
    def _report() -> None:
        Path(report).write_text(json.dumps(installed_modules()), encoding="utf-8")

    _run_as_main(kind, target, argv, cwd=os.getcwd())


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        kind, target, *argv = sys.argv[2:]
        _learn(kind, target, argv)
        return
    preload = json.loads(sys.stdin.readline())
    # The runs share the objects of every module imported here, and a run's garbage collections walked them all
    # (most of a run's time) and wrote to their pages (copying them). Imported with collections off (fewer holes
    # left in those pages), collected once, then frozen: a run's collections see only the objects the run made.
    gc.disable()
    given = json.loads(os.environ.get(_case.SYS_PATH_ENV, "[]"))
    sys.path.extend(path for path in given if path not in sys.path)
    from . import _crashtest_child  # noqa: F401  # the run's own code, imported once too

    _preload(preload)
    gc.collect()  # what the imports left for the collector (finalizers, dead classes): gone before freezing
    gc.freeze()
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

    def run(self, request: Mapping[str, Any], timeout: float | None) -> int | None:
        """Fork one run (see ``_become_run`` for the request's fields) and wait for it: its exit code (negative:
        the signal that ended it), or ``None`` when it passed ``timeout`` and was killed with its process group."""
        with self._lock:
            self._count += 1
            run_id = str(self._count)
            pid_future: concurrent.futures.Future[int] = concurrent.futures.Future()
            code_future: concurrent.futures.Future[int] = concurrent.futures.Future()
            self._pids[run_id], self._codes[run_id] = pid_future, code_future
            self._requests.write((json.dumps({**request, "id": run_id}) + "\n").encode())
            self._requests.flush()
        try:
            pid = pid_future.result()
        finally:
            with self._lock:
                self._pids.pop(run_id, None)
        try:
            return code_future.result(timeout)
        except concurrent.futures.TimeoutError:
            try:
                os.killpg(pid, signal.SIGKILL)  # it and anything it started; the server reaps it
            except ProcessLookupError:  # not yet in a session of its own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
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


#: What each target run through ``run_python`` imported from installed code, learnt from its first run.
_learnt: dict[tuple[Any, ...], list[str]] = {}
#: How many runs of each target ``run_python`` has started: consecutive runs fork from two servers in turn.
_started: dict[tuple[Any, ...], int] = {}
#: Targets whose server could not fork (a preloaded module started a thread): each run is a new interpreter.
_unforkable: set[tuple[Any, ...]] = set()
#: What an interpreter reads as it starts, before any code of the run: a forked run would keep the server's.
_AT_START = ("PYTHON", "LC_", "LANG", "TZ")


def _at_start(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` an interpreter reads as it starts: a run forks only from a server started alike."""
    return {name: value for name, value in env.items() if name.startswith(_AT_START)}


def run_python(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,  # subprocess.run's name
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True, ...)``, started faster.

    ``argv`` is ``[SCRIPT, ARG ...]`` or ``["-m", MODULE, ARG ...]``. The first run of a script or module is a
    new interpreter that reports the installed modules it imported; the later ones fork from servers that
    imported those ahead: each a real process of its own (its session, environment, directory, input and
    output), killed for real by a SIGKILL. Consecutive runs fork from two servers in turn, so a run resumed
    after a crash has another hash seed than the run that crashed. Raises ``subprocess.TimeoutExpired`` as
    ``subprocess.run`` does (the run and its process group are killed).
    """
    kind, target, args = ("module", argv[1], list(argv[2:])) if argv[0] == "-m" else ("path", argv[0], list(argv[1:]))
    run_env = dict(os.environ if env is None else env)
    folder = os.fspath(cwd) if cwd is not None else os.getcwd()
    target_key = (sys.executable, folder, kind, target if kind == "module" else os.path.abspath(target))
    runs = _started[target_key] = _started.get(target_key, 0) + 1
    modules = _learnt.get(target_key)
    server = None
    at_start = _at_start(run_env)
    if modules is not None and target_key not in _unforkable and at_start == _at_start(os.environ):
        server_env = {name: value for name, value in os.environ.items() if name != MODULES_ENV}
        server = server_for((*target_key, runs % 2, *sorted(at_start.items())), modules, server_env, Path(folder))
        if server is None and enabled():
            _unforkable.add(target_key)  # its imports start a thread: no server will fork it
    with tempfile.TemporaryDirectory(prefix="replaysafe-run-") as scratch:
        stdin, stdout, stderr = (os.path.join(scratch, name) for name in ("stdin", "stdout", "stderr"))
        Path(stdin).write_text(input or "", encoding="utf-8")
        if server is None:
            report = os.path.join(scratch, "modules.json")
            learning = enabled()  # else the plain command: no server will use what it imports
            done = subprocess.run(
                [sys.executable, "-c", _LEARN, "run", kind, target, *args] if learning else [sys.executable, *argv],
                input=input,
                capture_output=True,
                text=True,
                env={**run_env, MODULES_ENV: report} if learning else run_env,
                cwd=folder,
                timeout=timeout,
                check=False,
            )
            if os.path.exists(report):
                _learnt[target_key] = json.loads(Path(report).read_text(encoding="utf-8"))
            return subprocess.CompletedProcess([sys.executable, *argv], done.returncode, done.stdout, done.stderr)
        request = {"kind": kind, "target": target, "argv": args, "env": run_env, "cwd": folder}
        code = server.run({**request, "stdin": stdin, "output": stdout, "errors": stderr}, timeout)
        out, err = (Path(path).read_text(encoding="utf-8", errors="replace") for path in (stdout, stderr))
    if code is None:
        raise subprocess.TimeoutExpired([sys.executable, *argv], timeout or 0, out, err)
    return subprocess.CompletedProcess([sys.executable, *argv], code, out, err)


@atexit.register
def close_all() -> None:
    with _servers_lock:
        while _servers:
            _servers.popitem()[1].close()


if __name__ == "__main__":
    main()
