"""The console's files ship inside the package (hatchling puts them in the wheel)."""

from __future__ import annotations

from xwm_bridge.console import load_assets


def test_assets_are_in_the_package() -> None:
    assets = load_assets()
    assert {"index.html", "app.js", "console.css", "icon.svg"} <= set(assets)
    page = assets["index.html"].body.decode()
    assert '<script type="module" src="/console/static/app.js">' in page
    assert "<script>" not in page and "style=" not in page  # the CSP forbids inline code
    assert assets["app.js"].content_type.startswith("text/javascript")
    assert all(a.etag.startswith('"') for a in assets.values())
