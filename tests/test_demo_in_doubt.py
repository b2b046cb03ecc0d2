"""`replaysafe demo --in-doubt` run for real, and the fake payment provider it uses."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from replaysafe._demo.provider import FakePaymentProvider, create_refund, find_refund, list_refunds

# --- the demo, in a subprocess ------------------------------------------------------


@pytest.fixture(scope="module")
def demo() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replaysafe", "demo", "--in-doubt"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def stories(demo: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The demo's output, one entry per story, keyed by its policy."""
    sections = demo.stdout.split("\n=== ")[1:]
    assert len(sections) == 4, demo.stdout
    return dict(zip(["rerun", "raise", "reconciler", "fresh keys"], sections, strict=True))


def sent_keys(story: str) -> list[str]:
    return re.findall(r"Idempotency-Key: (\S+)", story)


def test_demo_exits_zero_and_refunds_once_under_each_policy(
    demo: subprocess.CompletedProcess[str], stories: dict[str, str]
) -> None:
    """Every story's first agent is SIGKILLed mid-refund; each policy ends with one refund and $59.00 moved."""
    assert demo.returncode == 0, demo.stdout + demo.stderr
    for policy in ("rerun", "raise", "reconciler"):
        story = stories[policy]
        assert story.count("is killed (SIGKILL)") == 1, story
        assert ", 1 refund, $59.00 moved" in story, story
        assert "result: the customer was refunded once. Correct." in story, story
    assert "refunds with a stable key: rerun 1, raise 1, reconciler 1; with a new key per attempt: 2" in demo.stdout


def test_the_output_names_processes_not_internal_owner_tokens(
    demo: subprocess.CompletedProcess[str], stories: dict[str, str]
) -> None:
    """CallInDoubtError's owner is shown as the dead process's pid, not its ``host:pid:start#n`` token."""
    assert not re.search(r"\S+:\d+:\d+#\d+", demo.stdout), demo.stdout
    killed = re.search(r"process (\d+) is killed", stories["raise"])
    assert killed, stories["raise"]
    assert f"the error's owner: process {killed[1]}, the one that died" in stories["raise"], stories["raise"]


def test_rerun_sends_the_same_key_and_the_provider_dedupes(stories: dict[str, str]) -> None:
    """Under rerun, attempt 2 sends attempt 1's key and the provider moves no money the second time."""
    story = stories["rerun"]
    first, second = sent_keys(story)
    assert first == second
    assert first.startswith("rs-")
    assert "attempt 2: POST /refunds" in story
    assert "returns refund re_0001 again, no money moved" in story
    assert "provider: 2 refund requests, 1 refund, $59.00 moved" in story


def test_raise_sends_nothing_and_the_operator_settles_it(stories: dict[str, str]) -> None:
    """Under raise, the resume raises CallInDoubtError; after ledger.resolve the next resume replays it."""
    story = stories["raise"]
    assert "CallInDoubtError: refund_order" in story
    assert len(sent_keys(story)) == 1
    assert "the operator settles the call: ledger.resolve(CallKey(" in story
    assert "[refund_order did not run]" in story
    assert "provider: 1 refund request, 1 refund, $59.00 moved" in story


def test_reconciler_finds_the_refund_and_the_tool_does_not_run(stories: dict[str, str]) -> None:
    """The reconciler looks the refund up by the call's key; its answer is recorded, the tool not run again."""
    story = stories["reconciler"]
    (key,) = sent_keys(story)
    assert f"check_refund: GET /refunds?idempotency_key={key}" in story
    assert "check_refund: the provider has refund re_0001" in story
    assert "[refund_order did not run]" in story
    assert "provider: 1 refund request, 1 refund, $59.00 moved" in story


def test_a_new_key_per_attempt_refunds_twice(stories: dict[str, str]) -> None:
    """The contrast: a uuid4 key per attempt cannot be deduped, so the rerun refunds a second time."""
    story = stories["fresh keys"]
    first, second = sent_keys(story)
    assert first != second
    assert "provider: 2 refund requests, 2 refunds, $118.00 moved" in story
    assert "result: the customer was refunded 2 times" in story


# --- the provider, over real HTTP ------------------------------------------------------


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[FakePaymentProvider]:
    with FakePaymentProvider(tmp_path / "provider.json") as running:
        yield running


def test_provider_listens_on_localhost_only(provider: FakePaymentProvider) -> None:
    """The provider binds 127.0.0.1 on a free port."""
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", provider.url)


def test_same_key_twice_makes_one_refund(provider: FakePaymentProvider) -> None:
    """A second request with the same key returns the first refund, marked as a replay, and moves no money."""
    first = create_refund(provider.url, "1042", 59.0, idempotency_key="rs-k1")
    second = create_refund(provider.url, "1042", 59.0, idempotency_key="rs-k1")
    assert first["replayed"] is False
    assert second["replayed"] is True
    assert second["id"] == first["id"]
    assert len(provider.store.refunds()) == 1
    assert provider.store.money_moved() == 59.0
    assert provider.store.refund_requests() == 2


def test_different_keys_make_two_refunds(provider: FakePaymentProvider) -> None:
    """Different keys are different refunds, even for the same order and amount."""
    first = create_refund(provider.url, "1042", 59.0, idempotency_key="rs-k1")
    second = create_refund(provider.url, "1042", 59.0, idempotency_key="rs-k2")
    assert first["id"] != second["id"]
    assert not second["replayed"]
    assert provider.store.money_moved() == 118.0


def test_no_key_makes_a_refund_every_time(provider: FakePaymentProvider) -> None:
    """Without an Idempotency-Key header nothing is deduped."""
    create_refund(provider.url, "1042", 59.0, idempotency_key=None)
    create_refund(provider.url, "1042", 59.0, idempotency_key=None)
    assert len(provider.store.refunds()) == 2


def test_a_key_reused_for_another_refund_is_refused(provider: FakePaymentProvider) -> None:
    """The same key with another amount is a 422, and moves no money."""
    create_refund(provider.url, "1042", 59.0, idempotency_key="rs-k1")
    with pytest.raises(urllib.error.HTTPError) as refused:
        create_refund(provider.url, "1042", 99.0, idempotency_key="rs-k1")
    refused.value.close()
    assert refused.value.code == 422
    assert provider.store.money_moved() == 59.0


def test_lookup_by_key_and_by_order(provider: FakePaymentProvider) -> None:
    """GET finds a refund by its key (None when there is none) and lists an order's refunds."""
    assert find_refund(provider.url, "rs-k1") is None
    made = create_refund(provider.url, "1042", 59.0, idempotency_key="rs-k1")
    found = find_refund(provider.url, "rs-k1")
    assert found is not None
    assert (found["id"], found["order_id"], found["amount"]) == (made["id"], "1042", 59.0)
    assert [r["id"] for r in list_refunds(provider.url, "1042")] == [made["id"]]
    assert list_refunds(provider.url, "7") == []


def test_the_books_survive_a_provider_restart(tmp_path: Path) -> None:
    """State is in the JSON file: a new provider on the same file still dedupes the key."""
    state = tmp_path / "provider.json"
    with FakePaymentProvider(state) as before:
        first = create_refund(before.url, "1042", 59.0, idempotency_key="rs-k1")
    with FakePaymentProvider(state) as after:
        again = create_refund(after.url, "1042", 59.0, idempotency_key="rs-k1")
        assert again["replayed"] is True
        assert again["id"] == first["id"]
        assert after.store.money_moved() == 59.0
