"""The operator console's static files (issue 13), shipped inside the package.

No build step and no CDN: plain HTML, CSS and ES modules, read from this
package once and served by ``transport/console.py`` at ``/console``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
PAGE = "index.html"


@dataclass(frozen=True, slots=True)
class Asset:
    name: str
    body: bytes
    content_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """Every shipped file by name (``index.html``, ``app.js``…)."""
    out: dict[str, Asset] = {}
    root = resources.files(__name__) / "static"
    for entry in root.iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        if not entry.is_file() or suffix not in CONTENT_TYPES:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        out[name] = Asset(name, body, CONTENT_TYPES[suffix], etag)
    return out
