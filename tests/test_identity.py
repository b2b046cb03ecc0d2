"""Argument digests, idempotency keys and owner tokens."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaysafe import ArgumentDigestError, JsonSerializer, _identity, _owners, idempotency_key, replay_safe
from replaysafe._identity import SignatureDigest, args_digest, call_idempotency_key, key_digest
from replaysafe._json import is_plain
from replaysafe._owners import owner_alive, owner_token

from . import result_domain
from .ids import stable_repr
from .result_domain import TAG, shape

# JSON-like data with string keys: the domain the digest promises to be exact on.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.datetimes(timezones=st.just(dt.timezone.utc)),
    st.decimals(allow_nan=False, allow_infinity=False).filter(lambda d: d.adjusted() < 4000),
    st.uuids(),
    st.binary(max_size=20),
)
data = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
)
arguments = st.dictionaries(st.text(min_size=1, max_size=8), data, max_size=4)


def by_value(number: float | decimal.Decimal | int) -> str:
    """An independent text of a number's value (rs1): a float is the decimal its shortest text
    spells, and equal values give one text whatever their type."""
    exact = decimal.Decimal(repr(number)) if isinstance(number, float) else decimal.Decimal(number)
    if not exact.is_finite():
        return f"no value:{exact!r}"  # refused
    if exact == exact.to_integral_value():
        return "number:" + ("0" if exact == 0 else format(exact.to_integral_value(), "f"))
    return "number:" + format(exact.normalize(decimal.Context(prec=100_000)), "E")


def canonical(value: Any) -> str:
    """An independent canonical form: repr of a type-tagged tree, with dict keys sorted, numbers by value."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{canonical(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if type(value) in (int, float, decimal.Decimal):
        return by_value(value)
    return f"{type(value).__name__}:{value!r}"


def digest_shape(value: Any) -> Any:
    """``shape`` with numbers by value: equal digest shapes are exactly the equal calls of rs1."""
    kind = type(value)
    if kind in (int, float, decimal.Decimal):
        return by_value(value)
    if kind in (list, tuple):
        return (kind.__name__, tuple(digest_shape(v) for v in value))
    if kind in (set, frozenset):
        return (kind.__name__, tuple(sorted((digest_shape(v) for v in value), key=repr)))
    if kind is dict:
        return ("dict", tuple(sorted(((digest_shape(k), digest_shape(v)) for k, v in value.items()), key=repr)))
    return shape(value)


@given(arguments)
def test_digest_ignores_key_order(args: dict[str, Any]) -> None:
    """Equal arguments in any order give one digest."""
    shuffled = dict(reversed(list(args.items())))
    assert args_digest(args, tool_name="t") == args_digest(shuffled, tool_name="t")


