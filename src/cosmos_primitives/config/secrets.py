"""Secrets out of every saved or logged config: URL passwords and credential fields become ``***``.

The config in memory keeps the real values (the run needs them); only the copies written to
``run_dir/config.toml`` (:func:`~cosmos_primitives.config.dump_config`) and sent to W&B
(:class:`~cosmos_primitives.logging.MetricsTracker`) go through :func:`redact_secrets`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

# a key part that names a credential ("redis_password", "hf_token", "api_key", "auth", ...)
_SECRET_PARTS = frozenset({"password", "passwd", "pwd", "secret", "token", "credential", "credentials", "apikey",
                           "auth", "authorization", "passphrase"})
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"),
                           ("session", "key"), ("client", "secret")})
# ...unless the key names where the secret is or which one it is, not the secret ("token_env",
# "password_file", "access_key_id", "pad_token_id")
_POINTER_SUFFIXES = frozenset({"env", "file", "path", "var", "id", "name"})
# query parameters that carry credentials (pre-signed URLs, token auth)
_QUERY_SECRETS = frozenset({"sig", "signature", "key", "x-amz-signature", "x-amz-credential",
                            "x-amz-security-token", "x-goog-signature", "x-goog-credential"})

_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://(?P<user>[^:@/\s?#]*)):(?P<password>[^/\s?#]*)@")
_QUERY_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[^=&;#\s]+)=)(?P<value>[^&;#\s]*)")


def is_secret_key(name: str) -> bool:
    """Whether a config key's name says it holds a credential (``password``, ``hf_token``,
    ``api_key``, ``client_secret``...; not ``token_env``, ``max_tokens`` or ``tokenizer``)."""
    parts = [p for p in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if p]
    if not parts or parts[-1] in _POINTER_SUFFIXES:
        return False
    return bool(_SECRET_PARTS.intersection(parts)) or any(pair in _SECRET_PAIRS for pair in itertools.pairwise(parts))


def redact_url(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` and the value of every
    credential query parameter (``?token=...``, ``X-Amz-Signature=...``) replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m['head']}:{REDACTED}@" if m["password"] else m[0], text)

    def query(m: re.Match[str]) -> str:
        name = m["name"].lower()
        secret = name in _QUERY_SECRETS or is_secret_key(name)
        return f"{m['head']}{REDACTED}" if secret and m["value"] else m[0]

    return _QUERY_PARAM.sub(query, text) if "://" in text else text


def redact_secrets(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a nested config dict with secrets replaced by ``***``: non-empty string values of
    keys :func:`is_secret_key` matches, and URL credentials (:func:`redact_url`) in every string."""
    return {key: _redact(value, is_secret_key(str(key))) for key, value in tree.items()}


def _redact(value: Any, secret: bool) -> Any:
    if isinstance(value, Mapping):
        return redact_secrets(value)
    if isinstance(value, (list, tuple)):
        return [_redact(item, secret) for item in value]
    if isinstance(value, str):
        return REDACTED if secret and value else redact_url(value)
    return value
