"""The one error type of the config loader."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config file or override is invalid. The message names the file, the key and what to do.

    ``problems``: one line per problem found (a file's problems are all reported at once).
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems) if problems else [message]

    def __reduce__(self):  # picklable across processes with its problems
        return (type(self), (str(self), self.problems))
