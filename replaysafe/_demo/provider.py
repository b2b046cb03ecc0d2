"""A fake payment provider for ``replaysafe demo --in-doubt``: refunds deduped by idempotency key.

It behaves like Stripe's ``Idempotency-Key`` header: the first ``POST /refunds`` with
a key moves the money and stores the refund under that key; a later request with
the same key moves nothing and returns the stored refund, marked as a replay
(``"replayed": true`` and the header ``Idempotent-Replayed: true``). A request
without a key always creates a new refund. Reusing a key for another order or
amount is refused (422).

``GET /refunds?idempotency_key=K`` returns the refund stored under K (404 when
there is none): what a reconciler asks. ``GET /refunds?order_id=O`` lists an
order's refunds: what an operator looks at.

The state lives in a JSON file, so it outlives the processes that call the
provider (and the provider itself). The server binds 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

Refund = dict[str, Any]


class RefundStore:
    """The provider's books: every refund it made, in a JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"next_id": 1, "refund_requests": 0, "refunds": []}
        return json.loads(self.path.read_text())  # type: ignore[no-any-return]

    def _save(self, state: dict[str, Any]) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=1))
        os.replace(temporary, self.path)

    def create(self, order_id: str, amount: float, idempotency_key: str | None) -> tuple[Refund, bool]:
        """Refund ``amount`` for ``order_id``, or return the refund already made under the key.

        Returns ``(refund, replayed)``; raises ``ValueError`` when the key was used for another refund.
        """
        with self._lock:
            state = self._load()
            state["refund_requests"] += 1
            found = _by_key(state, idempotency_key)
            if found is not None:
                self._save(state)
                if (found["order_id"], found["amount"]) != (order_id, amount):
                    raise ValueError("this Idempotency-Key was already used for a different refund")
                return found, True
            refund: Refund = {
                "id": f"re_{state['next_id']:04d}",
                "order_id": order_id,
                "amount": amount,
                "idempotency_key": idempotency_key,
            }
            state["next_id"] += 1
            state["refunds"].append(refund)
            self._save(state)
            return refund, False

    def find(self, idempotency_key: str) -> Refund | None:
        with self._lock:
            return _by_key(self._load(), idempotency_key)

    def refunds(self, order_id: str | None = None) -> list[Refund]:
        with self._lock:
            refunds: list[Refund] = self._load()["refunds"]
        return [r for r in refunds if order_id is None or r["order_id"] == order_id]

    def refund_requests(self) -> int:
        """How many ``POST /refunds`` requests arrived, replays included."""
        with self._lock:
            return int(self._load()["refund_requests"])

    def money_moved(self) -> float:
        """The total amount actually refunded: a replayed request moves nothing."""
        return sum(float(r["amount"]) for r in self.refunds())


def _by_key(state: dict[str, Any], idempotency_key: str | None) -> Refund | None:
    if idempotency_key is None:
        return None
    return next((r for r in state["refunds"] if r["idempotency_key"] == idempotency_key), None)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, store: RefundStore) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.store = store


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        status, body, headers = self._post()
        self._reply(status, body, headers)

    def do_GET(self) -> None:
        status, body = self._get()
        self._reply(status, body)

    def _post(self) -> tuple[int, Any, dict[str, str]]:
        if urllib.parse.urlsplit(self.path).path != "/refunds":
            return 404, {"error": "not found"}, {}
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            order_id, amount = str(body["order_id"]), float(body["amount"])
        except (ValueError, KeyError, TypeError):
            return 400, {"error": 'expected a JSON body {"order_id": ..., "amount": ...}'}, {}
        try:
            refund, replayed = self.server.store.create(order_id, amount, self.headers.get("Idempotency-Key"))
        except ValueError as exc:
            return 422, {"error": str(exc)}, {}
        if replayed:
            return 200, {**refund, "replayed": True}, {"Idempotent-Replayed": "true"}
        return 201, {**refund, "replayed": False}, {}

    def _get(self) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path != "/refunds":
            return 404, {"error": "not found"}
        if "idempotency_key" in query:
            refund = self.server.store.find(query["idempotency_key"][0])
            return (200, refund) if refund is not None else (404, {"error": "no refund with this idempotency key"})
        if "order_id" in query:
            return 200, {"data": self.server.store.refunds(query["order_id"][0])}
        return 400, {"error": "pass idempotency_key=... or order_id=..."}

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the demo tells its own story


class FakePaymentProvider:
    """The provider's HTTP service, served from a thread of this process on a free local port.

    Use it as a context manager; ``url`` is its base URL and ``store`` its books.
    """

    def __init__(self, state_file: Path) -> None:
        self.store = RefundStore(state_file)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the provider is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakePaymentProvider:
        self._server = _Server(self.store)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-provider", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> FakePaymentProvider:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# --- the client: what a tool (or a reconciler) calls -------------------------------

# No proxy: the provider is on 127.0.0.1, and an HTTP(S)_PROXY setting must not reroute it.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_TIMEOUT = 10.0


def create_refund(base_url: str, order_id: str, amount: float, *, idempotency_key: str | None) -> Refund:
    """``POST /refunds``: the returned refund has ``"replayed": True`` when the key was seen before."""
    request = urllib.request.Request(
        f"{base_url}/refunds",
        data=json.dumps({"order_id": order_id, "amount": amount}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    if idempotency_key is not None:
        request.add_header("Idempotency-Key", idempotency_key)
    with _opener.open(request, timeout=_TIMEOUT) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def find_refund(base_url: str, idempotency_key: str) -> Refund | None:
    """``GET /refunds?idempotency_key=...``: the refund made under this key, or ``None``."""
    query = urllib.parse.urlencode({"idempotency_key": idempotency_key})
    try:
        with _opener.open(f"{base_url}/refunds?{query}", timeout=_TIMEOUT) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            return None
        raise


def list_refunds(base_url: str, order_id: str) -> list[Refund]:
    """``GET /refunds?order_id=...``: every refund of one order."""
    query = urllib.parse.urlencode({"order_id": order_id})
    with _opener.open(f"{base_url}/refunds?{query}", timeout=_TIMEOUT) as response:
        return json.loads(response.read())["data"]  # type: ignore[no-any-return]
