""":func:`load_config`: defaults < YAML file (``${VAR}`` interpolated) < environment <
flags, built into the typed dataclasses and validated."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import yaml

from xwm_bridge import coerce
from xwm_bridge.config.env_vars import (
    _ENV_FLAGS,
    _LIST_SEPARATORS,
    _NESTED_FLAGS,
    CONFIG_FILE_ENV,
    ENV_VARS,
    NESTED_ENV_VARS,
    EnvWarning,
    env_flag,
    hold_back,
    provider_env_var,
)
from xwm_bridge.config.model import BridgeConfig, ConfigError
from xwm_bridge.config.secret_fields import SECRET_MARK
from xwm_bridge.config.validate import _validate
from xwm_bridge.proxy import ProxyEnvError, ProxySettings

_TOO_DEEP = (
    "config file {path}: nested too deeply or refers to itself (a YAML alias inside its anchor)"
)
_INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    config: BridgeConfig
    #: dotted key → where its value came from ("default", "file", "env:NAME", "flag").
    sources: Mapping[str, str]
    #: the forward proxies of the same environment (HTTP_PROXY, HTTPS_PROXY, NO_PROXY)
    proxies: ProxySettings = dataclasses.field(default_factory=ProxySettings)
    #: boolean variables not understood (their default applied): logged at start-up
    warnings: tuple[EnvWarning, ...] = ()


def load_config(
    *,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> LoadedConfig:
    """Build the effective config; raise :class:`ConfigError` on any bad value."""
    env = dict(os.environ if env is None else env)
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    sources: dict[str, str] = {}
    data: dict[str, Any] = {}
    warnings: list[EnvWarning] = []

    if config_file is not None and not config_file.strip():
        # click drops an empty XWM_BRIDGE_CONFIG, so this is `--config "$CFG"` with
        # CFG unset: running on the defaults instead would go unnoticed
        raise ConfigError("--config: empty path (an unset variable?)")
    path = config_file or coerce.env_text(env, CONFIG_FILE_ENV)
    if path:
        data = _read_yaml(Path(path), env)
        for key in data:
            sources[key] = "file"

    for key, var in ENV_VARS.items():
        value = coerce.env_text(env, var)
        if not value:
            continue
        sep = _LIST_SEPARATORS.get(key)
        if sep is not None:
            data[key] = [v.strip() for v in value.split(sep) if v.strip()]
        elif key in _ENV_FLAGS:
            # the spec's **flag** rule: an unrecognized word means the default (warned)
            data[key], warning = env_flag(var, value, _ENV_FLAGS[key])
            warnings += [warning] if warning else []
        else:
            data[key] = value
        sources[key] = f"env:{var}"

    for dotted, var in NESTED_ENV_VARS.items():
        value = coerce.env_text(env, var)
        if not value:
            continue
        section, name = dotted.split(".", 1)
        current = data.get(section)
        if not isinstance(current, dict):
            current = {} if current is None else current
            data[section] = current
        if isinstance(current, dict):
            if dotted in _NESTED_FLAGS:  # the same **flag** rule as the top-level ones
                current[name], warning = env_flag(var, value, _NESTED_FLAGS[dotted])
                warnings += [warning] if warning else []
            else:
                current[name] = value
        sources[dotted] = f"env:{var}"

    for key, value in flags.items():
        data[key] = value
        sources[key] = "flag"

    config = _build(BridgeConfig, data, "")
    config = _apply_provider_env(config, env, sources)
    _validate(config)
    try:
        proxies = ProxySettings.from_env(env)
    except ProxyEnvError as exc:
        raise ConfigError(str(exc)) from None
    hold_back(config.credentials())  # helper commands' environments (without_secrets)
    for f in dataclasses.fields(BridgeConfig):
        sources.setdefault(f.name, "default")
    return LoadedConfig(config=config, sources=sources, proxies=proxies, warnings=tuple(warnings))


class _UniqueKeys(yaml.SafeLoader):
    """``yaml.safe_load``, but a key written twice in one mapping is an error: YAML
    keeps the last one, so a second ``limits:`` block silently dropped the first."""


def _unique_mapping(loader: _UniqueKeys, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: overridden keys are fine
            continue
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: the constructor says so
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _read_yaml(path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {exc.start})") from None
    try:
        doc = yaml.load(raw, Loader=_UniqueKeys)  # a SafeLoader: no Python objects
    except RecursionError:
        raise ConfigError(_TOO_DEEP.format(path=path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"config file {path}: {problem}{where}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping")
    try:
        result = _interpolate(doc, env, "")
    except RecursionError:  # an alias inside its own anchor: `a: &x [*x]`
        raise ConfigError(_TOO_DEEP.format(path=path)) from None
    assert isinstance(result, dict)
    return result


def _interpolate(value: Any, env: Mapping[str, str], key: str) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            # config.md §2: values are trimmed and a blank one counts as unset,
            # so ${VAR:-default} falls back for VAR="" just as the shell does.
            current = coerce.env_text(env, name)
            if current:
                return current
            if default is not None:
                return default
            raise ConfigError(f"{key}: environment variable {name} is not set")

        return _INTERP.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, env, _join(key, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _build(cls: type[Any], data: Any, key: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{key or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls, include_extras=True)  # Secret's mark kept (_convert)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(map(str, data)) - names)
    if unknown:
        raise ConfigError(f"{_join(key, unknown[0])}: unknown key{_suggest(unknown[0], names)}")
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in data:
            raise ConfigError(f"{_join(key, f.name)}: required key is missing")
    kwargs = {name: _convert(hints[name], data[name], _join(key, name)) for name in data}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{key or 'config'}: {exc}") from None


def _suggest(name: str, names: set[str]) -> str:
    """`` (did you mean limits?)`` for a misspelt key, else nothing."""
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if origin is Annotated:  # Secret: a credential
        inner, *marks = get_args(tp)
        if SECRET_MARK in marks and isinstance(value, (bool, int, float)):
            # YAML has already turned 0123 into 83, 0x1F into 31, yes into True: the
            # token became another one, and masked, nobody could see it
            read = "a boolean" if isinstance(value, bool) else "a number"
            raise ConfigError(f"{key}: a credential must be a quoted string (YAML read {read})")
        return _convert(inner, value, key)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, key)  # type: ignore[arg-type]
    if origin is tuple:
        (item_tp, _) = get_args(tp)
        if isinstance(value, str):
            sep = _LIST_SEPARATORS.get(key, ",")
            value = [v.strip() for v in value.split(sep) if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        return tuple(_convert(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if isinstance(value, bool):
            return value
        word = coerce.text(value).lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int or tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if tp is int and isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            number = tp(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if number != number:  # NaN
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if number == math.inf:  # no timeout at all, and overflows where it becomes an int
            raise ConfigError(f"{key}: must be finite, got {value!r}")
        if number < 0:
            raise ConfigError(f"{key}: must not be negative, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__}")
        return "" if value is None else str(value).strip()
    raise ConfigError(f"{key}: unsupported type")  # pragma: no cover - schema bug


def _apply_provider_env(
    config: BridgeConfig, env: Mapping[str, str], sources: dict[str, str]
) -> BridgeConfig:
    providers = []
    for i, p in enumerate(config.providers):
        var = provider_env_var(p.id)
        url = coerce.env_text(env, var)
        if url:
            p = dataclasses.replace(p, endpoint=url)
            sources[f"providers[{i}].endpoint"] = f"env:{var}"
        providers.append(p)
    return dataclasses.replace(config, providers=tuple(providers))
