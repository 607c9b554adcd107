"""What an agent's ``initialize`` answer says it can do (sans-I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xwm_bridge import coerce


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class AgentFeatures:
    load_session: bool = False
    #: ``sessionCapabilities.resume`` (``session/resume``, no history replay)
    resume_session: bool = False
    image: bool = False
    audio: bool = False
    embedded_context: bool = False
    mcp_http: bool = False
    mcp_sse: bool = False
    #: ``authMethods`` as ``(id, name)``
    auth_methods: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, init: Any) -> AgentFeatures:
        init = _obj(init)
        caps = _obj(init.get("agentCapabilities"))
        prompt = _obj(caps.get("promptCapabilities"))
        mcp = _obj(caps.get("mcpCapabilities"))
        session = _obj(caps.get("sessionCapabilities"))
        methods = init.get("authMethods")
        auth = tuple(
            (coerce.text(m.get("id")), coerce.text(m.get("name")))
            for m in (methods if isinstance(methods, list) else [])
            if isinstance(m, dict) and coerce.text(m.get("id"))
        )
        return cls(
            load_session=caps.get("loadSession") is True,
            resume_session=isinstance(session.get("resume"), dict),
            image=prompt.get("image") is True,
            audio=prompt.get("audio") is True,
            embedded_context=prompt.get("embeddedContext") is True,
            mcp_http=mcp.get("http") is True,
            mcp_sse=mcp.get("sse") is True,
            auth_methods=auth,
        )

    @property
    def auth_method_ids(self) -> tuple[str, ...]:
        return tuple(mid for mid, _ in self.auth_methods)

    def describe_auth(self) -> str:
        if not self.auth_methods:
            return "none advertised"
        return ", ".join(f"{mid} ({name})" if name else mid for mid, name in self.auth_methods)
