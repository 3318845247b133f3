import pytest

from conf import load_settings
from state.errors import ConfigError, DelayLevelError


def test_defaults_come_from_conf(monkeypatch):
    for key in list(__import__("os").environ):
        if key.startswith("DELAYQ_"):
            monkeypatch.delenv(key)
    settings = load_settings()
    assert settings.intake_topic == "SCHEDULE_TOPIC_XXXX"
    assert settings.dlq_topic == "SCHEDULE_TOPIC_XXXX.DLQ"
    assert len(settings.level_delays_ms) == 18
    assert settings.embedded
    assert settings.bootstrap == "127.0.0.1:9092"
    assert settings.spark_master == "local[*]"


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("DELAYQ_BOOTSTRAP_SERVERS", "kafka-1:9092,kafka-2:9092")
    monkeypatch.setenv("DELAYQ_DELAY_LEVELS", "1s 2s 3s")
    monkeypatch.setenv("DELAYQ_SPARK_SHUFFLE_PARTITIONS", "7")
    settings = load_settings()
    assert not settings.embedded
    assert settings.bootstrap == "kafka-1:9092,kafka-2:9092"
    assert settings.level_delays_ms == (1_000, 2_000, 3_000)
    assert settings.spark_shuffle_partitions == 7


def test_code_overrides_environment(monkeypatch):
    monkeypatch.setenv("DELAYQ_INTAKE_TOPIC", "from-env")
    assert load_settings(intake_topic="from-code").intake_topic == "from-code"


def test_bad_levels_refused_at_start_naming_the_token(monkeypatch):
    monkeypatch.setenv("DELAYQ_DELAY_LEVELS", "1s 5x 10s")
    with pytest.raises(DelayLevelError, match="'5x'"):
        load_settings()


def test_bad_value_names_the_setting(monkeypatch):
    monkeypatch.setenv("DELAYQ_KAFKA_PORT", "not-a-port")
    with pytest.raises(ConfigError, match="kafka_port"):
        load_settings()


def test_unknown_choice_is_refused(monkeypatch):
    monkeypatch.setenv("DELAYQ_SECURITY_PROTOCOL", "CARRIER_PIGEON")
    with pytest.raises(ConfigError, match="security_protocol"):
        load_settings()


def test_secrets_are_never_printed(monkeypatch):
    monkeypatch.setenv("DELAYQ_SASL_PASSWORD", "hunter2")
    settings = load_settings()
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in str(settings)
    assert settings.sasl_password.get_secret_value() == "hunter2"


def test_settings_are_frozen():
    settings = load_settings()
    with pytest.raises(Exception):
        settings.intake_topic = "other"


def test_the_short_levels_split_must_stay_within_the_near_horizon():
    """Past near_horizon a level's messages may be cold, by the clock; the split would not be a
    rule of the row alone."""
    with pytest.raises(ConfigError, match="dispatch_direct_max_delay_ms"):
        load_settings(near_horizon="10s", dispatch_direct_max_delay_ms=12000)
    assert load_settings(near_horizon="12s", dispatch_direct_max_delay_ms=12000)
    assert load_settings(near_horizon="10s", dispatch_direct_max_delay_ms=-1)


@pytest.mark.parametrize("setting, bad, good", [
    ("slot_ms", 0, 1), ("heartbeat_ms", -5, 1), ("job_restarts", -1, 0),
    ("fire_lead_ms", -1, 0), ("spark_ui_port", -1, 0), ("spark_ui_port", 65536, 65535),
    ("ledger_interval", "0s", "1s"), ("produce_timeout", "30", "30s"),
    ("executor_slots_wait", "2 minutes", "2m"),
])
def test_each_setting_s_range_is_checked_naming_it(setting, bad, good):
    with pytest.raises(ConfigError, match=setting):
        load_settings(**{setting: bad})
    assert getattr(load_settings(**{setting: good}), setting) == good


def test_a_cold_bucket_rolls_into_the_rings_when_it_fits_them():
    """A bucket rolls the ring's horizon less itself and clock_tolerance ahead when that leaves
    at least twice the tolerance (the defaults: 10 min - 5 min - 1 min = 4 min); else, as with
    the former 1 h buckets, near_horizon + clock_tolerance ahead, into the wheel."""
    settings = load_settings()
    assert settings.rolls_to_ring and settings.roll_lead_ms == 240_000
    hour = load_settings(cold_bucket="1h")
    assert not hour.rolls_to_ring and hour.roll_lead_ms == 660_000
    assert not load_settings(ring_slots=0).rolls_to_ring
    assert load_settings(cold_bucket="7m").rolls_to_ring
    assert not load_settings(cold_bucket="7m", clock_tolerance="61s").rolls_to_ring
