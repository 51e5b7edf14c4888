"""Random secrets that are not key pairs: bootstrap/join tokens and symmetric secrets."""

from __future__ import annotations

import base64
import re
import secrets
import string

_TOKEN_ALPHABET = string.ascii_lowercase + string.digits
#: The shape Kubernetes bootstrap tokens (and the original's machine tokens) must have.
BOOTSTRAP_TOKEN_RE = re.compile(r"^[a-z0-9]{6}\.[a-z0-9]{16}$")


def _random_chars(count: int) -> str:
    return "".join(secrets.choice(_TOKEN_ALPHABET) for _ in range(count))


def bootstrap_token() -> str:
    """A Kubernetes bootstrap token ``<id>.<secret>`` (6 and 16 characters of ``[a-z0-9]``)."""
    return f"{_random_chars(6)}.{_random_chars(16)}"


def random_secret(nbytes: int = 32) -> str:
    """Base64 of ``nbytes`` random bytes (aescbc encryption secret, cluster secret)."""
    return base64.b64encode(secrets.token_bytes(nbytes)).decode("ascii")
