"""Where `start` got its settings, so a running tree can read them again (`supervisor.reload`)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from orchestra_sup.config import Settings, load_settings, with_http, with_metrics


class ConfigSource(msgspec.Struct, frozen=True, kw_only=True):
    """Where `start` got its settings: `path` the config file (absolute; None: no `--config`,
    defaults only, nothing to re-read), `shards`, `lanes_per_shard`, `metrics_port` and
    `metrics_host`, `http` its command-line overrides (None: not given). Carried across a
    re-exec (`reexec.Handoff`)."""

    path: str | None = None
    shards: int | None = None
    lanes_per_shard: int | None = None
    metrics_port: int | None = None
    metrics_host: str | None = None
    http: str | None = None

    def load(self) -> Settings:
        """The settings as `start` would read them now (`config.load_settings`). Raises
        `ConfigError` (one line naming the file, and the key and value when it is one)."""
        settings = load_settings(
            Path(self.path) if self.path is not None else None,
            shards=self.shards,
            lanes_per_shard=self.lanes_per_shard,
        )
        return with_http(with_metrics(settings, self.metrics_port, self.metrics_host), self.http)
