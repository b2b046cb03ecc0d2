"""Running the child-process script of the crash tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from replaysafe.testing._forkserver import run_python

AGENT_SCRIPT = Path(__file__).parent / "_agent_script.py"


@dataclass
class AgentRun:
    """One invocation of ``_agent_script.py``."""

    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return f"exit code {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_agent(phase: str, **options: str) -> AgentRun:
    """Run the child script in a new Python process with ``--name value`` options."""
    argv = [str(AGENT_SCRIPT), phase]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", value]
    done = run_python(argv, timeout=300)
    return AgentRun(done.returncode, done.stdout, done.stderr)
