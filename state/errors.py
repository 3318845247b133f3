"""The project's error tree: one root, one-line leaves per layer."""


class DelayqError(Exception):
    """Root of every error delayq raises on purpose."""


class ConfigError(DelayqError):
    """A setting is invalid; the message names the setting, the value and the fix."""


class DelayLevelError(ConfigError):
    """The delay-level string cannot be parsed."""


class JobError(DelayqError):
    """The streaming job refused to start or stopped on a condition it names."""


class DispatchError(DelayqError):
    """A dispatch task cannot go on (its supervisor starts it again); the message says why."""


class ParseError(DelayqError):
    """A batch of intake records could not be parsed as a whole; the message names them."""
