"""The rendered nats-server config: an explicit JetStream sync policy, and a cluster
node's name and authenticated routes; the settings that list servers and replicas."""

from __future__ import annotations

import json

import pytest

from intentroute.settings import CliSettings
from intentroute.stack.natsconf import ClusterNode, server_config, sync_interval_problem
from shared.common.settings import CommonSettings, nats_servers


def _block(text: str, key: str) -> dict[str, object]:
    """The JSON value of the line `key: {...}` in the rendered config."""
    rest = ("\n" + text).split(f"\n{key}: ", 1)[1]
    value, _ = json.JSONDecoder().raw_decode(rest)
    assert isinstance(value, dict)
    return value


def test_jetstream_syncs_every_second_unless_told_otherwise() -> None:
    text = server_config(host="127.0.0.1", port=4222, store_dir="/s", pid_file="/p")
    assert _block(text, "jetstream") == {"store_dir": "/s", "sync_interval": "1s"}
    always = server_config(host="127.0.0.1", port=4222, store_dir="/s", pid_file="/p",
                           sync_interval="always")
    assert _block(always, "jetstream")["sync_interval"] == "always"


@pytest.mark.parametrize(("value", "ok"), [
    ("always", True), ("1s", True), ("100ms", True), ("2m", True), ("1h", True),
    ("", False), ("0s", False), ("never", False), ("1 s", False), ("1.5s", False),
    ("always\ninclude x", False),
])
def test_sync_interval_values(value: str, ok: bool) -> None:
    assert (sync_interval_problem(value) == "") is ok
    if not ok:
        with pytest.raises(ValueError, match="sync interval"):
            server_config(host="h", port=1, store_dir="/s", pid_file="/p", sync_interval=value)


def test_a_bad_sync_interval_setting_is_refused_when_read() -> None:
    with pytest.raises(ValueError, match="NATS_SYNC_INTERVAL"):
        CliSettings.from_env({"NATS_SYNC_INTERVAL": "sometimes"})
    assert CliSettings.from_env({}).nats_sync_interval == "1s"


def test_a_cluster_node_has_a_name_and_authenticated_routes() -> None:
    node = ClusterNode(cluster="intentroute", server_name="n2", port=6222,
                       routes=("nats-route://route:s@127.0.0.1:6221",
                               "nats-route://route:s@127.0.0.1:6222"),
                       user="route", password_hash="$2b$04$hash")
    text = server_config(host="127.0.0.1", port=4222, store_dir="/s", pid_file="/p",
                         node=node, auth_file="../auth.conf")
    assert 'server_name: "n2"' in text
    assert _block(text, "cluster") == {
        "name": "intentroute", "listen": "127.0.0.1:6222",
        "authorization": {"user": "route", "password": "$2b$04$hash", "timeout": 2},
        "routes": list(node.routes),
    }
    assert 'include "../auth.conf"' in text
    single = server_config(host="127.0.0.1", port=4222, store_dir="/s", pid_file="/p")
    assert "cluster" not in single
    assert "server_name" not in single


def test_nats_url_may_list_every_node() -> None:
    assert nats_servers("nats://a:1, nats://b:2,,nats://c:3") == [
        "nats://a:1", "nats://b:2", "nats://c:3"]
    assert nats_servers("nats://a:1") == ["nats://a:1"]


def test_streams_have_as_many_replicas_as_servers_up_to_three_unless_set() -> None:
    three = CommonSettings.from_env({"NATS_URL": "nats://a:1,nats://b:2,nats://c:3"})
    assert three.nats_servers == ["nats://a:1", "nats://b:2", "nats://c:3"]
    assert three.replicas() == 3
    assert three.replicas(5) == 3
    assert CommonSettings.from_env({"NATS_URL": "nats://a:1"}).replicas() == 1
    assert CommonSettings.from_env({"NATS_STREAM_REPLICAS": "3"}).replicas(1) == 3
