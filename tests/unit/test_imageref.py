"""xwm_bridge.imageref.ping_fields: /api/ping fields from IMAGE (adapters.md §6)."""

from __future__ import annotations

import pytest

from xwm_bridge.imageref import ping_fields

HEX40 = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("image", "tag", "commit"),
    [
        # the three rows of adapters.md §6
        (f"ghcr.io/x-evor/xworkmate-bridge:{HEX40}", HEX40, HEX40),
        ("ghcr.io/x-evor/xworkmate-bridge:main-2026-04-12", "main-2026-04-12", ""),
        ("registry:5000/app@sha256:abc", "registry:5000/app", ""),
        # more of the same rules
        ("ghcr.io/x/y", "ghcr.io/x/y", ""),  # no tag: the whole reference (quirk)
        ("app:1.2.3@sha256:deadbeef", "1.2.3", ""),
        ("registry:5000/app:v1", "v1", ""),
        (f"app:{HEX40.upper()}", HEX40.upper(), ""),  # upper-case hex is not a commit
        (f"app:{HEX40}0", f"{HEX40}0", ""),  # 41 characters
        (HEX40, HEX40, HEX40),
        ("a@b@c", "a@b", ""),  # only from the last @
        (f"app:{HEX40}\n@sha256:abc", f"{HEX40}\n", ""),  # a trailing newline is not hex
    ],
)
def test_image_fields(image: str, tag: str, commit: str) -> None:
    assert ping_fields(image) == {
        "status": "ok",
        "image": image,
        "tag": tag,
        "commit": commit,
        "version": tag,
    }


@pytest.mark.parametrize("image", ["", "   ", "\n"])
def test_empty_image(image: str) -> None:
    assert ping_fields(image) == {
        "status": "ok",
        "image": "",
        "tag": "",
        "commit": "",
        "version": "",
    }


def test_image_is_trimmed() -> None:
    fields = ping_fields("  app:v2  ")
    assert fields["image"] == "app:v2"
    assert fields["tag"] == fields["version"] == "v2"
