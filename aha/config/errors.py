"""The one error type of the config package."""


class ConfigError(ValueError):
    """A config key or value is wrong; the message names it."""
