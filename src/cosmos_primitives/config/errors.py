"""The one error type of the config loader."""


class ConfigError(ValueError):
    """A config file or override is invalid. The message names the file, the key and what to do."""
