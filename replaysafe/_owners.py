"""Owner tokens: who holds a claim (``machine:pid:process-start#n``), and whether that owner still runs.

The protocol never reads these itself: the drivers hand it the token of each call and
``owner_alive`` as the host's way to tell a dead owner from a live one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import os
import socket
from collections.abc import Callable


def _read_stat(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None when they cannot be read.

    None is not proof of death: with ``hidepid=2`` (or systemd's
    ``ProtectProc=invisible``) another user's live process has no readable entry.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _process_start(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (field 22), to tell a reused pid apart."""
    fields = _read_stat(pid)
    return fields[19].decode() if fields is not None and len(fields) > 19 else None


#: Names this host in owner tokens instead of the detected identity (see ``_machine``).
OWNER_MACHINE_ENV = "REPLAYSAFE_OWNER_MACHINE"


def _token_safe(text: str) -> str:
    # ':' and '#' separate a token's parts.
    return text.replace(":", "_").replace("#", "_")


def _machine() -> str:
    """This host as owner tokens name it: hostname, plus boot and pid namespace on Linux.

    Two containers may share a hostname, or one kernel with separate pid
    namespaces; a pid means something only within one boot and one namespace.
    ``REPLAYSAFE_OWNER_MACHINE`` overrides it, for hosts whose detected identity
    is not unique; processes with different values never check each other's pids
    (only the lease tells whether the other is alive). It must be unique to one
    boot and pid namespace: processes sharing a value judge each other's pids.
    """
    configured = os.environ.get(OWNER_MACHINE_ENV)
    if configured:
        return _token_safe(configured)
    parts = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            parts.append(boot.read().strip())
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass
    host = _token_safe(socket.gethostname())
    return f"{host}/{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:8]}" if parts else host


class _ProcessOwner:
    """``machine:pid:start``, recomputed after a fork, plus a counter for each claim."""

    def __init__(self) -> None:
        self.machine = _machine()
        self.reset()
        # A forked child is another process: it must not claim under its parent's pid.
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        pid = os.getpid()
        # Without a readable start time the token says so ("t..." is a wall-clock stamp,
        # never compared with /proc): a reused pid is then told apart by the lease alone.
        start = _process_start(pid) or f"t{int(dt.datetime.now(dt.timezone.utc).timestamp() * 1e6)}"
        self.pid = pid
        self.prefix = f"{self.machine}:{pid}:{start}#"
        self.counter = itertools.count(1)

    def token(self) -> str:
        """A token unique to one protected call: ``machine:pid:process-start#n``."""
        return f"{self.prefix}{next(self.counter)}"


_owner = _ProcessOwner()


def _pid_exists(pid: int) -> bool | None:
    """``False`` when no process has this pid, ``True`` when one does (it may be a reused
    pid), ``None`` when the system will not say."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # EPERM: it exists, and belongs to another user
    except OSError:
        return None
    return True


#: A token unique to one protected call: ``machine:pid:process-start#n``. The process's owner
#: method itself (one frame fewer per call): ``reset`` updates that object in a forked child.
owner_token: Callable[[], str] = _owner.token


def owner_alive(owner: str) -> bool | None:
    """Whether the process that holds ``owner`` still runs: ``None`` when this host cannot tell.

    Dead only on positive evidence: no process has the pid, or it is a zombie, or
    the pid now belongs to a process with another start time. Another machine, a
    token of another form, or a process this one may not look at (``/proc``
    mounted with ``hidepid``, a start time that cannot be read) gives ``None``:
    then the lease decides.
    """
    machine, _, rest = owner.partition(":")
    pid_text, _, start = rest.partition("#")[0].partition(":")
    if machine != _owner.machine or not pid_text.isdigit():
        return None
    pid = int(pid_text)
    exists = _pid_exists(pid)
    if exists is not True:
        return exists
    fields = _read_stat(pid)
    if fields is None or len(fields) <= 19 or not start.isdigit():
        return None  # it exists, but whether it is the owner or a reuse of its pid cannot be seen
    if fields[0] == b"Z":  # killed, not yet reaped
        return False
    return fields[19].decode() == start
