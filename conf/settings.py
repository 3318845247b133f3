"""One typed, frozen settings object: `conf/defaults.toml` < environment (DELAYQ_*) < code.
Credentials are `SecretStr`: printed as '**********', read with `.get_secret_value()`."""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (AfterValidator, Field, NonNegativeInt, PositiveInt, SecretStr,
                      ValidationError, ValidationInfo, model_validator)
from pydantic_settings import BaseSettings, SettingsConfigDict, TomlConfigSettingsSource

from state.errors import ConfigError, DelayLevelError
from state.levels import parse_duration, parse_levels

CONF_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = CONF_DIR.parent
ENV_PREFIX = "DELAYQ_"


def _parses(parse, error: type[ConfigError]) -> AfterValidator:
    """Refuse a value `parse` cannot read, naming the setting; `error` is not a ValueError, so
    pydantic lets it through unwrapped."""
    def check(value: str, info: ValidationInfo) -> str:
        try:
            parse(value)
        except DelayLevelError as exc:
            raise error(f"setting {info.field_name}={value!r}: {exc}") from None
        return value
    return AfterValidator(check)


Levels = Annotated[str, _parses(parse_levels, DelayLevelError)]
Duration = Annotated[str, _parses(parse_duration, ConfigError)]


def _ms(setting: str) -> property:
    return property(lambda self: parse_duration(getattr(self, setting)))


def _seconds(setting: str) -> property:
    return property(lambda self: parse_duration(getattr(self, setting)) / 1000)


