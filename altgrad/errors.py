"""ConfigError: the one error type for a configuration value that cannot work (a leaf module, imported by both
`altgrad.config` and the modules its checks call, so none of them imports the other in a circle)."""


class ConfigError(ValueError):
    """A configuration value that cannot work; the message is one line naming the key, the value and what is valid."""
