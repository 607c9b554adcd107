"""Choosing how to ``authenticate`` to an agent (sans-I/O).

An agent asks for authentication by failing ``session/new`` (or ``load`` /
``resume``) with ``-32000`` (ACP ``auth_required``); a provider with
``auth_on_start`` is authenticated right after ``initialize``. The method is:

1. the provider's ``auth_method`` (it must be one the agent advertises), with its
   ``auth_api_key`` — or the key of the registry's method of that id from the
   agent's environment — sent in ``_meta`` the way the agent expects it;
2. else the first registry method the agent advertises whose key variable is set
   in the agent's environment.

Nothing usable → an error naming the provider and the agent's ``authMethods``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge.config import ProviderConfig
from xwm_bridge.providers.stdio.features import AgentFeatures
from xwm_bridge.providers.stdio.registry import (
    META_NONE,
    META_OBJECT,
    META_STRING,
    AgentEntry,
    ApiKeyAuth,
)

AUTH_REQUIRED = -32000


@dataclass(frozen=True, slots=True)
class AuthPlan:
    method: str
    #: the key itself (``_meta``): never in a repr
    params: dict[str, Any] = field(repr=False)
    #: where the key came from, for the log ("config", "env:NAME" or "")
    key_source: str = ""


class AuthUnavailable(Exception):
    """No usable method: the message names the provider and its authMethods."""


def _meta(style: str, key: str) -> dict[str, Any]:
    if style == META_OBJECT:
        return {"api-key": {"apiKey": key}}
    if style == META_STRING:
        return {"api-key": key}
    return {}


def _key_from_env(spec: ApiKeyAuth, env: Mapping[str, str]) -> tuple[str, str]:
    for name in spec.env:
        value = env.get(name, "")
        if value:
            return value, f"env:{name}"
    return "", ""


def plan(
    provider: ProviderConfig,
    features: AgentFeatures,
    entry: AgentEntry | None,
    env: Mapping[str, str],
) -> AuthPlan:
    advertised = features.auth_method_ids
    known = {s.method: s for s in (entry.auth if entry else ())}
    if provider.auth_method:
        method = provider.auth_method
        if method not in advertised:
            raise AuthUnavailable(
                f"agent {provider.id}: providers[].auth_method {method!r} is not one of its "
                f"authMethods: {features.describe_auth()}"
            )
        spec = known.get(method)
        key, source = provider.auth_api_key, "config" if provider.auth_api_key else ""
        if not key and spec is not None:
            key, source = _key_from_env(spec, env)
        style = spec.meta if spec is not None else META_STRING
        params: dict[str, Any] = {"methodId": method}
        if key and style != META_NONE:
            params["_meta"] = _meta(style, key)
        return AuthPlan(method, params, source)
    for spec in entry.auth if entry else ():
        if spec.method not in advertised:
            continue
        key, source = _key_from_env(spec, env)
        if not key:
            continue
        params = {"methodId": spec.method}
        if spec.meta != META_NONE:
            params["_meta"] = _meta(spec.meta, key)
        return AuthPlan(spec.method, params, source)
    hint = ""
    if entry is not None and entry.auth:
        names = sorted({n for s in entry.auth for n in s.env})
        hint = f", or set {' or '.join(names)} for the agent"
    raise AuthUnavailable(
        f"agent {provider.id} requires authentication and no usable method is configured "
        f"(its authMethods: {features.describe_auth()}); set providers[].auth_method "
        f"(and auth_api_key){hint}"
    )
