"""Config keys renamed to the one scheme (the thing, `_max` for a cap, then the unit):
a file written for an older weir still starts with the same meaning, the start says
each old name's new one once, and a file that gives a key under both names is refused
(docs/configuration.md, "Renamed keys")."""

from __future__ import annotations

import subprocess

import pytest

import harness
from harness import Conn

pytestmark = pytest.mark.weir_only

OLD_NAMES = {
    "max_connections": ("connections_max", 300),
    "max_open_reads": ("open_reads_max", 3),
    "max_queues": ("queues_max", 500),
    "http_max_connections": ("http_connections_max", 40),
}


def settings_of(conn: Conn) -> dict[str, str]:
    conn.send(b"stats settings\r\n")
    settings = {}
    while (line := conn.read_line()) != b"END\r\n":
        _, name, value = line.decode().split(" ", 2)
        settings[name] = value.strip()
    return settings


def with_config(server, text: str):
    # On JetStream the harness's own [backend.jetstream] section stays first.
    server.config_toml = (server.config_toml or "") + text
    return server


def test_a_file_with_the_old_names_starts_with_the_same_meaning(make_server):
    server_section = "".join(f"{old} = {value}\n" for old, (_, value) in OLD_NAMES.items())
    server = with_config(
        make_server(),
        f"[server]\n{server_section}[defaults]\nmax_item_size_bytes = 4096\nmax_age_ms = 60000\n",
    )
    server.start()
    with Conn(server.addr) as c:
        settings = settings_of(c)
        # The queue settings apply: an item over the queue's limit is refused.
        c.send(b"set q 0 0 5000\r\n" + b"x" * 5000 + b"\r\n")
        assert c.read_line() == b"CLIENT_ERROR item too large\r\n", "max_item_size_bytes not applied"
        c.send(b"set q 0 0 4000\r\n" + b"x" * 4000 + b"\r\n")
        assert c.read_line() == b"STORED\r\n"
    assert settings["maxconns"] == "300", settings
    assert settings["max_open_reads"] == "3", settings
    if not harness.on_jetstream():
        # On JetStream the cap is not the store's (docs/cluster.md): it shows none.
        assert settings["max_queues"] == "500", settings
    log = server.log_path.read_text(errors="replace")
    olds = {**{o: n for o, (n, _) in OLD_NAMES.items()}, "max_item_size_bytes": "item_size_bytes_max", "max_age_ms": "age_ms_max"}
    for old, new in olds.items():
        said = [line for line in log.splitlines() if "has a new name" in line and f'old="{old}"' in line]
        assert len(said) == 1, log
        assert f'new="{new}"' in said[0], log


def test_the_old_connections_flag_still_works(make_server):
    server = make_server()
    base = server.argv
    server.argv = lambda: base() + ["--max-connections", "77"]
    server.start()
    with Conn(server.addr) as c:
        assert settings_of(c)["maxconns"] == "77"


def refused_at_start(server, path, text: str) -> str:
    """Starts weir on a config file of `text`; it must refuse it: what it says."""
    path.write_text(text)
    done = subprocess.run(server.argv() + ["--config", str(path)], capture_output=True, timeout=30)
    assert done.returncode != 0
    return done.stderr.decode(errors="replace")


def test_a_key_under_both_names_is_refused_at_start(make_server, tmp_path):
    err = refused_at_start(make_server(), tmp_path / "both.toml", "[server]\nmax_open_reads = 2\nopen_reads_max = 3\n")
    assert "duplicate" in err and "open_reads_max" in err, err


def test_a_refused_value_is_named_by_its_key(make_server, tmp_path):
    err = refused_at_start(make_server(), tmp_path / "bad.toml", "[server]\nopen_reads_max = 0\n")
    assert "server.open_reads_max must be 1 to 1024" in err, err