def _in_store(folder: str) -> property:
    return property(lambda self: f"{self.store_root}/{folder}")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, toml_file=CONF_DIR / "defaults.toml",
                                      frozen=True, extra="forbid")

    bootstrap_servers: str
    intake_topic: str
    dlq_topic: str
    allowed_topics: str
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    sasl_username: str
    sasl_password: SecretStr
    ssl_cafile: str
    produce_timeout: Duration
    connect_timeout: Duration

    kafka_host: str
    kafka_port: PositiveInt
    kafka_controller_port: PositiveInt
    kafka_heap: str

    delay_levels: Levels
    max_delay: Duration
    clock_tolerance: Duration
    near_horizon: Duration
    cold_bucket: Duration
    downtime_tolerance: Duration

    slot_ms: PositiveInt
    timer_parts: Annotated[int, Field(ge=1, le=1024)]
    fire_lead_ms: NonNegativeInt
    ready_partitions: NonNegativeInt
    dispatch_commit_interval_ms: PositiveInt
    delivery: Literal["at_least_once", "exactly_once"]
    dispatch_transaction_ms: PositiveInt
    dispatch_max_held: PositiveInt
    dispatch_gather_ms: PositiveInt
    dispatch_urgent_gather_ms: NonNegativeInt
    dispatch_topic_wait_ms: PositiveInt
    dispatch_ack_check_ms: PositiveInt
    dispatch_producer_stall: Duration
    dispatch_max_failures: PositiveInt
    dispatch_failure_window: Duration
    dispatch_restart_backoff: Levels
    dispatch_liveness_timeout: Duration
    dispatch_kill_timeout: Duration
    dispatch_skip_deadline: Duration
    dispatch_retry_backoff_ms: PositiveInt
    dispatch_ledger_batch: PositiveInt
    dispatch_read_batch: PositiveInt
    dispatch_probe_interval_ms: PositiveInt
    dispatch_intake_refresh_ms: PositiveInt
    dispatch_direct_max_delay_ms: int
    ring_slots: NonNegativeInt
    ring_slot_ms: PositiveInt
    ring_read_lead_ms: NonNegativeInt
    ring_markers_wait_ms: PositiveInt
    ring_write_ms: NonNegativeInt
    dispatch_fetch_gap: NonNegativeInt
    dispatch_jvm_nice: Annotated[int, Field(ge=0, le=19)]
    fire_lead_per_message_us: NonNegativeInt
    heartbeat_ms: PositiveInt
    wheel_trigger_ms: NonNegativeInt
    late_tolerance: Duration
    max_offsets_per_trigger: int
    ready_linger_ms: NonNegativeInt
    ready_batch_kb: PositiveInt

    ledger: bool
    ledger_interval: Duration

    metrics_host: str
    metrics_port: int

    data_dir: Path
    jars_dir: str
    store: str
    s3_endpoint: str
    s3_region: str
    s3_access_key: str
    s3_secret_key: SecretStr
    s3_path_style: bool
    s3_port: PositiveInt

    spark_master: str
    spark_app_name: str
    spark_driver_memory: str
    spark_ui_port: Annotated[int, Field(ge=0, le=65535)]   # 0: any free port
    spark_shuffle_partitions: NonNegativeInt
    executor_slots_wait: Duration
    job_restarts: NonNegativeInt
    spark_log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"]
    log_level: Literal["ERROR", "WARNING", "INFO", "DEBUG"]
    spark_executor_memory: str
    cluster_host: str
    cluster_port: PositiveInt
    cluster_webui_port: PositiveInt
    cluster_workers: PositiveInt
    cluster_worker_cores: PositiveInt
    cluster_worker_memory: str

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, **_):
        # Code, then the environment, then defaults.toml; no .env file, no secrets directory.
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    @model_validator(mode="after")
    def _direct_levels_are_near(self) -> "Settings":
        # Levels up to near_horizon are never cold: who takes them is a rule of the row alone.
        if self.dispatch_direct_max_delay_ms > self.near_horizon_ms:
            raise ConfigError(
                f"setting dispatch_direct_max_delay_ms={self.dispatch_direct_max_delay_ms} is "
                f"beyond near_horizon={self.near_horizon!r}: the levels between them would go "
                f"to the cold tier or the dispatch tasks depending on the clock; keep it at "
                f"most near_horizon")
        return self

    @cached_property
    def level_delays_ms(self) -> tuple[int, ...]:
        return parse_levels(self.delay_levels)

    max_delay_ms = _ms("max_delay")
    clock_tolerance_ms = _ms("clock_tolerance")
    near_horizon_ms = _ms("near_horizon")
    cold_bucket_ms = _ms("cold_bucket")
    downtime_tolerance_ms = _ms("downtime_tolerance")
    late_tolerance_ms = _ms("late_tolerance")
    ledger_interval_ms = _ms("ledger_interval")
    dispatch_failure_window_ms = _ms("dispatch_failure_window")
    dispatch_liveness_timeout_ms = _ms("dispatch_liveness_timeout")
    dispatch_kill_timeout_s = _seconds("dispatch_kill_timeout")
    dispatch_skip_deadline_s = _seconds("dispatch_skip_deadline")
    dispatch_producer_stall_s = _seconds("dispatch_producer_stall")
    produce_timeout_s = _seconds("produce_timeout")
    connect_timeout_s = _seconds("connect_timeout")
    executor_slots_wait_s = _seconds("executor_slots_wait")
    cold_path = _in_store("tables/cold")
    checkpoint_path = _in_store("checkpoints/delivery")
    ledger_path = _in_store("tables/ledger")
    dead_letter_path = _in_store("tables/dead_letters")
    ready_topic = property(lambda self: f"{self.intake_topic}.READY")
    ledger_topic = property(lambda self: f"{self.intake_topic}.LEDGER")
    ring_topic = property(lambda self: f"{self.intake_topic}.TIMERS")

    @property
    def ring_horizon_ms(self) -> int:
        """How far after its append a timer may be due to go to the ring (0: no ring): two
        slots short of a turn, so a slot is never written while it is read or after, and no
        further than near_horizon, where the cold tier begins."""
        turn = (self.ring_slots - 2) * self.ring_slot_ms if self.ring_slots >= 3 else 0
        return min(turn, self.near_horizon_ms)

    @property
    def rolls_to_ring(self) -> bool:
        """Whether a cold bucket, rolled `roll_lead_ms` before it starts, fits the ring: each of
        its timers due within the ring's horizon of the roll, a driver clock off the broker's by
        up to clock_tolerance either way, and the roll at least twice that ahead."""
        return self.ring_horizon_ms > 0 and self._ring_lead_ms >= 2 * self.clock_tolerance_ms

    @property
    def roll_lead_ms(self) -> int:
        """How long before a cold bucket starts, by the driver's clock, it rolls onto the
        intake: into the rings (`rolls_to_ring`), or into the wheel, near_horizon ahead (and
        clock_tolerance more: the driver's clock may trail the broker's, DESIGN.md 3)."""
        return self._ring_lead_ms if self.rolls_to_ring else \
            self.near_horizon_ms + self.clock_tolerance_ms

    _ring_lead_ms = property(lambda self: self.ring_horizon_ms - self.cold_bucket_ms
                             - self.clock_tolerance_ms)
    data_path = property(lambda self: self.data_dir.resolve())

    @property
    def intake_retention_needed_ms(self) -> int:
        """The intake's minimum retention.ms: a pending message's body must outlive its wait."""
        return (self.near_horizon_ms + self.cold_bucket_ms + self.clock_tolerance_ms
                + self.downtime_tolerance_ms)

    @cached_property
    def dispatch_restart_backoff_ms(self) -> tuple[int, ...]:
        return parse_levels(self.dispatch_restart_backoff)

    @property
    def heartbeat_partition(self) -> int:
        """The intake partition after the levels' (level L is partition L-1), for heartbeats, so
        a level's partition (and its delayOffset) holds only that level's messages."""
        return len(self.level_delays_ms)

    @property
    def embedded(self) -> bool:
        """No bootstrap servers configured: the local broker is the service's Kafka."""
        return not self.bootstrap_servers.strip()

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_servers.strip() or f"{self.kafka_host}:{self.kafka_port}"

    @property
    def store_root(self) -> str:
        """Where checkpoints and tables live: the store's URI, or data_dir on this machine."""
        return self.store.strip().rstrip("/") or str(self.data_path)

    @property
    def jars_path(self) -> Path:
        return Path(self.jars_dir).resolve() if self.jars_dir else PROJECT_ROOT / ".lib"

    @property
    def allowed_topic_set(self) -> frozenset[str]:
        return frozenset(self.allowed_topics.replace(",", " ").split())


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
        raise ConfigError(f"invalid settings: {problems}. Fix conf/defaults.toml or the "
                          f"{ENV_PREFIX}* environment variable.") from None
