"""The CLI's settings: where the stack runs and where its state lives."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from intentroute.stack.natsconf import DEFAULT_SYNC_INTERVAL, sync_interval_problem
from shared.common.settings import CommonSettings, SettingError, env, is_set, read_env


class CliSettings(msgspec.Struct, frozen=True, kw_only=True):
    # NATS_URL, DATABASE_URL, INDEX_DIR, OLLAMA_MODEL_NAME and OPENAI_API_KEY are common
    # settings; the CLI reads two of them its own way (below).
    common: CommonSettings
    # NATS_URL when the environment sets it; "" (unset) means "start an embedded server"
    # (`up`) or "use the running `intentroute up`" (other commands).
    nats_url: str = ""
    # INDEX_DIR when the environment sets it, else `<state dir>/index`.
    index_dir: Path = Path(".intentroute/index")
    # TLS for the embedded nats-server: its certificate and key; with a CA the server
    # also verifies client certificates (mutual TLS).
    nats_tls_server_cert: Annotated[str, env("NATS_TLS_SERVER_CERT")] = ""
    nats_tls_server_key: Annotated[str, env("NATS_TLS_SERVER_KEY")] = ""
    nats_tls_server_ca: Annotated[str, env("NATS_TLS_SERVER_CA")] = ""
    # Reports: the key that replaces agent ids with their HMAC (`--hash-agents`): a file,
    # or the value itself (the saving is priced against `main_model`).
    agent_hash_key_file: Annotated[str, env("AGENT_HASH_KEY_FILE")] = ""
    agent_hash_key: Annotated[str, env("AGENT_HASH_KEY")] = ""
    # How often the embedded JetStream fsyncs its store: a duration or "always"
    # (docs/guides/operations/reliability.md, Durability: what a host crash can lose).
    nats_sync_interval: Annotated[str, env("NATS_SYNC_INTERVAL")] = DEFAULT_SYNC_INTERVAL
    # A file holding DATABASE_URL's password (compose's secrets: the URL names the role,
    # the password never sits in the environment).
    database_password_file: Annotated[str, env("DATABASE_PASSWORD_FILE")] = ""
    # `up`'s Ctrl-C / SIGTERM: seconds the workers get to finish the requests in flight
    # before they are stopped (`--drain-timeout`; intentroute.drain).
    up_drain_timeout: Annotated[float, env("UP_DRAIN_TIMEOUT", unit="seconds")] = 30.0
    # The embedded servers' ports under `up` (`--nats-port` / `--postgres-port` win);
    # unset: the ones the last `up` in the state dir used (ports.json), else free ones;
    # 0: a free one. With a cluster NATS_PORT is node 1's, the others the next ones.
    nats_port: Annotated[int | None, env("NATS_PORT", parse=int, blank_is_unset=True)] = None
    postgres_port: Annotated[int | None, env("POSTGRES_PORT", parse=int,
                                             blank_is_unset=True)] = None

    @property
    def state_dir(self) -> Path:
        return self.common.state_dir

    @property
    def database_url(self) -> str:
        return self.common.database_url

    @property
    def main_model(self) -> str:
        """The main slot's model (reports price the saving against it)."""
        return self.common.model_main

    @property
    def openai_api_key(self) -> str:
        """The bearer token `intentroute llm-server` requires (`up --llm` generates one)."""
        return self.common.openai_api_key

    def __post_init__(self) -> None:
        problem = sync_interval_problem(self.nats_sync_interval)
        if problem:
            raise SettingError(f"NATS_SYNC_INTERVAL: {problem}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 starting: bool = False) -> CliSettings:
        """The settings, the state folder absolute: `up`'s (`starting`: INTENTROUTE_HOME,
        else ./.intentroute), or the one a command finds from the current folder
        (intentroute.stack.home)."""
        from intentroute.stack.home import find_home, home_for_up

        common = CommonSettings.from_env(environ)
        home = (home_for_up if starting else find_home)(home_variable(common, environ))
        common = msgspec.structs.replace(common, state_dir=home.path)
        nats_url = common.nats_url if is_set(CommonSettings, "nats_url", environ) else ""
        index_dir = (common.index_dir if is_set(CommonSettings, "index_dir", environ)
                     else common.state_dir / "index")
        return read_env(cls, environ, common=common, nats_url=nats_url, index_dir=index_dir)


def home_variable(common: CommonSettings | None = None,
                  environ: Mapping[str, str] | None = None) -> str:
    """INTENTROUTE_HOME's value as the settings read it ("" when unset)."""
    common = common or CommonSettings.from_env(environ)
    return str(common.state_dir) if is_set(CommonSettings, "state_dir", environ) else ""
