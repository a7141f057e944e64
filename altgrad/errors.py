"""The errors a user can cause, each reported as one line: ConfigError, for a configuration value that cannot work
(a leaf module, imported by both `altgrad.config` and the modules its checks call, so none of them imports the other
in a circle), and StorageError, for a file a run cannot write."""

import errno


class ConfigError(ValueError):
    """A configuration value that cannot work; the message is one line naming the key, the value and what is valid."""


class StorageError(RuntimeError):
    """A file of a run could not be written (a full disk, a read-only or vanished folder): one line naming the file,
    the system's reason and what summary.json records."""


STORAGE_ERRNOS = frozenset(getattr(errno, name) for name in
                           ("ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EACCES", "EPERM", "EIO", "ENOENT", "ENOTDIR")
                           if hasattr(errno, name))
"""OSError numbers that mean "this file cannot be written here", not a bug: reported as StorageError."""
