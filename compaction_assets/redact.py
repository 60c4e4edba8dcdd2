"""Keep credentials out of every message: errors, logs, Dagster metadata, the ledger.

Config loading registers each credential it sees (values of keys such as `uri`, `*password*`,
`*secret*`, `*token*`, `s3.*key*`, `client.*key*` (pyiceberg's store-wide s3.* names), `adls.*key*`,
the password inside a URI, and `${VAR}` values whose variable is named like a credential); `redact`
replaces them, and any `user:password@` in a URI, with `***`.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit

MASK = "***"
_SECRET_KEY = re.compile(
    r"(^|[._-])(uri|url|dsn)$|password|passwd|secret|token|credential|(^(s3|client|adls)\..*key)", re.I
)
_URI_KEY = re.compile(r"(^|[._-])(uri|url|dsn)$", re.I)
_SECRET_VAR = re.compile(r"password|passwd|secret|token|key|credential", re.I)
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*:)(?P<password>[^@\s/]+)@")
_MIN_LENGTH = 4  # shorter values ("1", "on") would mask ordinary text
_secrets: set[str] = set()


def is_secret_key(key: str) -> bool:
    """Whether a config key (its last part, e.g. "uri" or "s3.secret-access-key") holds a credential."""
    return bool(_SECRET_KEY.search(key))


def is_secret_variable(name: str) -> bool:
    return bool(_SECRET_VAR.search(name))


def register(key: str, value: object) -> None:
    """Remember the credential config key `key` holds so `redact` masks it: a URI's password (the
    rest of a URI names the thing and stays readable), any other credential key's whole value."""
    if not isinstance(value, str) or not is_secret_key(key):
        return
    if _URI_KEY.search(key):
        try:
            secret = urlsplit(value).password
        except ValueError:
            secret = None
    else:
        secret = value
    if secret and len(secret) >= _MIN_LENGTH:
        _secrets.add(secret)


def register_value(value: str) -> None:
    """Remember a credential given as a bare value (a `${VAR}` named like one)."""
    if len(value) >= _MIN_LENGTH:
        _secrets.add(value)


def redact(text: object) -> str:
    """`text` as a string with every registered credential and URI password replaced by ***."""
    out = _URI_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", str(text))
    for secret in sorted(_secrets, key=len, reverse=True):
        out = out.replace(secret, MASK)
    return out


class RedactingFilter(logging.Filter):
    """A log filter that masks credentials in the formatted message (install on handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