@given(arguments, arguments)
def test_different_arguments_give_different_digests(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Digests differ exactly when the arguments differ as typed data."""
    same = canonical(a) == canonical(b)
    assert (args_digest(a, tool_name="t") == args_digest(b, tool_name="t")) == same


def test_digest_tells_types_apart() -> None:
    """A string is not the date it spells, nor 1 the same as True or "1"."""
    values = ["2026-01-01", dt.date(2026, 1, 1), 1, True, "1", [1], {"1": 1}, (1,), 1.5]
    digests = {args_digest({"x": v}, tool_name="t") for v in values}
    assert len(digests) == len(values)


EQUAL_NUMBERS = [
    (59, 59.0),
    (59, decimal.Decimal("59.00")),
    (0, -0.0),
    (0, decimal.Decimal("-0.000")),
    (decimal.Decimal("1.0"), decimal.Decimal("1.00")),
    (0.1, decimal.Decimal("0.10")),
    (1e22, 10**22),
    (2.5e-7, decimal.Decimal("0.00000025")),
    ([59, {"a": 1.0}], [59.0, {"a": decimal.Decimal(1)}]),
    ((1.0, {2.0}), (1, {2})),
]


@pytest.mark.parametrize(("a", "b"), EQUAL_NUMBERS, ids=stable_repr)
def test_equal_numbers_are_one_call(a: Any, b: Any) -> None:
    """Numbers are compared by value (rs1): a re-asked model sending 59.0 for 59 makes the same call."""
    assert args_digest({"x": a}, tool_name="t") == args_digest({"x": b}, tool_name="t")
    fast = SignatureDigest(["x"])
    assert fast({"x": a}, "t") == fast({"x": b}, "t") == args_digest({"x": a}, tool_name="t")


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, decimal.Decimal("NaN"), decimal.Decimal("-Infinity"), [1, {"a": math.nan}]],
    ids=stable_repr,
)
def test_numbers_without_a_value_are_refused(value: Any) -> None:
    """NaN and infinities equal nothing, themselves included: no digest, a named error, nothing runs."""
    with pytest.raises(ArgumentDigestError, match="'x'"):
        args_digest({"x": value}, tool_name="t")
    with pytest.raises(ArgumentDigestError, match="'x'"):
        SignatureDigest(["x"])({"x": value}, "t")


def test_plain_arguments_digest_as_before() -> None:
    """Plain JSON arguments keep the digest earlier versions stored: sha256 of sorted-key JSON."""
    args = {"order_id": "1042", "amount": 59.5, "lines": [{"sku": "é", "qty": 2}], "note": None, "rush": False}
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert args_digest(args, tool_name="t") == hashlib.sha256(text.encode()).hexdigest()


LOOKALIKES = [
    (dt.date(2026, 1, 1), {TAG: "date", "v": "2026-01-01"}),  # a date and the codec's tagged form of it
    (dt.date(2026, 1, 1), ["$date", "2026-01-01"]),  # and the previous digest's tagged form
    ({1: "a"}, {"1": "a"}),
    ({True: "a"}, {1: "a"}),
    ({None: "a"}, {"null": "a"}),
    (b"\x00", {TAG: "bytes", "v": "AA=="}),
    (b"\x00", ["$bytes", "AA=="]),
    (b"\x00", bytearray(b"\x00")),
    ((1, 2), [1, 2]),
    ({1, 2}, frozenset({1, 2})),
    ({1, 2}, ["set", 1, 2]),
    ([1, 2], ["list", 1, 2]),
    (result_domain.Level.LOW, 1),
    (result_domain.Mode.READ, "read"),
    (decimal.Decimal("0.1000000000000000000001"), 0.1),  # more digits than a float holds: another value
    (decimal.Decimal("1.0000000000000000001"), 1),
    (result_domain.Point(1, 2), {"x": 1, "y": 2}),
    (
        dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        dt.datetime(2026, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),
    ),
]


@pytest.mark.parametrize(("a", "b"), LOOKALIKES, ids=repr)
def test_lookalike_arguments_digest_apart(a: Any, b: Any) -> None:
    """Arguments that collided (a value and its tagged form, keys of other types) now differ."""
    assert args_digest({"x": a}, tool_name="t") != args_digest({"x": b}, tool_name="t")


domain_arguments = st.dictionaries(st.text(min_size=1, max_size=8), result_domain.values, max_size=3)


def _lookalike(args: dict[str, Any]) -> dict[str, Any]:
    """What the codec stores for ``args``, read back as plain JSON: the forms most likely to collide."""
    return {name: json.loads(JsonSerializer().dumps(value)) for name, value in args.items()}


@settings(max_examples=200, deadline=None)
@given(domain_arguments, domain_arguments, st.sampled_from(["independent", "equal", "lookalike"]))
def test_digests_are_equal_exactly_for_equal_arguments(a: dict[str, Any], b: dict[str, Any], relation: str) -> None:
    """Over the whole result domain: digests are equal iff the arguments are equal with exact types."""
    if relation == "equal":
        b = JsonSerializer().loads(JsonSerializer().dumps(a))  # an equal copy, made anew
    elif relation == "lookalike":
        b = _lookalike(a)
    same = digest_shape(a) == digest_shape(b)
    digests = _digest_or_error(args_digest, a, tool_name="t"), _digest_or_error(args_digest, b, tool_name="t")
    if any(digest.startswith("error:") for digest in digests):
        # NaN, an infinity or a number too long to write has no digest (test_numbers_without_a_value_are_refused)
        assert all(re.search(r"NaN and infinite|digits|limit", digest) for digest in digests if "error" in digest)
        return
    assert (digests[0] == digests[1]) == same
    if relation == "equal":
        assert same


# Each example is a batch of argument sets digested by one other interpreter: an interpreter's start costs
# far more than a digest.
@settings(max_examples=3, deadline=None)
@given(st.lists(domain_arguments, min_size=5, max_size=5))
def test_domain_digest_is_stable_across_processes(batch: list[dict[str, Any]]) -> None:
    """Another interpreter with another hash seed (another set order) computes the same digests."""
    code = (
        "import sys; import tests.result_domain; from replaysafe import JsonSerializer; "
        "from replaysafe._identity import args_digest; "
        "from tests.test_identity import _digest_or_error; "
        "batch = JsonSerializer().loads(sys.stdin.read()); "
        "[print(_digest_or_error(args_digest, args, tool_name='t')) for args in batch]"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=JsonSerializer().dumps(batch),
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    ).stdout.splitlines()
    assert out == [_digest_or_error(args_digest, args, tool_name="t") for args in batch]


@settings(max_examples=3, deadline=None)
@given(st.lists(arguments, min_size=5, max_size=5))
def test_digest_is_stable_across_processes(batch: list[dict[str, Any]]) -> None:
    """Another interpreter with another hash seed computes the same digests."""
    payload = json.dumps([_encode(args) for args in batch])
    code = (
        "import json,sys; from replaysafe._identity import args_digest; "
        "from tests.test_identity import _decode; "
        "[print(args_digest(_decode(args), tool_name='t')) for args in json.loads(sys.stdin.read())]"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], input=payload, capture_output=True, text=True, check=True, env=env
    ).stdout.splitlines()
    assert out == [args_digest(args, tool_name="t") for args in batch]


def _encode(value: Any) -> Any:
    """A lossless JSON form of test data, to hand it to another process."""
    if isinstance(value, dict):
        return {"d": {k: _encode(v) for k, v in value.items()}}
    if isinstance(value, list):
        return {"l": [_encode(v) for v in value]}
    if isinstance(value, dt.datetime):
        return {"dt": [value.isoformat(), value.fold]}
    if isinstance(value, decimal.Decimal):
        return {"dec": str(value)}
    if isinstance(value, uuid.UUID):
        return {"uuid": str(value)}
    if isinstance(value, bytes):
        return {"b": value.hex()}
    if isinstance(value, float):
        return {"f": value.hex()}
    return {"v": value}


def _decode(value: dict[str, Any]) -> Any:
    ((tag, inner),) = value.items()
    return {
        "d": lambda v: {k: _decode(x) for k, x in v.items()},
        "l": lambda v: [_decode(x) for x in v],
        "dt": lambda v: dt.datetime.fromisoformat(v[0]).replace(fold=v[1]),
        "dec": decimal.Decimal,
        "uuid": uuid.UUID,
        "b": bytes.fromhex,
        "f": float.fromhex,
        "v": lambda v: v,
    }[tag](inner)


def test_key_digest_has_no_separator_collisions() -> None:
    """('a:b', 'c') and ('a', 'b:c') are different keys."""
    assert key_digest("a:b", "c", "d") != key_digest("a", "b:c", "d")
    assert len(key_digest("x" * 65536, "y" * 65536, "z" * 65536)) == 64


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("ab", "c", "d"), ("a", "bc", "d")),  # ids run together would be "abcd" both times
        (("a", "bc", "d"), ("a", "b", "cd")),
        (("", "ab", "c"), ("a", "b", "c")),
        (("a", "", "bc"), ("a", "b", "c")),
        (("t", "m", ""), ("t", "", "m")),
    ],
)
def test_key_digest_keeps_each_id_apart(first: tuple[str, str, str], second: tuple[str, str, str]) -> None:
    """Ids whose characters run together alike are still different calls, and keys handed to providers differ too."""
    assert key_digest(*first) != key_digest(*second)
    assert call_idempotency_key(*first, "refund") != call_idempotency_key(*second, "refund")
    assert idempotency_key(*first) != idempotency_key(*second)


def test_key_digest_and_idempotency_keys_are_pinned() -> None:
    """The stored key of a call and the key handed to its provider never change across releases: both are found
    again through them (a record written by an older release, a provider's deduplication window)."""
    # The SHA-256 of the ids as a compact JSON array: each id quoted, so none can run into the next.
    assert hashlib.sha256(b'["t1","msg_7","call_1"]').hexdigest() == KEY_DIGEST_T1
    assert key_digest("t1", "msg_7", "call_1") == KEY_DIGEST_T1
    assert (
        call_idempotency_key("t1", "msg_7", "call_1", "refund_order") == "rs-225fb01a796e931b76a3ac3e78ea7616fdec479a"
    )


KEY_DIGEST_T1 = "16e31117b3b3765e2e1bf655848454ddbe2caab0595e65db52d49e9e1d0acf82"


@settings(max_examples=300)
@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(["a", "\ud800"]), max_size=200))
def test_short_and_long_texts_digest_as_sha256_of_their_utf8(text: str) -> None:
    """Texts shorter than two SHA-256 blocks take CPython's own SHA-256, longer ones OpenSSL's: same digest."""
    assert _identity._sha256(text) == hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@pytest.mark.parametrize("size", [0, 1, 55, 56, 63, 64, 119, 120, 121, 1000])
