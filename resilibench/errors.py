"""The exceptions library code raises for bad input or state, each naming the field at fault.

Library functions never speak of command-line flags: a front end turns ``InputError.field`` into its own
wording (the CLI writes ``output_dir`` as ``--output-dir``) and prints ``InputError.message`` in one line.
"""

from __future__ import annotations

__all__ = [
    "InputError", "ConfigError", "RunDirectoryError", "ConfigChanged", "DirectoryBusy", "RunInterrupted",
]


class InputError(ValueError):
    """Bad input, named by ``field`` (a parameter or settings field: "output_dir", "rules.turn_limit")."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ConfigError(InputError):
    """A setting with a bad value, or an unknown one; ``field`` is its dotted name (``rules.turn_limit``)
    and the message starts with it."""

    def __init__(self, field: str, message: str) -> None:
        ValueError.__init__(self, message)
        self.field = field
        self.message = message


class RunDirectoryError(InputError):
    """A long job's output directory cannot take this run (not a directory, unreadable or foreign files)."""

    def __init__(self, message: str, field: str = "output_dir"):
        super().__init__(field, message)


class ConfigChanged(RunDirectoryError):
    """The directory holds results of another configuration; ``differences`` lists them as
    ``"path: old -> new"`` (``resilibench.results.json_diff``)."""

    def __init__(self, message: str, differences: list[str], field: str = "output_dir"):
        super().__init__(message, field)
        self.differences = differences


class DirectoryBusy(RunDirectoryError):
    """Another process holds the directory's lock: two writers would interleave their rows."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a long job, after its directory was left resumable; ``str()`` says where the finished
    rows are and how to resume. A KeyboardInterrupt, so callers that do not know it still stop."""
