"""Who a caller is: a digest of its bearer credential, never the credential itself.

The principal keys gateway runtimes and owns sessions (issue 16 item 8). It is a
digest, so it can be stored, logged and compared without holding the secret.
"""

from __future__ import annotations

import hashlib

ANONYMOUS = "anonymous"


def digest(credential: str) -> str:
    """The principal of a bare credential (``bearer:<24 hex>``)."""
    return "bearer:" + hashlib.sha256(credential.encode()).hexdigest()[:24]


def principal_of(header: str | None) -> tuple[str, str]:
    """(principal, bare credential) of an accepted ``Authorization`` value."""
    value = (header or "").strip()
    credential = value[7:].strip() if value[:7].lower() == "bearer " else value
    if not credential:
        return ANONYMOUS, ""
    return digest(credential), credential