def test_digest_either_side_of_the_implementation_switch(size: int) -> None:
    assert _identity._BUILTIN_SHA256_BELOW == 120
    if sys.implementation.name == "cpython":
        assert _identity._builtin_sha256 is not hashlib.sha256  # the short texts' own implementation is found
    text = "\u00e9" * (size // 2) + "x" * (size % 2)  # two UTF-8 bytes per character: the switch is on bytes
    assert _identity._sha256(text) == hashlib.sha256(text.encode()).hexdigest()


@given(st.lists(st.one_of(st.text(), st.integers(), st.uuids()), min_size=1, max_size=4), st.none() | st.text())
def test_idempotency_key_is_deterministic_and_provider_friendly(parts: list[Any], namespace: str | None) -> None:
    """Same parts, same key; short, lowercase hex, within Stripe's 255-character limit."""
    key = idempotency_key(*parts, namespace=namespace)
    assert key == idempotency_key(*parts, namespace=namespace)
    assert re.fullmatch(r"rs-[0-9a-f]{40}", key)


def test_idempotency_key_depends_on_parts_and_namespace() -> None:
    """Other parts or another namespace give another key."""
    base = idempotency_key("refund", "1042")
    assert base != idempotency_key("refund", "1043")
    assert base != idempotency_key("refund", "1042", namespace="shop-b")
    assert idempotency_key(1) != idempotency_key("1")


def test_owner_token_names_host_pid_and_start() -> None:
    """Owner tokens are host:pid:start#n, unique per claim."""
    first, second = owner_token(), owner_token()
    assert first != second
    _host, pid, rest = first.split(":")
    assert pid == str(os.getpid())
    assert rest.partition("#")[2].isdigit()


# --- owner liveness: dead only on positive evidence ----------------------------------------


def _token_for(pid: int, start: str) -> str:
    return f"{_owners._owner.machine}:{pid}:{start}#1"


@pytest.fixture
def live_child() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait(timeout=30)


def test_a_live_owner_with_its_start_time_is_alive(live_child: subprocess.Popen[bytes]) -> None:
    start = _owners._process_start(live_child.pid)
    assert start is not None and start.isdigit()
    assert owner_alive(_token_for(live_child.pid, start)) is True


def test_a_reused_pid_is_not_the_owner(live_child: subprocess.Popen[bytes]) -> None:
    """The pid runs, but a process that started at another time holds it: the owner is dead."""
    start = _owners._process_start(live_child.pid)
    assert start is not None
    assert owner_alive(_token_for(live_child.pid, str(int(start) - 1))) is False
    assert owner_alive(_token_for(live_child.pid, str(int(start) + 1))) is False


def test_a_vanished_owner_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = _owners._process_start(child.pid) or "1"
    child.wait(timeout=30)  # reaped: no process has the pid now
    assert owner_alive(_token_for(child.pid, start)) is False


def test_a_zombie_owner_is_dead() -> None:
    """Killed but not yet reaped: ``kill(pid, 0)`` still succeeds, yet it will never finish."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = _owners._process_start(child.pid)
        assert start is not None
        token = _token_for(child.pid, start)
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(600):  # until the kernel has made it a zombie (bounded)
            fields = _owners._read_stat(child.pid)
            if fields is not None and fields[0] == b"Z":
                break
            time.sleep(0.05)
        assert owner_alive(token) is False
    finally:
        child.wait(timeout=30)


def test_an_owner_whose_start_cannot_be_compared_is_unknown(live_child: subprocess.Popen[bytes]) -> None:
    """A token written where /proc was unreadable holds a clock stamp, not a start time: the lease decides."""
    assert owner_alive(_token_for(live_child.pid, "t1764670000000000")) is None


def test_an_owner_on_another_machine_is_unknown() -> None:
    """REPLAYSAFE_OWNER_MACHINE names the host; tokens of another host are judged by their lease."""
    code = (
        "import os, sys; from replaysafe._owners import owner_alive, owner_token; "
        "print(owner_token()); print(owner_alive(sys.argv[1]))"
    )
    env = {**os.environ, "REPLAYSAFE_OWNER_MACHINE": "worker:7#b"}
    out = subprocess.run(
        [sys.executable, "-c", code, owner_token()], capture_output=True, text=True, check=True, env=env, timeout=60
    ).stdout.split()
    assert out[0].startswith("worker_7_b:")  # separators in the name cannot break the token
    assert out[1] == "None"


# --- the fast path of a tool's bound arguments -----------------------------------------

plain_json = st.recursive(
    result_domain.json_scalars
    | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=2),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5) | st.just(TAG), inner, max_size=4),
    max_leaves=10,
)
#: The common shapes (plain JSON, lone surrogates, NaN, huge ints) and the rest of the domain mixed in.
fast_values = plain_json | st.integers(min_value=10**4300, max_value=10**4400) | result_domain.values
parameter_names = st.lists(st.text(min_size=1, max_size=6) | st.just(TAG), unique=True, max_size=5)


def _digest_or_error(digest: Any, *args: Any, **kwargs: Any) -> str:
    try:
        return str(digest(*args, **kwargs))
    except ArgumentDigestError as exc:
        return f"error: {exc}"


@settings(max_examples=400, deadline=None)
@given(parameter_names, st.data())
def test_signature_digest_is_the_general_digest(names: list[str], data: st.DataObject) -> None:
    """A tool's fast digest equals the general one, byte for byte, for every bound mapping, excluded names left out."""
    values = {name: data.draw(fast_values, label=name) for name in names}
    exclude = data.draw(st.lists(st.sampled_from(names), unique=True) if names else st.just([]), label="exclude")
    # A mapping of other names now and then: the fast path must notice and step aside.
    extra = data.draw(st.dictionaries(st.text(max_size=3), plain_json, max_size=2), label="extra")
    arguments = {**values, **extra} if extra and data.draw(st.booleans(), label="use extra") else dict(values)
    # Defaults: some the value given (then it is left out), some another value.
    defaults = {
        name: values[name] if data.draw(st.booleans(), label=f"{name} at its default") else data.draw(plain_json)
        for name in data.draw(st.lists(st.sampled_from(names), unique=True) if names else st.just([]), label="defaults")
    }
    general = {
        name: value
        for name, value in arguments.items()
        if name not in exclude and not _at_default(name, value, defaults)
    }
    fast = SignatureDigest(names, exclude, defaults)
    expected = _digest_or_error(args_digest, general, tool_name="t")
    assert _digest_or_error(fast, arguments, "t") == expected
    # Given by position, every name in order: the same digest, or None for the general path.
    positional = fast.of_positional(tuple(values[name] for name in names))
    of_values = {
        name: value for name, value in values.items() if name not in exclude and not _at_default(name, value, defaults)
    }
    assert positional in (None, _digest_or_error(args_digest, of_values, tool_name="t"))
    kept = [name for name in names if name not in exclude]
    if arguments.keys() == set(names) and TAG not in kept and all(_common(arguments[n]) for n in kept):
        assert fast.text(arguments) is not None, "a common shape took the general path"
    # (``extra`` may hold one of the names: the positional values are ``values``, not ``arguments``.)
    if TAG not in kept and all(_common(values[n]) for n in kept):
        assert positional is not None, "a common shape given by position took the general path"


def _at_default(name: str, value: Any, defaults: dict[str, Any]) -> bool:
    """The rule, independently: the default object itself (whether or not it has a digest), or equal by value
    to a default that has a digest (a value equal to one without is never at it)."""
    if name in defaults and value is defaults[name]:
        return True
    if name not in defaults or digest_shape(value) != digest_shape(defaults[name]):
        return False
    return not _digest_or_error(args_digest, {"d": defaults[name]}, tool_name="t").startswith("error:")


def _common(value: Any) -> bool:
    """A value of the shapes the fast path takes (it falls back on an int too long to print, at any depth:
    no digest exists for one, and the general path says so)."""
    if type(value) is int:
        return abs(value) < 10**4000
    if type(value) in (dict, list):
        return is_plain(value) and all(_common(item) for item in (value.values() if type(value) is dict else value))
    if type(value) is float:
        return math.isfinite(value)  # NaN and infinities have no digest: the general path names them
    return type(value) in (str, bool, type(None))


class Orders:
    @replay_safe
    def refund(self, order_id: str, amount: int = 5, *, note: str | None = None) -> None: ...

    @replay_safe
    def ship(self, order_id: str, lines: list[str]) -> None: ...


@replay_safe(exclude_args=("session",))
def charge(order_id: str, lines: list[dict[str, Any]], session: object = None, rush: bool = False) -> None: ...


@pytest.mark.parametrize(
    ("tool", "instance", "args", "kwargs", "bound"),
    [
        (charge, None, ("1", [{"sku": "a", "qty": 2}]), {}, {"order_id": "1", "lines": [{"sku": "a", "qty": 2}]}),
        (
            charge,
            None,
            ("1",),
            {"lines": [], "rush": True, "session": object()},
            {"order_id": "1", "lines": [], "rush": True},
        ),
        (charge, None, ("1", []), {"rush": False}, {"order_id": "1", "lines": []}),  # rush at its default
        (  # every parameter by position: digested from the values, the excluded one left out
            charge,
            None,
            ("1", [{"sku": "a"}], object(), True),
            {},
            {"order_id": "1", "lines": [{"sku": "a"}], "rush": True},
        ),
        (Orders.refund, Orders(), ("9",), {"note": "é"}, {"order_id": "9", "note": "é"}),  # amount at its default
        (Orders.refund, Orders(), ("9", 5.0), {"note": None}, {"order_id": "9"}),  # 5.0 is its default 5
        (Orders.ship, Orders(), ("9", ["a"]), {}, {"order_id": "9", "lines": ["a"]}),
        (Orders.refund, Orders(), (), {"order_id": "9", "amount": 1.5}, {"order_id": "9", "amount": 1.5}),
    ],
)
def test_decorated_tools_digest_their_bound_arguments(
    tool: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], bound: dict[str, Any]
) -> None:
    """Through the decorator (methods without self, excluded names and arguments at their default left out):
    the general digest."""
    digest = tool._self_replaysafe_tool.digest(instance, args, kwargs)
    assert digest == args_digest(bound, tool_name="t")


EDGE_SCALARS = [
    -0.0, 0.0, 1e300, 5e-324, 0.1, 2**63, -(2**63), 0, True, False, None,
    "", '"\\\n\t\x00\u2028', "\ud800", "é€😀", [1.0, {"k": -1e300}], {"": [None, "\udfff"]},
]  # fmt: skip


@pytest.mark.parametrize("value", EDGE_SCALARS, ids=repr)
def test_signature_digest_of_edge_values(value: Any) -> None:
    """The fast path takes each edge value of the common shapes, and encodes it as the general path does."""
    fast = SignatureDigest(["a", "value", "z"])
    arguments = {"a": 1, "value": value, "z": "z"}
    assert fast.text(arguments) is not None
    assert fast(arguments, "t") == args_digest(arguments, tool_name="t")
