"""Stable digests of calls and arguments, idempotency keys and owner tokens."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import itertools
import os
import socket
import uuid
import zoneinfo
from collections.abc import Mapping
from typing import Any

from ._errors import ArgumentDigestError
from ._json import JSON_SCALARS, is_plain, json_encoder

# Canonical JSON: sorted keys, no whitespace, unicode kept as is. Equal data gives
# equal bytes in every process, whatever the hash seed. Call keys and idempotency
# keys are built with it: their values must never change, or stored records and
# keys handed to providers would no longer match.
_canonical = json_encoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=lambda o: _canonical_default(o)
)


def _canonical_default(obj: Any) -> Any:
    """Tag values JSON has no type for, so that ``"2026-01-01"`` and a date differ."""
    if isinstance(obj, dt.datetime):
        return ["$datetime", obj.isoformat()]
    if isinstance(obj, dt.date):
        return ["$date", obj.isoformat()]
    if isinstance(obj, dt.time):
        return ["$time", obj.isoformat()]
    if isinstance(obj, decimal.Decimal):
        return ["$decimal", str(obj)]
    if isinstance(obj, uuid.UUID):
        return ["$uuid", str(obj)]
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return ["$bytes", base64.b64encode(bytes(obj)).decode("ascii")]
    if isinstance(obj, (set, frozenset)):
        return ["$set", sorted(_canonical(item) for item in obj)]
    if isinstance(obj, enum.Enum):
        return ["$enum", type(obj).__qualname__, obj.value]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return ["$dataclass", type(obj).__qualname__, fields]
    model_dump = getattr(obj, "model_dump", None)
    if callable(model_dump):  # a pydantic model
        return ["$model", type(obj).__qualname__, model_dump(mode="json")]
    raise TypeError(type(obj).__qualname__)


# --- argument digests: an injective canonical form -----------------------------------
#
# Two argument mappings digest alike exactly when they are equal as typed data. Plain
# JSON data of exact types (the common case) is sorted-key JSON, which is injective
# on that domain (and the same text as before this form existed, so those digests did
# not change). Anything else is a tree in which every JSON array is a tagged node
# (["list", ...], ["date", "2026-01-01"], ...) and every JSON object a dict with
# ``str`` keys, behind a prefix no JSON object starts with: the two forms cannot meet.

_TAGGED_FORM = "~"


def _unexpected(obj: Any) -> Any:
    raise TypeError(f"{type(obj).__module__}.{type(obj).__qualname__}")


_sorted_json = json_encoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_unexpected)


def _args_text(arguments: Mapping[str, Any]) -> str:
    """The canonical text of an argument mapping: equal texts exactly for equal typed data."""
    if type(arguments) is dict and is_plain(arguments):
        return _sorted_json(arguments)  # starts with "{"
    return _TAGGED_FORM + _sorted_json(_canonical_tree(dict(arguments)))


def _sorted_nodes(items: Any) -> list[Any]:
    """Nodes in the order of their canonical text: a deterministic order for sets and mixed keys."""
    return [node for _, node in sorted((_sorted_json(node), node) for node in items)]


def _type_path(obj: Any) -> list[str]:
    return [type(obj).__module__, type(obj).__qualname__]


def _canonical_tree(value: Any) -> Any:
    """``value`` as JSON data in which every array is a tagged node: an injective image."""
    kind = type(value)
    if kind in JSON_SCALARS:
        return value
    if kind is dict:
        if all(type(key) is str for key in value):
            return {key: _canonical_tree(item) for key, item in value.items()}
        pairs = [[_canonical_tree(key), _canonical_tree(item)] for key, item in value.items()]
        return ["dict", *_sorted_nodes(pairs)]
    if kind is list or kind is tuple:
        return [kind.__name__, *(_canonical_tree(item) for item in value)]
    if kind is set or kind is frozenset:
        return [kind.__name__, *_sorted_nodes(_canonical_tree(item) for item in value)]
    if kind is bytes or kind is bytearray or kind is memoryview:
        return [kind.__name__, bytes(value).hex()]
    if kind is dt.datetime or kind is dt.time:
        naive = value.replace(tzinfo=None, fold=0).isoformat()
        return [kind.__name__, naive, value.fold, _zone_node(value)]
    if kind is dt.date:
        return ["date", value.isoformat()]
    if kind is dt.timedelta:
        return ["timedelta", value.days, value.seconds, value.microseconds]
    if kind is decimal.Decimal:
        return ["decimal", str(value)]  # the exact digits and exponent: 1.0 and 1.00 are different data
    if kind is uuid.UUID:
        return ["uuid", value.hex]
    return _class_node(value)


def _zone_node(value: dt.datetime | dt.time) -> Any:
    zone = value.tzinfo
    if zone is None:
        return None
    if type(zone) is dt.timezone:
        return ["offset", zone.utcoffset(None) // _MICROSECOND, zone.tzname(None)]
    key = getattr(zone, "key", None)
    if type(zone) is zoneinfo.ZoneInfo and key is not None:
        return ["zone", key]
    # Another kind of zone: what it says about this moment, which is all that is portable.
    probe = value if isinstance(value, dt.datetime) else None
    offset = zone.utcoffset(probe)
    micros = None if offset is None else offset // _MICROSECOND
    return ["tzinfo", *_type_path(zone), micros, zone.tzname(probe)]


_MICROSECOND = dt.timedelta(microseconds=1)


def _class_node(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        if isinstance(value, enum.Flag):  # a combination of flags may have no name
            return ["flag", *_type_path(value), _canonical_tree(value._value_)]
        return ["enum", *_type_path(value), value._name_]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
        return ["dataclass", *_type_path(value), _canonical_tree(fields)]
    if callable(getattr(value, "model_dump", None)) and not isinstance(value, type):  # a pydantic model
        # Its fields and extra fields as they are: model_dump would turn a dataclass in an Any field into a dict.
        return ["model", *_type_path(value), _canonical_tree(dict(value))]
    for base in _BUILTIN_BASES:
        if isinstance(value, base):  # a subclass of a builtin (a named tuple, an OrderedDict...): its type and data
            return ["instance", *_type_path(value), _canonical_tree(_BUILTIN_BASES[base](value))]
    raise TypeError(f"{type(value).__module__}.{type(value).__qualname__}")


# The exact builtin value of an instance of a subclass, read without its overrides.
_BUILTIN_BASES: dict[type, Any] = {
    bool: bool,
    int: int.__int__,
    float: float.__float__,
    str: str.__str__,
    bytes: bytes,
    dict: dict,
    list: list,
    tuple: tuple,
    set: set,
    frozenset: frozenset,
}


def _sha256(text: str) -> str:
    # surrogatepass: a lone surrogate in an id or argument must digest, not crash.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def args_digest(arguments: Mapping[str, Any], *, tool_name: str) -> str:
    """The digest of a call's arguments, bound by name; stable across processes."""
    try:
        return _sha256(_args_text(arguments))
    except (TypeError, ValueError, RecursionError) as exc:
        name = _offending_argument(arguments)
        raise ArgumentDigestError(
            f"cannot digest argument {name!r} of {tool_name} ({exc}): it is not data. "
            f"Leave it out of the digest with @replay_safe(exclude_args=({name!r},)).",
            tool_name=tool_name,
        ) from exc


