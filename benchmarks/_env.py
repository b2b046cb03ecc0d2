"""Where the benchmark runs: the servers it talks to, its throwaway data, the machine.

Servers are found like the test suite finds them: ``REPLAYSAFE_TEST_POSTGRES_URL``
and ``REPLAYSAFE_TEST_REDIS_URL``, else PostgreSQL on 127.0.0.1:5432 (user
``root``, database ``test``) and Redis on 127.0.0.1:6379. A server that does not
answer is skipped (and said so in the results), never started or stopped.

Everything a run writes lives in one throwaway PostgreSQL schema, one Redis key
prefix and one temporary directory, all named after the run, and is removed when
the run ends, also on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
import redis
from psycopg import sql

POSTGRES_ENV = "REPLAYSAFE_TEST_POSTGRES_URL"
REDIS_ENV = "REPLAYSAFE_TEST_REDIS_URL"
LOCAL_POSTGRES = "postgresql://root@127.0.0.1:5432/test"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"


def libpq_url(url: str) -> str:
    """A SQLAlchemy-style URL (``postgresql+psycopg://``) as psycopg's own ``connect()`` takes it."""
    scheme, sep, rest = url.partition("://")
    return f"postgresql{sep}{rest}" if scheme.startswith("postgres") else url


def _postgres_url() -> str | None:
    url = os.environ.get(POSTGRES_ENV) or LOCAL_POSTGRES
    try:
        with psycopg.connect(libpq_url(url), connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return None
    return url


def _redis_url() -> str | None:
    url = os.environ.get(REDIS_ENV) or LOCAL_REDIS
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError:
        return None
    finally:
        client.close()
    return url


@dataclass
class Scratch:
    """The run's servers and throwaway places: a schema, a key prefix, a directory."""

    postgres_url: str | None
    redis_url: str | None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    directory: Path = field(init=False)

    def __post_init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=f"replaysafe-bench-{self.run_id}-"))

    @classmethod
    def discover(cls) -> Scratch:
        return cls(_postgres_url(), _redis_url())

    @property
    def schema(self) -> str:
        """The run's PostgreSQL schema (a generated identifier)."""
        return f"rs_bench_{self.run_id}"

    @property
    def prefix(self) -> str:
        """The run's Redis key prefix: every key the run writes starts with it."""
        return f"rs-bench-{self.run_id}"

    def postgres_connect(self) -> psycopg.Connection[Any]:
        assert self.postgres_url is not None
        return psycopg.connect(libpq_url(self.postgres_url), autocommit=True)

    def redis_client(self, **options: Any) -> redis.Redis:
        assert self.redis_url is not None
        return redis.Redis.from_url(self.redis_url, **options)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Drop the schema, delete the prefix's keys, remove the directory."""
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.postgres_url is not None:
            with contextlib.suppress(psycopg.Error), self.postgres_connect() as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))
        if self.redis_url is not None:
            client = self.redis_client()
            with contextlib.suppress(redis.RedisError):
                delete_prefix(client, self.prefix)
            client.close()


@contextlib.contextmanager
def cpus_kept_awake(enabled: bool) -> Iterator[int]:
    """Lowest-priority busy processes that keep idle vCPUs out of their sleep states while the run lasts.

    On an idle VM every round trip wakes a sleeping vCPU (the server's, then the client's),
    which can cost more than the round trip itself: a loopback Redis ``GET`` measured 27 us
    with a spinner and 110 us without on a 2-core VM. Nice 19 spinners take only time
    nobody else wants, and make runs comparable whatever else the machine is doing.
    Yields how many were started.
    """
    count = min(max((os.cpu_count() or 2) - 1, 1), 3) if enabled else 0
    # Each spinner ends by itself if the run dies without stopping it (its parent changes).
    code = "import os, sys\nos.nice(19)\nwhile os.getppid() == int(sys.argv[1]):\n    sum(range(100_000))\n"
    spinners = [subprocess.Popen([sys.executable, "-c", code, str(os.getpid())]) for _ in range(count)]
    try:
        yield count
    finally:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.wait(timeout=10)


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key starting with ``prefix`` (letters, digits, ``-``, ``:`` only), in batches."""
    deleted = 0
    batch: list[Any] = []
    for name in client.scan_iter(match=f"{prefix}*", count=5000):
        batch.append(name)
        if len(batch) >= 5000:
            deleted += int(client.unlink(*batch))
            batch = []
    if batch:
        deleted += int(client.unlink(*batch))
    return deleted


# --- what the results say about the machine ------------------------------------------


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def _filesystem(path: Path) -> str | None:
    """The type of the filesystem ``path`` is on (the SQLite files' fsync cost depends on it)."""
    best: tuple[int, str] | None = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1]) and (best is None or len(parts[1]) > best[0]):
                best = (len(parts[1]), parts[2])
    return best[1] if best else None


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.rstrip("\n")


def library_source() -> dict[str, Any]:
    """Which replaysafe was measured: its directory, the commit checked out there, and files changed since."""
    import replaysafe

    package = Path(replaysafe.__file__).resolve().parent
    changed = _git(package.parent, "status", "--porcelain", "--", "replaysafe")
    return {
        "path": str(package),
        "commit": _git(package.parent, "rev-parse", "HEAD"),
        "uncommitted_changes": changed.splitlines() if changed else [],
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: other work on the machine shows here."""
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def machine_info(scratch: Scratch) -> dict[str, Any]:
    """Machine, Python, library and server versions, and the date, for the results."""
    servers: dict[str, str | None] = {"postgres": None, "redis": None}
    if scratch.postgres_url is not None:
        with contextlib.suppress(psycopg.Error), scratch.postgres_connect() as conn:
            row = conn.execute("SHOW server_version").fetchone()
            fsync = conn.execute("SHOW synchronous_commit").fetchone()
            servers["postgres"] = f"{row[0] if row else '?'} (synchronous_commit={fsync[0] if fsync else '?'})"
    if scratch.redis_url is not None:
        client = scratch.redis_client()
        with contextlib.suppress(redis.RedisError):
            info: Any = client.info("server")
            servers["redis"] = str(info.get("redis_version"))
        client.close()
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "load_average_at_start": load_average(),
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "memory_gib": _memory_gib(),
            "sqlite_dir_filesystem": _filesystem(scratch.directory),
        },
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "library": library_source(),
        "versions": {
            "replaysafe": _version("replaysafe"),
            "sqlalchemy": _version("sqlalchemy"),
            "psycopg": _version("psycopg"),
            "redis-py": _version("redis"),
            "aws-lambda-powertools": _version("aws-lambda-powertools"),
            "sqlite": sqlite3.sqlite_version,
            "postgres server": servers["postgres"],
            "redis server": servers["redis"],
        },
    }
