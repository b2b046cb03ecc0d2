"""``replaysafe crashtest``: kill an agent at every point of every side effect, resume it, count.

The entry point runs once to learn its calls (``discover``). Then each case (a call and a point
of it, or an unprotected side effect) gets a fresh directory, a run SIGKILLed at that point
(``crash``) and a run that resumes from what the first one left (``resume``). The case's log
(``_case``) says how often each call's body started and each marked effect ran; the verdict
compares that with what the promise allows.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from .._constants import LEDGER_URL_ENV
from .._crash_points import AFTER_RECORD, AFTER_RETURN, BEFORE, INSIDE, POINTS
from . import _case, _forkserver

Policy = Literal["rerun", "raise"]

#: Exit codes.
HOLDS, BROKEN, UNTESTABLE = 0, 1, 2

#: Verdicts of a case. ``holds``: every call ran at most once, or twice where it was in doubt and the
#: policy settled it; ``duplicate``: something ran more often than promised; ``new arguments``: a side
#: effect ran with arguments the run that was not killed never used; the last three: not tested.
HELD, IN_DOUBT, DUPLICATE, UNPROTECTED, RECORD_IGNORED, NEW_ARGUMENTS, NOT_REACHED, HUNG, RESUME_FAILED = (
    "holds",
    "in doubt, settled by policy",
    "DUPLICATE",
    "UNPROTECTED",
    "RECORD IGNORED",
    "NEW ARGUMENTS",
    "not reached",
    "hung",
    "resume failed",
)
_BROKEN = {DUPLICATE, UNPROTECTED, RECORD_IGNORED, NEW_ARGUMENTS}
_UNTESTED = {NOT_REACHED, HUNG, RESUME_FAILED}

_CHILD = "replaysafe.testing._crashtest_child"
#: How the report names a protected tool that ran unprotected (no ids, no ledger), after the tool's name.
_RUN_WITHOUT_IDS = " (a protected tool run without ids or ledger)"
#: The option that gives each case a ledger of its own, by URL scheme (SQLite: a file in the case's directory).
_NAMESPACES = {"postgresql": "table", "postgres": "table", "redis": "prefix", "rediss": "prefix", "unix": "prefix"}


class CrashTestError(Exception):
    """The command could not test (exit code 2): a bad entry point, no tool call, an unusable ledger."""


Key = tuple[str, str, str]


def _key(value: Sequence[str] | None) -> Key | None:
    return None if value is None else (value[0], value[1], value[2])


def _ids(key: Key) -> str:
    return " / ".join(key)


@dataclasses.dataclass
class Call:
    """A protected call the entry point makes, as the first run saw it."""

    index: int
    key: Key
    tool: str
    parent: Key | None
    #: The points the call reached in the first run.
    points: list[str]
    #: Whether a marked side effect ran inside it (its ``inside`` point is then right after the first).
    marks_effects: bool

    def label(self) -> str:
        step = f", a step of {_ids(self.parent)}" if self.parent else ""
        return f"{self.tool} ({_ids(self.key)}{step})"


@dataclasses.dataclass
class CaseResult:
    """One case: where the crashed run died, what the two runs did, and the verdict."""

    case: str
    tool: str
    call: Key | None
    point: str
    ran: int
    expected: str
    verdict: str
    details: list[str]
    reproduce: str
    folder: str | None = None
    seconds: float = 0.0
    #: How often each marked side effect ran in the case's two runs (killed and resumed), by name.
    effects: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The same, in the resumed run alone.
    resumed_effects: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The decisions written on calls in all of the case's runs (``approved``, ``rejected``), by kind.
    decisions: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def broken(self) -> bool:
        return self.verdict in _BROKEN

    @property
    def untested(self) -> bool:
        return self.verdict in _UNTESTED


@dataclasses.dataclass
class CrashReport:
    """What ``crashtest`` found: the calls the entry point makes, and each case's verdict."""

    entry: str
    ledger: str | None
    policy: Policy | None
    calls: list[Call]
    effects: dict[str, int]
    cases: list[CaseResult]
    seconds: float
    #: Seconds each run of a case may take.
    timeout: float
    #: What the first run (not killed) did: what a case's two runs are allowed.
    baseline: _Tally = dataclasses.field(default_factory=lambda: _Tally())

    @property
    def exit_code(self) -> int:
        if any(case.broken for case in self.cases):
            return BROKEN
        if any(case.untested for case in self.cases):
            return UNTESTABLE
        return HOLDS

    @property
    def holds(self) -> bool:
        return self.exit_code == HOLDS

    def table(self) -> str:
        rows = [["CASE", "CALL", "POINT", "RAN", "EXPECTED", "VERDICT"]]
        rows += [[c.case, c.tool, c.point, str(c.ran), c.expected, c.verdict] for c in self.cases]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
        for case in self.cases:
            if case.broken or case.untested:
                lines.append("")
                lines.append(f"case {case.case}: {case.verdict}: {case.tool} at {case.point}")
                lines += [f"  {detail}" for detail in case.details]
                if case.folder:
                    lines.append(f"  its directory, kept: {case.folder}")
                lines.append(f"  reproduce it alone: {case.reproduce}")
        broken = sum(case.broken for case in self.cases)
        untested = sum(case.untested for case in self.cases)
        lines.append("")
        lines.append(
            f"{len(self.cases)} case(s) over {len(self.calls)} protected call(s) and {len(self.effects)} unprotected "
            f"side effect(s), in {self.seconds:.1f} s: {len(self.cases) - broken - untested} held, {broken} broke "
            f"the promise, {untested} could not be tested"
        )
        return "\n".join(lines)

    def document(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "ledger": self.ledger,
            "policy": self.policy,
            "exit_code": self.exit_code,
            "calls": [
                {"index": c.index, "tool": c.tool, "key": list(c.key), "parent": c.parent and list(c.parent)}
                | {"points": c.points}
                for c in self.calls
            ],
            "unprotected_effects": self.effects,
            "cases": [
                {
                    "case": c.case,
                    "tool": c.tool,
                    "key": c.call and list(c.call),
                    "point": c.point,
                    "ran": c.ran,
                    "expected": c.expected,
                    "verdict": c.verdict,
                    "details": c.details,
                    "reproduce": c.reproduce,
                    "seconds": round(c.seconds, 3),
                    "effects": c.effects,
                    "resumed_effects": c.resumed_effects,
                    "decisions": c.decisions,
                }
                for c in self.cases
            ],
        }

    def junit(self) -> str:
        """One JUnit test case per case: a failure where the promise broke, an error where it was not tested."""
        suite = ET.Element(
            "testsuite",
            name="replaysafe crashtest",
            tests=str(len(self.cases)),
            failures=str(sum(c.broken for c in self.cases)),
            errors=str(sum(c.untested for c in self.cases)),
            skipped="0",
            time=f"{self.seconds:.3f}",
        )
        for case in self.cases:
            element = ET.SubElement(
                suite,
                "testcase",
                classname=f"crashtest.{case.tool}",
                name=f"{case.case} {case.point}" + (f" {_ids(case.call)}" if case.call else ""),
                time=f"{case.seconds:.3f}",
            )
            if case.broken or case.untested:
                tag = "failure" if case.broken else "error"
                child = ET.SubElement(element, tag, message=f"{case.verdict}: {case.tool} at {case.point}")
                child.text = "\n".join([*case.details, f"reproduce: {case.reproduce}"])
        root = ET.Element("testsuites")
        root.append(suite)
        ET.indent(root)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


