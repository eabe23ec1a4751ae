"""pytest fixtures: a fresh weir server (and a reference memcached) per test.

Nothing is built here. The binary is $WEIR_BIN, else target/release/weir
relative to the repo root; `scripts/test` builds it first. Each server gets
free loopback ports and a fresh temp data dir, and is killed and removed after
the test, failed or not. On failure the tail of the server's log is printed.
"""

from __future__ import annotations

import os

import pytest

import harness


def pytest_configure(config):
    # The abuse tests hold thousands of sockets; raise the limit before any
    # server is spawned so the servers inherit it too.
    harness.raise_nofile_limit(65536)


def pytest_collection_modifyitems(config, items):
    if harness.on_jetstream():
        if not harness.NATS_URLS:
            raise pytest.UsageError("WEIR_TEST_BACKEND=jetstream needs WEIR_TEST_NATS_URLS")
        # Deselected, not skipped: what cannot apply to a cluster (the data
        # directory's files, a full disk, the bus and the proxy) says why where it is
        # marked; the rest of the suite runs as on the embedded engine.
        kept = [i for i in items if "embedded_only" not in i.keywords]
        dropped = [i for i in items if "embedded_only" in i.keywords]
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    else:
        # The cluster's own tests run in the JetStream pass of scripts/test.
        dropped = [i for i in items if "jetstream_only" in i.keywords]
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if "jetstream_only" not in i.keywords]
    if harness.is_memcached(harness.weir_bin()):
        if os.environ.get("WEIR_SUITE_STRICT") == "1":
            raise pytest.UsageError(
                "WEIR_BIN names memcached, which would skip every weir-only test; "
                "WEIR_SUITE_STRICT=1 (scripts/test) does not allow that"
            )
        skip = pytest.mark.skip(reason="WEIR_BIN is memcached: queue semantics not available")
        for item in items:
            if "weir_only" in item.keywords:
                item.add_marker(skip)


def pytest_runtest_setup(item):
    """A test marked `cluster_faults` stops, kills or cuts off nodes of the shared test
    cluster under every other test on it: under pytest-xdist (`-n`) it would run beside
    others, so there it fails at once (scripts/test gives these tests a pass of their
    own, without `-n`). A module marked `own_cluster` faults a cluster it starts for
    itself: it runs beside the others, one module per process (`-n` with `--dist
    loadfile`)."""
    if os.environ.get("PYTEST_XDIST_WORKER") and item.get_closest_marker("cluster_faults"):
        pytest.fail(
            "a cluster_faults test stops, kills or cuts off nodes of the shared cluster: "
            "it runs only without -n (`-m cluster_faults`), never beside other tests",
            pytrace=False,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    # Under scripts/test a skip hides a hole: it fails instead. The only skips allowed
    # are a mount on a machine that cannot mount (WEIR_REQUIRE_MOUNTS unset) and a
    # network namespace on one that cannot make them (WEIR_REQUIRE_NETNS unset).
    if rep.skipped and os.environ.get("WEIR_SUITE_STRICT") == "1":
        reason = str(rep.longrepr[2]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        allowed = ("Skipped: cannot mount", "Skipped: network namespaces cannot be made")
        if not reason.startswith(allowed):
            rep.outcome = "failed"
            rep.longrepr = f"skipped under WEIR_SUITE_STRICT=1: {reason}"
    setattr(item, "rep_" + rep.when, rep)


def _failed(request) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is None or rep.failed


@pytest.fixture(scope="session")
def server_bin():
    path = harness.weir_bin()
    if not path.is_file():
        pytest.fail(
            f"server binary {path} not found: build it with `cargo build --release -p weir-server` "
            "or point WEIR_BIN at it",
            pytrace=False,
        )
    return path


@pytest.fixture
def make_server(request, server_bin):
    """A factory of (not yet started) server processes, all cleaned up after the test."""
    made: list[harness.ServerProcess] = []
    kind = "memcached" if harness.is_memcached(server_bin) else "weir"

    def make() -> harness.ServerProcess:
        s = harness.ServerProcess(server_bin, kind)
        made.append(s)
        return s

    yield make
    for s in made:
        if _failed(request):
            print(s.log_tail())
        s.stop()


@pytest.fixture
def server(make_server):
    """A running server (weir, or memcached in the development mode)."""
    s = make_server().start()
    yield s


@pytest.fixture
def memcached(request):
    """A running memcached, the reference for the protocol both share."""
    s = harness.ServerProcess(harness.memcached_bin(), "memcached")
    if not s.binary.is_file():
        pytest.fail("memcached not installed (scripts/test installs it)", pytrace=False)
    try:
        s.start()
        yield s
    finally:
        if _failed(request):
            print(s.log_tail())
        s.stop()
