"""What each stdio provider's agent said about itself: its ``initialize`` answer
(name, version, capabilities, authMethods) and the models and modes of its
sessions. Learnt when the agent first starts and opens a session, refreshed on
every later one, kept in memory and in ``<state dir>/agent-catalog.json`` so
``acp.capabilities`` shows it after a restart before the agent runs again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from xwm_bridge.providers.stdio.features import AgentFeatures
from xwm_bridge.providers.stdio.options import SessionOptions

log = logging.getLogger("xwm_bridge.agents")
FILE_NAME = "agent-catalog.json"
MAX_CHOICES = 200


class AgentCatalog:
    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._entries: dict[str, dict[str, Any]] = {}
        if path is not None:
            try:
                data = orjson.loads(path.read_bytes())
                if isinstance(data, dict):
                    self._entries = {k: v for k, v in data.items() if isinstance(v, dict)}
            except (OSError, orjson.JSONDecodeError):
                pass

    def get(self, provider_id: str) -> dict[str, Any]:
        return self._entries.get(provider_id.lower(), {})

    def models(self, provider_id: str) -> set[str]:
        return {m["id"] for m in self.get(provider_id).get("models") or [] if "id" in m}

    def takes(self, provider_id: str, capability: str) -> bool:
        """Did the agent's own ``initialize`` say ``promptCapabilities.<capability>: true``?
        (False while it never ran.)"""
        caps = self.get(provider_id).get("promptCapabilities")
        return isinstance(caps, dict) and caps.get(capability) is True

    def learn_init(self, provider_id: str, init: dict[str, Any]) -> None:
        features = AgentFeatures.of(init)
        info = init.get("agentInfo")
        entry = self._entries.setdefault(provider_id.lower(), {})
        entry["agentInfo"] = info if isinstance(info, dict) else {}
        entry["authMethods"] = [{"id": i, "name": n} for i, n in features.auth_methods]
        entry["loadSession"] = features.load_session
        entry["resumeSession"] = features.resume_session
        entry["promptCapabilities"] = {
            "image": features.image,
            "audio": features.audio,
            "embeddedContext": features.embedded_context,
        }
        entry["mcpCapabilities"] = {"http": features.mcp_http, "sse": features.mcp_sse}
        self._save()

    def learn_session(self, provider_id: str, options: SessionOptions) -> None:
        entry = self._entries.setdefault(provider_id.lower(), {})
        changed = False
        for key, selector in (("models", options.model), ("modes", options.mode)):
            if not selector.present:
                continue
            choices = [c.wire() for c in selector.choices[:MAX_CHOICES]]
            if entry.get(key) != choices or entry.get(f"current_{key}") != selector.current:
                entry[key] = choices
                entry[f"current_{key}"] = selector.current
                changed = True
        if changed or "learnedAt" not in entry:
            entry["learnedAt"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self._save()

    def wire(self, provider_id: str) -> dict[str, Any]:
        entry = self.get(provider_id)
        if not entry:
            return {"learned": False}
        out: dict[str, Any] = {"learned": "learnedAt" in entry}
        for key in ("agentInfo", "authMethods", "promptCapabilities", "mcpCapabilities"):
            if key in entry:
                out[key] = entry[key]
        for key in ("loadSession", "resumeSession", "learnedAt"):
            if key in entry:
                out[key] = entry[key]
        for key in ("models", "modes"):
            if key in entry:
                out[key] = entry[key]
                out["current" + key[:-1].capitalize()] = entry.get(f"current_{key}", "")
        return out

    def _save(self) -> None:
        if self._path is None:
            return
        tmp = ""
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=".agent-catalog-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(orjson.dumps(self._entries))
            os.replace(tmp, self._path)
        except OSError as exc:
            if tmp:  # a failed write (disk full) left one more temp file each time
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            log.warning("agent catalog not saved", extra={"error": str(exc)})
