"""One typed, frozen settings object: `conf/defaults.toml` < environment (DELAYQ_*) < code.

Credentials are `SecretStr`: printed as '**********', read with `.get_secret_value()`.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from state.errors import ConfigError, DelayLevelError
from state.levels import parse_duration, parse_levels

CONF_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = CONF_DIR.parent
ENV_PREFIX = "DELAYQ_"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        toml_file=CONF_DIR / "defaults.toml",
        frozen=True,
        extra="forbid",
    )

    bootstrap_servers: str
    intake_topic: str
    dlq_topic: str
    allowed_topics: str
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    sasl_username: str
    sasl_password: SecretStr
    ssl_cafile: str
    produce_timeout: str

    kafka_host: str
    kafka_port: int
    kafka_controller_port: int
    kafka_heap: str

    delay_levels: str
    max_delay: str
    clock_tolerance: str
    near_horizon: str
    cold_bucket: str

    slot_ms: int
    fire_lead_ms: int
    ready_partitions: int
    dispatch_commit_interval_ms: int
    dispatch_max_held: int
    dispatch_gather_ms: int
    dispatch_topic_wait_ms: int
    dispatch_max_failures: int
    dispatch_failure_window: str
    dispatch_restart_backoff: str
    dispatch_retry_backoff_ms: int
    dispatch_ledger_batch: int
    dispatch_probe_interval_ms: int
    dispatch_intake_refresh_ms: int
    dispatch_replay_window: str
    dispatch_direct_max_delay_ms: int
    wheel_operator: Literal["applyInPandasWithState", "transformWithState"]
    wheel_chunk_kb: int
    fire_lead_per_message_us: int
    heartbeat_ms: int
    wheel_trigger_ms: int
    late_tolerance: str
    max_offsets_per_trigger: int
    ready_linger_ms: int
    ready_batch_kb: int

    ledger: bool
    ledger_interval: str

    metrics_host: str
    metrics_port: int

    data_dir: Path
    jars_dir: str
    store: str

    spark_master: str
    spark_app_name: str
    spark_driver_memory: str
    spark_ui_port: int
    spark_shuffle_partitions: int
    executor_slots_wait: str
    job_restarts: int
    spark_log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"]
    log_level: Literal["ERROR", "WARNING", "INFO", "DEBUG"]
    spark_executor_memory: str
    cluster_host: str
    cluster_port: int
    cluster_webui_port: int
    cluster_workers: int
    cluster_worker_cores: int
    cluster_worker_memory: str

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    @field_validator("delay_levels", "dispatch_restart_backoff")
    @classmethod
    def _levels_parse(cls, value: str, info: ValidationInfo) -> str:
        # A DelayLevelError is not a ValueError, so pydantic lets it through unwrapped.
        try:
            parse_levels(value)
        except DelayLevelError as exc:
            raise DelayLevelError(f"setting {info.field_name}={value!r}: {exc}") from None
        return value

    @field_validator("max_delay", "clock_tolerance", "late_tolerance", "near_horizon",
                     "cold_bucket", "ledger_interval", "dispatch_replay_window",
                     "dispatch_failure_window", "produce_timeout", "executor_slots_wait")
    @classmethod
    def _duration_parses(cls, value: str, info: ValidationInfo) -> str:
        try:
            parse_duration(value)
        except DelayLevelError as exc:
            raise ConfigError(f"setting {info.field_name}={value!r}: {exc}") from None
        return value

    @field_validator("spark_ui_port")
    @classmethod
    def _port_or_any(cls, value: int) -> int:
        if not 0 <= value <= 65535:
            raise ValueError(f"must be a port number, or 0 for any free port; got {value}")
        return value

    @field_validator("kafka_port", "kafka_controller_port",
                     "slot_ms", "heartbeat_ms", "cluster_port", "cluster_webui_port",
                     "dispatch_commit_interval_ms", "dispatch_max_held", "dispatch_gather_ms",
                     "dispatch_topic_wait_ms", "dispatch_max_failures", "wheel_chunk_kb",
                     "dispatch_retry_backoff_ms", "dispatch_ledger_batch",
                     "dispatch_probe_interval_ms", "dispatch_intake_refresh_ms", "ready_batch_kb",
                     "cluster_workers", "cluster_worker_cores")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError(f"must be positive, got {value}")
        return value

    @field_validator("fire_lead_ms", "fire_lead_per_message_us", "spark_shuffle_partitions",
                     "ready_partitions", "wheel_trigger_ms", "ready_linger_ms")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"must not be negative, got {value}")
        return value

    @model_validator(mode="after")
    def _direct_levels_are_near(self) -> "Settings":
        # A level message is cold only when its level's delay exceeds near_horizon; up to it,
        # whether the dispatch tasks or the wheel take it is a rule of the row alone.
        if self.dispatch_direct_max_delay_ms > self.near_horizon_ms:
            raise ConfigError(
                f"setting dispatch_direct_max_delay_ms={self.dispatch_direct_max_delay_ms} is "
                f"beyond near_horizon={self.near_horizon!r}: the levels between them would go "
                f"to the cold tier or the dispatch tasks depending on the clock; keep it at "
                f"most near_horizon")
        return self

    # ---- derived values -------------------------------------------------------------
    @cached_property
    def level_delays_ms(self) -> tuple[int, ...]:
        return parse_levels(self.delay_levels)

    @property
    def max_delay_ms(self) -> int:
        return parse_duration(self.max_delay)

    @property
    def clock_tolerance_ms(self) -> int:
        return parse_duration(self.clock_tolerance)

    @property
    def near_horizon_ms(self) -> int:
        return parse_duration(self.near_horizon)

    @property
    def cold_bucket_ms(self) -> int:
        return parse_duration(self.cold_bucket)

    @property
    def cold_path(self) -> str:
        return f"{self.store_root}/tables/cold"

    @property
    def late_tolerance_ms(self) -> int:
        return parse_duration(self.late_tolerance)

    @property
    def checkpoint_path(self) -> str:
        return f"{self.store_root}/checkpoints/delivery"

    @property
    def ledger_interval_ms(self) -> int:
        return parse_duration(self.ledger_interval)

    @property
    def dispatch_replay_window_ms(self) -> int:
        return parse_duration(self.dispatch_replay_window)

    @property
    def dispatch_failure_window_ms(self) -> int:
        return parse_duration(self.dispatch_failure_window)

    @property
    def produce_timeout_s(self) -> float:
        return parse_duration(self.produce_timeout) / 1000

    @property
    def executor_slots_wait_s(self) -> float:
        return parse_duration(self.executor_slots_wait) / 1000

    @cached_property
    def dispatch_restart_backoff_ms(self) -> tuple[int, ...]:
        return parse_levels(self.dispatch_restart_backoff)

    @property
    def heartbeat_partition(self) -> int:
        """The intake partition after the levels' (level L is partition L-1): the job's
        heartbeats go there, so a level's partition, and its delayOffset, holds only that
        level's messages."""
        return len(self.level_delays_ms)

    @property
    def ready_topic(self) -> str:
        return f"{self.intake_topic}.READY"

    @property
    def ledger_topic(self) -> str:
        return f"{self.intake_topic}.LEDGER"

    @property
    def ledger_path(self) -> str:
        return f"{self.store_root}/tables/ledger"

    @property
    def dead_letter_path(self) -> str:
        return f"{self.store_root}/tables/dead_letters"

    @property
    def embedded(self) -> bool:
        """No bootstrap servers configured: the local broker is the service's Kafka."""
        return not self.bootstrap_servers.strip()

    @property
    def bootstrap(self) -> str:
        if self.embedded:
            return f"{self.kafka_host}:{self.kafka_port}"
        return self.bootstrap_servers.strip()

    @property
    def store_root(self) -> str:
        """Where checkpoints and tables live: the store's URI, or data_dir on this machine."""
        return self.store.strip().rstrip("/") or str(self.data_path)

    @property
    def data_path(self) -> Path:
        return self.data_dir.resolve()

    @property
    def jars_path(self) -> Path:
        return Path(self.jars_dir).resolve() if self.jars_dir else PROJECT_ROOT / ".lib"

    @property
    def allowed_topic_set(self) -> frozenset[str]:
        return frozenset(t for t in self.allowed_topics.replace(",", " ").split() if t)


def _shown(error: dict) -> str:
    """The offending value for an error report; never a secret, never the whole input."""
    if error["type"] == "missing" or isinstance(error.get("input"), dict):
        return ""
    if any("password" in str(p) for p in error["loc"]):
        return " (got ***)"
    return f" (got {error.get('input')!r})"


def load_settings(**overrides: object) -> Settings:
    """Build the settings, turning pydantic's report into one ConfigError an operator reads."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}{_shown(e)}" for e in exc.errors())
        raise ConfigError(
            f"invalid settings: {problems}. Fix conf/defaults.toml or the "
            f"{ENV_PREFIX}* environment variable."
        ) from None
