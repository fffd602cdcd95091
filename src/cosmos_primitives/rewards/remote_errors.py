"""Errors raised by the reward-service client; each names the URL and what to do."""

from __future__ import annotations


class RemoteRewardError(RuntimeError):
    """Base class. ``url`` is the endpoint involved; ``status`` the last HTTP status (None if none)."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class RemoteRewardAuthError(RemoteRewardError):
    """HTTP 401: the token was missing or wrong."""


class RemoteRewardUnreachable(RemoteRewardError):
    """No connection could be made within the retries (server down, wrong host or port)."""


class RemoteRewardTimeout(RemoteRewardError):
    """The server accepted connections but did not answer in time, or a result never became ready."""


class RemoteRewardBusy(RemoteRewardError):
    """HTTP 503: the server's pending queue stayed full."""


class RemoteRewardRejected(RemoteRewardError):
    """The server refused the request (a 4xx other than 400-on-fetch and 401, or a 5xx)."""


class RemoteRewardBadReply(RemoteRewardError):
    """The reply did not follow the protocol (not JSON, missing keys, wrong number of scores)."""
