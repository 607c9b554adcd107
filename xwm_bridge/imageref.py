"""``/api/ping`` fields from the IMAGE reference (adapters.md §6). Pure."""

from __future__ import annotations

import re

_HEX40 = re.compile(r"[0-9a-f]{40}")


def ping_fields(image: str) -> dict[str, str]:
    image = image.strip()
    if not image:
        return {"status": "ok", "image": "", "tag": "", "commit": "", "version": ""}
    ref = image.rsplit("@", 1)[0] if "@" in image else image
    colon, slash = ref.rfind(":"), ref.rfind("/")
    tag = ref[colon + 1 :] if colon > slash else ref
    # fullmatch: ``^…$`` with ``match`` took a tag ending in a newline for a commit
    commit = tag if _HEX40.fullmatch(tag) else ""
    return {"status": "ok", "image": image, "tag": tag, "commit": commit, "version": tag}