@dataclasses.dataclass
class _Run:
    """One child process's run: its log lines and how it ended."""

    lines: list[dict[str, Any]]
    returncode: int | None  # None: it passed the timeout and was killed
    output: str

    @property
    def outcome(self) -> dict[str, Any] | None:
        return next((line for line in reversed(self.lines) if line["kind"] == "outcome"), None)

    @property
    def killed(self) -> dict[str, Any] | None:
        return next((line for line in self.lines if line["kind"] == "killed"), None)

    def failure(self) -> str:
        """Why the run failed, in a line (the entry point's error, or how the process ended)."""
        outcome = self.outcome
        if self.returncode is None:
            return "it did not finish in time"
        if outcome is None:
            return f"it ended with exit code {self.returncode} before the entry point returned"
        if not outcome.get("found", True):
            return f"the entry point could not be loaded: {outcome['error']}"
        if outcome["ok"]:
            return "the entry point returned"
        return f"the entry point raised {outcome['error_type']}"


class _Runner:
    """Runs the entry point in child processes, one case's directory at a time."""

    def __init__(
        self,
        entry: str,
        ledger: str | None,
        policy: Policy | None,
        effects: Sequence[str],
        timeout: float,
        cwd: Path,
        env: Mapping[str, str],
        restarts: int = 1,
    ) -> None:
        self.entry, self.ledger, self.policy, self.effects = entry, ledger, policy, list(effects)
        self.timeout, self.cwd = timeout, cwd
        #: How often the agent is started after the crash (``crashtest(restarts=...)``).
        self.restarts = restarts
        # What every run gets: the caller's variables, and this process's import path (as run_in_child gives
        # it), so that what imports here imports there too (a test's helper module, a driver).
        self.env = {**os.environ, **env, _case.SYS_PATH_ENV: json.dumps(sys.path)}
        # The runs of one agent, from one place, fork from servers (_forkserver) this process keeps; they
        # import under this process's environment (the variables of ``env`` reach each run, not that import).
        # Keyed by the entry point's module (its functions import the same) and the group a caller names:
        # agents on other frameworks, run from one module (the conformance kit's drivers), keep servers apart.
        group = env.get(_forkserver.GROUP_ENV, "")
        self.server_key = (sys.executable, str(cwd), tuple(sys.path), entry.rpartition(":")[0], group)
        #: What the discovery run imported from installed code: what the servers import ahead.
        self.modules: list[str] | None = None
        self.server_env = {**os.environ, _case.SYS_PATH_ENV: self.env[_case.SYS_PATH_ENV]}
        self.namespace = f"rs_crashtest_{uuid.uuid4().hex[:8]}"
        self._opened: list[str] = []
        self._lock = threading.Lock()

    def ledger_url(self, folder: Path, number: int) -> str:
        """The case's own ledger: a SQLite file in its directory, or a table or key prefix of its own on a
        server (the case's number after this command's own name: short, and made of ``[a-z0-9_]`` only)."""
        if self.ledger is None or self.ledger.startswith("sqlite:"):
            return f"sqlite:///{folder / 'ledger.db'}"
        name = f"{self.namespace}_{number}"
        url = _namespaced(self.ledger, name)
        with self._lock:
            self._opened.append(url)
        return url

    def run(self, folder: Path, run: str, ledger_url: str, kill: dict[str, Any] | None = None) -> _Run:
        env = {**self.env, _case.DIR_ENV: str(folder), _case.RUN_ENV: run, LEDGER_URL_ENV: ledger_url}
        env.pop(_case.KILL_ENV, None)
        if kill is not None:
            env[_case.KILL_ENV] = json.dumps(kill)
        output = folder / f".replaysafe-crashtest-{run}.out"
        argv = [self.entry, self.policy or "-", *self.effects]
        # Resumes fork from a server of their own: a resumed process has another hash seed than the one that
        # crashed (as after a real crash), so an agent whose ids hang on the order of a set is still caught.
        role = "resume" if run == "resume" else "first"
        server = _forkserver.server_for((*self.server_key, role), self.modules, self.server_env, self.cwd)
        code: int | None
        if server is not None:
            try:
                code = server.run({"argv": argv, "env": env, "cwd": str(self.cwd), "output": str(output)}, self.timeout)
            except OSError as exc:
                raise CrashTestError(
                    f"the process that starts the runs of {self.entry} ended ({exc}); run the crash test again, "
                    f"or with {_forkserver.FORK_ENV}=0 to start each run as a new interpreter"
                ) from exc
        else:
            with output.open("wb") as sink:
                child = subprocess.Popen(
                    [sys.executable, "-m", _CHILD, *argv],
                    cwd=self.cwd,
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                try:
                    code = child.wait(self.timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)  # it and anything it started
                    child.wait()
                    code = None
        log = folder / _case.LOG_NAME
        lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
        if run == "discover":
            self.modules = next((line["names"] for line in lines if line["kind"] == "modules"), None)
        # A run that never got as far as opening its output (its process could not start) has none.
        printed = output.read_text(errors="replace") if output.exists() else ""
        return _Run([line for line in lines if line["run"] == run], code, printed)

    def clean(self) -> None:
        """Remove what the cases wrote on a server ledger: their records, and on PostgreSQL the table and claim
        function each case's ledger made."""
        from ..ledgers import open_ledger

        for url in self._opened:
            if url.startswith("sqlite:"):
                continue
            try:
                with open_ledger(url) as ledger:
                    for record in list(ledger.records()):
                        ledger.delete(record.key)  # a tiered ledger's cache too
                    durable = getattr(ledger, "truth", ledger)  # a tiered ledger's PostgreSQL
                    drop = getattr(durable, "drop", None)
                    if callable(drop):
                        drop()
            except Exception:
                print(f"replaysafe crashtest: could not remove the records of {url}", file=sys.stderr)


def _namespaced(ledger: str, name: str) -> str:
    """``ledger`` with a namespace of the case's own: a table on PostgreSQL, a key prefix on Redis (after the
    given one), both for PostgreSQL with a Redis cache (``?cache=``)."""
    parts = urllib.parse.urlsplit(ledger)
    option = _NAMESPACES[parts.scheme.lower().partition("+")[0]]
    query = dict(urllib.parse.parse_qsl(parts.query))
    # Under the given prefix, as a key of its own would be ("app" -> "app:<case>:{...}"), so a Redis user whose ACL
    # allows "~app:*" may run the cases.
    given = query.get(option, "")
    query[option] = f"{given.rstrip(':')}:{name}" if option == "prefix" and given else name
    cache = urllib.parse.urlsplit(query.get("cache", "")).scheme.lower()
    if cache in _NAMESPACES:  # a cache shared by the cases would answer one case with another's records
        query["cache"] = _namespaced(query["cache"], name)
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def _calls(lines: Iterable[dict[str, Any]]) -> list[Call]:
    """The protected calls a run made, in the order they were claimed."""
    calls: dict[Key, Call] = {}
    for line in lines:
        kind = line["kind"]
        key = _key(line.get("key"))
        if kind == "point" and key is not None:
            call = calls.get(key)
            if call is None:
                call = calls[key] = Call(len(calls) + 1, key, line["tool"], _key(line.get("parent")), [], False)
            if line["point"] not in call.points:
                call.points.append(line["point"])
        elif kind == "event" and line["event"] == "started" and key in calls:
            if INSIDE not in calls[key].points:
                calls[key].points.append(INSIDE)
        elif kind == "effect":
            for key_in in map(_key, line["calls"]):
                if key_in in calls:
                    calls[key_in].marks_effects = True
    for call in calls.values():
        call.points.sort(key=POINTS.index)
    return list(calls.values())


#: The events of a decision written on a call, as the case's log names them.
_DECISIONS = frozenset({"approved", "rejected"})


@dataclasses.dataclass
class _Tally:
    """What runs did: each call's body starts that did not end in a pause (by key and by tool), and each marked
    side effect's executions."""

    starts: Counter[Key] = dataclasses.field(default_factory=Counter)
    tool_starts: Counter[str] = dataclasses.field(default_factory=Counter)
    effects: Counter[str] = dataclasses.field(default_factory=Counter)
    #: The same, by effect and the digest of its arguments (``None`` for arguments that are not data).
    effect_args: Counter[tuple[str, str | None]] = dataclasses.field(default_factory=Counter)
    #: Executions outside every protected call (marked effects, and protected tools run without ids).
    unprotected: Counter[str] = dataclasses.field(default_factory=Counter)
    tools: dict[Key, str] = dataclasses.field(default_factory=dict)
    #: Every call that reached a point, started or not (a call rejected, or waiting for a decision, never starts).
    seen: set[Key] = dataclasses.field(default_factory=set)
    #: The decisions written on calls (``approved``, ``rejected``: ``replaysafe.approvals``), by kind.
    decisions: Counter[str] = dataclasses.field(default_factory=Counter)

    def allowed_starts(self, key: Key) -> int:
        """How often the call ``key`` starts in this run: 1 for a call it did not make (counted by tool instead)."""
        return self.starts.get(key, 0 if key in self.seen else 1)


def _tally(lines: Iterable[dict[str, Any]]) -> _Tally:
    tally = _Tally()
    running: Counter[tuple[str, Key]] = Counter()  # each run's starts of each call whose outcome is not told yet
    for line in lines:
        key = _key(line.get("key"))
        if key is not None and line["kind"] == "event" and line["event"] == "started":
            running[line["run"], key] += 1
            tally.tools[key] = line["tool"]
            tally.starts[key] += 1
            tally.tool_starts[line["tool"]] += 1
        elif key is not None and line["kind"] == "point":
            tally.seen.add(key)
            if line["point"] == AFTER_RETURN and running[line["run"], key]:
                running[line["run"], key] -= 1
                if line.get("status") == "paused":
                    # A start that ended in a pause made no side effect (a tool pauses before it acts): not
                    # counted. (Told when its pause is about to be written, not by the event after it: a kill may
                    # come between.) A call paused with no start (an approval asked for) has none to take back.
                    tally.starts[key] -= 1
                    tally.tool_starts[line["tool"]] -= 1
        elif line["kind"] == "event" and line["event"] in _DECISIONS:
            tally.decisions[line["event"]] += 1
        elif line["kind"] == "event" and line["event"] == "unprotected":
            tally.unprotected[line["tool"] + _RUN_WITHOUT_IDS] += 1
        elif line["kind"] == "effect":
            tally.effects[line["name"]] += 1
            tally.effect_args[line["name"], line.get("args")] += 1
            if not line["calls"]:
                tally.unprotected[line["name"]] += 1
    return tally


def _keys(lines: Iterable[dict[str, Any]]) -> set[Key]:
    """The call keys of ``lines`` (those that have one)."""
    return {key for key in (_key(line.get("key")) for line in lines) if key is not None}


def _verdict(
    target: Call | None, effect: str | None, crashed: _Run, resumed: _Run, report: CrashReport, done: _Tally
) -> tuple[int, str, str, list[str]]:
    """What the two runs of a case did against what the promise allows: (ran, expected, verdict, details).

    The allowance is what one run that is not killed does (the first run's counts: a paused call resumed,
    a call retried after an error it did not record, start again there too), plus one more run of each
    call that was in doubt by right: claimed in the crashed run, its outcome not written, and reported in
    doubt on resume (its policy ran it again). Counted three ways, so that a call made again under new ids
    is caught too: per call key, per tool, and per marked side effect.
    """
    base = report.baseline  # ``done``: what the two runs did (``_tally`` of their lines)
    in_doubt = _keys(line for line in resumed.lines if line["kind"] == "event" and line["event"] == "in_doubt")
    claimed_then = _keys(line for line in crashed.lines if line["kind"] == "point" and line["point"] == BEFORE)
    # A paused record is no outcome: the call runs again (on its resume, or on an approval).
    recorded_then = _keys(
        line
        for line in crashed.lines
        if line["kind"] == "point" and line["point"] == AFTER_RECORD and line.get("status") != "paused"
    )
    open_at_kill = claimed_then - recorded_then
    rerun = open_at_kill & in_doubt
    details: list[str] = []
    verdict = HELD

    def broke(how: str, detail: str) -> None:
        nonlocal verdict
        verdict = DUPLICATE if DUPLICATE in (how, verdict) else how
        details.append(detail)

    for key, count in sorted(done.starts.items()):
        tool, allowed = done.tools[key], base.allowed_starts(key) + (key in rerun)
        if count > allowed:
            why = (
                "its outcome was written before the crash" if key not in open_at_kill else "more than its policy ran it"
            )
            broke(DUPLICATE, f"{tool} ({_ids(key)}) ran {count} times, {allowed} allowed: {why}")
        elif key in rerun and count > base.allowed_starts(key):
            details.append(f"{tool} ({_ids(key)}) was in doubt and ran again under its policy (rerun)")
            verdict = IN_DOUBT if verdict == HELD else verdict
    for tool, count in sorted(done.tool_starts.items()):
        allowed = base.tool_starts.get(tool, 0) + sum(done.tools.get(key) == tool for key in rerun)
        if count > allowed:
            new = sorted(key for key in done.starts if done.tools[key] == tool and key not in base.starts)
            also = f"; calls the first run did not make: {', '.join(map(_ids, new))} (new ids?)" if new else ""
            broke(DUPLICATE, f"{tool} started {count} times, where a run that is not killed starts it {allowed}{also}")
    for key in sorted(in_doubt - open_at_kill):
        broke(
            RECORD_IGNORED,
            f"{done.tools.get(key, '?')} ({_ids(key)}) was reported in doubt, though its outcome was written",
        )
    again_inside_args = Counter(
        (line["name"], line.get("args"))
        for line in crashed.lines
        if line["kind"] == "effect" and any(_key(k) in rerun for k in line["calls"])
    )
    again_inside: Counter[str] = Counter()
    for (name, _), count in again_inside_args.items():
        again_inside[name] += count
    for name, count in sorted(done.effects.items()):
        allowed = base.effects.get(name, 0) + again_inside.get(name, 0)
        if count <= allowed:
            continue
        if done.unprotected.get(name, 0) > base.unprotected.get(name, 0):
            broke(
                UNPROTECTED,
                f"ran {count} times, where the run that was not killed ran it {base.effects.get(name, 0)}: `{name}` is "
                "not protected (decorate it with @replay_safe, or make it a step of a protected tool)",
            )
        else:
            broke(DUPLICATE, f"`{name}` ran {count} times, where a run that is not killed runs it {allowed}")
    for (name, digest), count in sorted(done.effect_args.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        if digest is None:
            continue  # its arguments are not data: counted by name alone
        once = base.effect_args.get((name, digest), 0)
        if once:
            allowed = once + again_inside_args.get((name, digest), 0)
            if count > allowed and done.effects[name] <= base.effects.get(name, 0) + again_inside.get(name, 0):
                # Not seen by name (another set of arguments ran less often than it should): seen here.
                broke(
                    DUPLICATE,
                    f"`{name}` ran {count} times with the same arguments, where a run that is not "
                    f"killed runs it {allowed} (digest {digest[:12]})",
                )
            continue
        broke(
            NEW_ARGUMENTS,
            f"`{name}` ran {count} time(s) with arguments the run that was not killed never used (digest "
            f"{digest[:12]}): a resumed run carried out something its first run did not ask for (a re-plan, or "
            "an approval applied to other arguments)",
        )
    for name, count in sorted(done.unprotected.items()):
        if name not in done.effects and count > base.unprotected.get(name, 0):
            broke(
                UNPROTECTED,
                f"ran {count} times, where the run that was not killed ran it {base.unprotected[name]}: `{name}`",
            )
    outcome = resumed.outcome
    if resumed.returncode is None:
        return 0, "", HUNG, [f"hung after resume: it did not finish within {report.timeout:g} s"]
    if outcome is None or not outcome["ok"]:
        error = (outcome or {}).get("error_type", "")
        if error.endswith(".CallInDoubtError") and in_doubt and in_doubt <= open_at_kill:
            details.append(f"the resume raised CallInDoubtError for {_ids(sorted(in_doubt)[0])} (policy raise)")
            verdict = IN_DOUBT if verdict == HELD else verdict
        elif verdict not in _BROKEN:
            verdict = RESUME_FAILED
            details.append(f"the resume failed: {resumed.failure()}")
            details += _tail(resumed)
    if target is not None:
        ran = done.starts.get(target.key, 0)
        once = base.allowed_starts(target.key)
        expected = f"{once}, or {once + 1} if in doubt" if target.key in open_at_kill else str(once)
    else:
        ran = done.effects.get(effect or "", 0) or done.unprotected.get(effect or "", 0)
        expected = str(base.effects.get(effect or "", 0) or base.unprotected.get(effect or "", 0))
    return ran, expected, verdict, details


def _tail(run: _Run, lines: int = 12) -> list[str]:
    """Where the entry point's error was raised (its frames and its type, not its message: it may carry
    values); its output is left in the case's directory, unread (so is anything it printed)."""
    text = (run.outcome or {}).get("traceback") or ""
    return [f"| {line}" for line in text.rstrip().splitlines()[-lines:]]


def crashtest(
    entry: str,
    *,
    ledger: str | None = None,
    points: Sequence[str] = POINTS,
    policy: Policy | None = None,
    jobs: int = 1,
    timeout: float = 60.0,
    effects: Sequence[str] = (),
    case: str | None = None,
    keep: bool = False,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    restarts: int = 1,
) -> CrashReport:
    """Crash-test the agent ``entry`` (``path/to/file.py:function`` or ``package.module:function``).

    See ``docs/crashtest.md``. Raises ``CrashTestError`` when it cannot test (exit code 2).
    ``case`` (``"N@point"``, or ``"effect@after-return"``) runs that one case alone and keeps its
    directory; ``keep`` keeps every case's directory. ``env``: variables added to the environment of
    every run of the agent. ``restarts``: how often the agent is started after the crash: the resume, then
    (above 1) further starts with nothing killed, which must run nothing (an agent that is done, or waits
    for its human, does nothing when started again).
    """
    started = time.monotonic()
    unknown = sorted(set(points) - set(POINTS))
    if unknown:
        raise CrashTestError(f"unknown kill point(s) {', '.join(unknown)}: choose from {', '.join(POINTS)}")
    if policy not in (None, "rerun", "raise"):
        raise CrashTestError(f"--policy must be rerun or raise, got {policy!r}")
    if jobs < 1 or timeout <= 0 or restarts < 1:
        raise CrashTestError("--jobs and restarts must be 1 or more and --timeout more than 0 seconds")
    runner = _Runner(entry, ledger, policy, effects, timeout, Path(cwd or Path.cwd()), env or {}, restarts)
    if ledger is not None:
        scheme = urllib.parse.urlsplit(ledger).scheme.lower().partition("+")[0]
        if scheme != "sqlite" and scheme not in _NAMESPACES:
            raise CrashTestError(
                f"--ledger {_redacted(ledger)}: each case needs a ledger of its own, which the command makes on "
                "sqlite://, postgresql:// and redis:// URLs only. For another ledger, open it in the entry point "
                "under $REPLAYSAFE_CRASHTEST_DIR and leave --ledger out."
            )
        _check_ledger(runner.ledger_url(Path(), 0), ledger)
    base = Path(tempfile.mkdtemp(prefix="replaysafe-crashtest-"))
    try:
        first = base / "discover"
        first.mkdir()
        discovery = runner.run(first, "discover", runner.ledger_url(first, 0))
        _check_discovery(entry, discovery)
        calls, baseline = _calls(discovery.lines), _tally(discovery.lines)
        unprotected = dict(baseline.unprotected)
        if not calls and not unprotected:
            raise CrashTestError(
                f"{entry} made no protected tool call and ran no marked side effect, so there is nothing to "
                "crash-test. Check that its tools are decorated with @replay_safe (or wrapped by an adapter) and "
                "called with ids, and mark other side effects with @replaysafe.testing.side_effect."
            )
        report = CrashReport(entry, ledger, policy, calls, unprotected, [], 0.0, timeout, baseline)
        planned = _plan(calls, unprotected, points)
        if case is not None:
            planned = [item for item in planned if item[0] == case]
            if not planned:
                names = ", ".join(item[0] for item in _plan(calls, unprotected, points))
                raise CrashTestError(f"no case {case!r} in this agent; its cases: {names}")
            keep = True
        done: list[CaseResult] = []
        total = len(planned)

        def one(numbered: tuple[int, tuple[str, Call | None, str | None, str]]) -> CaseResult:
            return _run_case(runner, report, base, *numbered, keep)

        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            for result in pool.map(one, enumerate(planned, start=1)):
                done.append(result)
                if progress is not None:
                    progress(len(done), total, sum(c.broken for c in done))
        report.cases = done
        report.seconds = time.monotonic() - started
        return report
    finally:
        runner.clean()
        shutil.rmtree(base / "discover", ignore_errors=True)
        if not keep and not any(base.iterdir()):
            shutil.rmtree(base, ignore_errors=True)


def _check_ledger(url: str, given: str) -> None:
    """Open the ledger (under the namespace of the command's own probe) and read from it."""
    from ..ledgers import open_ledger

    try:
        with open_ledger(url) as opened:
            opened.get(_case_probe_key())
    except Exception as exc:
        raise CrashTestError(f"the ledger {_redacted(given)} cannot be used: {type(exc).__name__}: {exc}") from None


def _case_probe_key() -> Any:
    from .._records import CallKey

    return CallKey("replaysafe-crashtest", "probe", "probe")


def _redacted(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    return urllib.parse.urlunsplit(parts)


def _check_discovery(entry: str, run: _Run) -> None:
    outcome = run.outcome
    if run.returncode is None:
        raise CrashTestError(f"{entry} did not finish its first run (not killed) within the timeout")
    if outcome is not None and not outcome.get("found", True):
        raise CrashTestError(f"cannot load {entry}: {outcome['error']}")
    if outcome is None or not outcome["ok"]:
        made = any(line["kind"] in ("point", "effect") for line in run.lines)
        when = "after its first tool call" if made else "before any tool call"
        tail = "\n".join(_tail(run))
        raise CrashTestError(f"{entry} failed {when} in its first run (not killed): {run.failure()}\n{tail}")


def _plan(
    calls: list[Call], unprotected: dict[str, int], points: Sequence[str]
) -> list[tuple[str, Call | None, str | None, str]]:
    """Every case: each call at each asked point it reached, then each unprotected effect after it ran."""
    planned: list[tuple[str, Call | None, str | None, str]] = []
    for call in calls:
        for point in POINTS:
            if point in points and point in call.points:
                planned.append((f"{call.index}@{point}", call, None, point))
    for name in unprotected:  # whatever the points: finding what nobody protected is half the command's use
        if not name.endswith(_RUN_WITHOUT_IDS):  # a tool run without ids has no point of its own to kill at
            planned.append((f"{name}@{AFTER_RETURN}", None, name, AFTER_RETURN))
    return planned


def _run_case(
    runner: _Runner,
    report: CrashReport,
    base: Path,
    number: int,
    item: tuple[str, Call | None, str | None, str],
    keep: bool,
) -> CaseResult:
    name, call, effect, point = item
    folder = base / name.replace(":", "_").replace("/", "_")
    folder.mkdir()
    started = time.monotonic()
    url = runner.ledger_url(folder, number)
    if call is not None:
        kill: dict[str, Any] = {"key": list(call.key), "point": point}
        if point == INSIDE:
            kill["at"] = "effect" if call.marks_effects else "start"
        where = call.label()
    else:
        kill = {"effect": effect, "point": AFTER_RETURN}
        where = f"the unprotected side effect {effect}"
    reproduce = _reproduce(runner, name)
    crashed = runner.run(folder, "crash", url, kill)
    tool = call.tool if call is not None else str(effect)
    key = call.key if call is not None else None
    if crashed.killed is None:
        why = "it did not finish in time" if crashed.returncode is None else f"it ended ({crashed.failure()}) first"
        details = [
            f"the run to be killed never reached {point} of {where}: {why}. An agent that makes other calls "
            "(other ids) on each run cannot be crash-tested: give its model fixed ids (a scripted model)."
        ]
        result = CaseResult(name, tool, key, point, 0, "", NOT_REACHED, details + _tail(crashed), reproduce)
    else:
        resumed = runner.run(folder, "resume", url)
        done = _tally(crashed.lines + resumed.lines)
        ran, expected, verdict, details = _verdict(call, effect, crashed, resumed, report, done)
        decisions = Counter(done.decisions)
        for number in range(2, runner.restarts + 1):
            if verdict in _UNTESTED:
                break
            again = runner.run(folder, f"restart-{number}", url)
            decisions += _tally(again.lines).decisions
            made = Counter(line["name"] for line in again.lines if line["kind"] == "effect")
            made.update(line["tool"] for line in again.lines if line["kind"] == "event" and line["event"] == "started")
            if made:
                verdict = DUPLICATE
                details.append(
                    f"started once more after its resume (start {number} after the crash, nothing killed), the "
                    f"agent ran {', '.join(f'{name} {count} time(s)' for name, count in sorted(made.items()))}: "
                    "an agent that is done, or waits for its human, runs nothing when started again"
                )
            elif _ended(resumed) is None and _ended(again) is not None:
                # (After a resume that raised, as under ``raise``, what the next start does is the operator's.)
                verdict = verdict if verdict in _BROKEN else RESUME_FAILED
                details.append(f"started once more after its resume (start {number}): {again.failure()}")
        result = CaseResult(name, tool, key, point, ran, expected, verdict, details, reproduce)
        result.effects = dict(done.effects)
        result.resumed_effects = dict(_tally(resumed.lines).effects)
        result.decisions = dict(decisions)
    result.seconds = time.monotonic() - started
    if keep or result.broken or result.untested:
        result.folder = str(folder)
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def _ended(run: _Run) -> str | None:
    """How a run ended: ``None`` when its entry point returned, else its error's type or how the process ended."""
    outcome = run.outcome
    if run.returncode is not None and outcome is not None and outcome["ok"]:
        return None
    return str((outcome or {}).get("error_type") or run.failure())


def _reproduce(runner: _Runner, case: str) -> str:
    words = ["replaysafe", "crashtest", runner.entry, "--case", case]
    if runner.ledger:
        words += ["--ledger", _redacted(runner.ledger)]
    if runner.policy:
        words += ["--policy", runner.policy]
    for effect in runner.effects:
        words += ["--effects", effect]
    return shlex.join(words)