def _offending_argument(arguments: Mapping[str, Any]) -> str:
    for name, value in arguments.items():
        try:
            _sorted_json(_canonical_tree(value))
        except (TypeError, ValueError, RecursionError):
            return name
    return "?"  # pragma: no cover - only reached when the mapping itself cannot encode


def key_digest(thread_id: str, message_id: str, tool_call_id: str) -> str:
    """One fixed-size key for three ids of any length (a btree cannot hold 3 x 64 KB)."""
    return _sha256(_canonical([thread_id, message_id, tool_call_id]))


def idempotency_key(*parts: Any, namespace: str | None = None) -> str:
    """A deterministic key to hand to a payment or email provider.

    Built from stable inputs such as an order id, never from a random value or a
    clock: the same parts give the same key in every process. It is ``rs-`` and 40
    lowercase hex digits, which fits Stripe's 255-character limit and the
    alphabets email APIs accept.
    """
    if not parts:
        raise ValueError("idempotency_key() needs at least one part, such as an order id")
    try:
        text = _canonical([namespace, list(parts)])
    except (TypeError, ValueError) as exc:
        raise ArgumentDigestError(f"idempotency_key() parts must be data (str, int, UUID, ...); got {exc}") from exc
    return "rs-" + _sha256(text)[:40]


def call_idempotency_key(thread_id: str, message_id: str, tool_call_id: str, tool_name: str) -> str:
    """The key ``current_call().idempotency_key`` gives: the same on every attempt and replay."""
    return idempotency_key(thread_id, message_id, tool_call_id, tool_name, namespace="replaysafe.call")


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
    return f"{host}/{_sha256('|'.join(parts))[:8]}" if parts else host


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


def owner_token() -> str:
    """A token unique to one protected call: ``machine:pid:process-start#n``."""
    return _owner.token()


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
