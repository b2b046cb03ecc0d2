"""An agent process for the HTTP idempotency-key crash tests, run as ``python tests/http_child.py``.

``http_child.py CLIENT LEDGER_URL PROVIDER_URL THREAD``: call the protected ``charge_twice``
once under fixed ids and print its result as JSON. ``charge_twice`` sends two ``POST /charges``
requests through CLIENT (``httpx``, ``httpx-async``, ``requests``, or ``plain``: httpx without the
hook) and returns both answers. The test SIGKILLs this process while the provider holds an answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
import requests

from replaysafe import open_ledger, replay_safe, tool_call
from replaysafe.http import IdempotencyKeyAdapter, aadd_idempotency_key, add_idempotency_key

TIMEOUT = 60.0


def charges_sync(client: str, url: str) -> list[Any]:
    if client == "requests":
        with requests.Session() as session:
            session.trust_env = False  # no proxy for the local provider
            session.mount("http://", IdempotencyKeyAdapter())
            return [session.post(f"{url}/charges", json={"n": n}, timeout=TIMEOUT).json() for n in (1, 2)]
    hooks = {"request": [add_idempotency_key]} if client == "httpx" else {}
    with httpx.Client(event_hooks=hooks, trust_env=False, timeout=TIMEOUT) as http:
        return [http.post(f"{url}/charges", json={"n": n}).json() for n in (1, 2)]


async def charges_async(url: str) -> list[Any]:
    async with httpx.AsyncClient(
        event_hooks={"request": [aadd_idempotency_key]}, trust_env=False, timeout=TIMEOUT
    ) as http:
        return [(await http.post(f"{url}/charges", json={"n": n})).json() for n in (1, 2)]


def main() -> None:
    client, ledger_url, url, thread = sys.argv[1:]
    ledger = open_ledger(ledger_url)
    result: Any
    with tool_call(thread, "msg_1", "call_1"):
        if client == "httpx-async":

            @replay_safe(ledger=ledger, name="charge_twice")
            async def charge_twice_async() -> list[Any]:
                return await charges_async(url)

            result = asyncio.run(charge_twice_async())
        else:

            @replay_safe(ledger=ledger, name="charge_twice")
            def charge_twice() -> list[Any]:
                return charges_sync(client, url)

            result = charge_twice()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
