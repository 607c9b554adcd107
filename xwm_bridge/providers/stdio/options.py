"""An ACP session's models, modes and config options, and the calls that set them
(sans-I/O).

Agents describe them in the answer to ``session/new`` / ``load`` / ``resume``:

* ``configOptions`` (current ACP): a list of ``{id, name, category, type,
  currentValue, options}``; the ``model`` and ``mode`` categories are set with
  ``session/set_config_option {sessionId, configId, value}`` (opencode);
* the older ``models: {availableModels, currentModelId}`` and ``modes:
  {availableModes, currentModeId}``, set with ``session/set_model {sessionId,
  modelId}`` and ``session/set_mode {sessionId, modeId}`` (gemini-cli).

A wanted model matches an offered value exactly, case-insensitively, as the part
after ``provider/`` (``fake-model`` → ``fake/fake-model``) or by its display name;
an ambiguous or absent match is no match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from xwm_bridge import coerce

SET_CONFIG_OPTION = "session/set_config_option"
SET_MODEL = "session/set_model"
SET_MODE = "session/set_mode"


class OptionError(Exception):
    """A wanted model, mode or option the agent does not offer."""


@dataclass(frozen=True, slots=True)
class Choice:
    value: str
    name: str = ""

    def wire(self) -> dict[str, str]:
        return {"id": self.value, "name": self.name or self.value}


@dataclass(frozen=True, slots=True)
class Selector:
    """One selectable setting: a config option (``config_id``) or a legacy one."""

    choices: tuple[Choice, ...] = ()
    current: str = ""
    #: the ``configOptions`` id, or "" for the legacy ``models``/``modes`` state
    config_id: str = ""
    present: bool = False


def _choices(options: Any) -> tuple[Choice, ...]:
    out: list[Choice] = []
    for item in options if isinstance(options, list) else []:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("options"), list):  # a group of options
            out.extend(_choices(item["options"]))
            continue
        value = coerce.text(item.get("value"))
        if value:
            out.append(Choice(value, coerce.text(item.get("name"))))
    return tuple(out)


def _legacy(state: Any, list_key: str, id_key: str, current_key: str) -> Selector:
    if not isinstance(state, dict):
        return Selector()
    items = state.get(list_key)
    choices = tuple(
        Choice(coerce.text(m.get(id_key)), coerce.text(m.get("name")))
        for m in (items if isinstance(items, list) else [])
        if isinstance(m, dict) and coerce.text(m.get(id_key))
    )
    return Selector(choices, coerce.text(state.get(current_key)), "", True)


@dataclass(frozen=True, slots=True)
class SessionOptions:
    model: Selector = Selector()
    mode: Selector = Selector()
    #: every config option: id → (type, current value, choices)
    config: tuple[tuple[str, str, Any, tuple[Choice, ...]], ...] = ()

    @classmethod
    def of(cls, answer: Any, previous: SessionOptions | None = None) -> SessionOptions:
        """From a session answer; what it leaves out is kept from ``previous``."""
        answer = answer if isinstance(answer, dict) else {}
        base = previous or cls()
        model, mode, config = base.model, base.mode, base.config
        options = answer.get("configOptions")
        if isinstance(options, list):
            config = tuple(
                (
                    coerce.text(o.get("id")),
                    coerce.text(o.get("type"), "select"),
                    o.get("currentValue"),
                    _choices(o.get("options")),
                )
                for o in options
                if isinstance(o, dict) and coerce.text(o.get("id"))
            )
            model = mode = Selector()
            for o in options:
                if not isinstance(o, dict) or not coerce.text(o.get("id")):
                    continue
                category = coerce.text(o.get("category")) or coerce.text(o.get("id"))
                selector = Selector(
                    _choices(o.get("options")),
                    coerce.text(o.get("currentValue")),
                    coerce.text(o.get("id")),
                    True,
                )
                if category == "model" and not model.present:
                    model = selector
                elif category == "mode" and not mode.present:
                    mode = selector
        if not model.config_id and "models" in answer:
            model = _legacy(answer.get("models"), "availableModels", "modelId", "currentModelId")
        if not mode.config_id and "modes" in answer:
            mode = _legacy(answer.get("modes"), "availableModes", "id", "currentModeId")
        return cls(model, mode, config)

    def with_current(self, *, model: str | None = None, mode: str | None = None) -> SessionOptions:
        out = self
        if model is not None:
            out = replace(out, model=replace(out.model, current=model))
        if mode is not None:
            out = replace(out, mode=replace(out.mode, current=mode))
        return out

    def config_value(self, config_id: str) -> Any:
        return next((cur for cid, _, cur, _ in self.config if cid == config_id), None)


def match(choices: tuple[Choice, ...], wanted: str) -> str | None:
    """The offered value for ``wanted`` (see the module docstring), or None."""
    if not wanted:
        return None
    for c in choices:
        if c.value == wanted:
            return c.value
    low = wanted.lower()
    tests: tuple[Callable[[Choice], bool], ...] = (
        lambda c: c.value.lower() == low,
        lambda c: c.value.lower().rsplit("/", 1)[-1] == low,
        lambda c: c.name.lower() == low,
    )
    for test in tests:
        hits = {c.value for c in choices if test(c)}
        if len(hits) == 1:
            return hits.pop()
        if hits:
            return None
    return None


def _offered(selector: Selector) -> str:
    values = [c.value for c in selector.choices]
    shown = ", ".join(values[:20]) + (f", … ({len(values)} in all)" if len(values) > 20 else "")
    return shown or "none"


def select_call(
    session_id: str, selector: Selector, wanted: str, what: str
) -> tuple[str, dict[str, Any], str] | None:
    """The call that makes ``wanted`` current: ``(method, params, value)``; None when
    it already is. Raises :class:`OptionError` when the agent does not offer it."""
    if not selector.present:
        raise OptionError(f"the agent offers no {what} selection")
    value = match(selector.choices, wanted) if selector.choices else wanted
    if value is None:
        raise OptionError(f"{what} {wanted!r} is not offered (offered: {_offered(selector)})")
    if value == selector.current:
        return None
    if selector.config_id:
        params = {"sessionId": session_id, "configId": selector.config_id, "value": value}
        return SET_CONFIG_OPTION, params, value
    if what == "model":
        return SET_MODEL, {"sessionId": session_id, "modelId": value}, value
    return SET_MODE, {"sessionId": session_id, "modeId": value}, value


def option_call(
    session_id: str, options: SessionOptions, item: str
) -> tuple[str, dict[str, Any]] | None:
    """``configId=value`` from the provider config → its ``set_config_option`` call."""
    config_id, _, raw = item.partition("=")
    config_id, raw = config_id.strip(), raw.strip()
    found = next((o for o in options.config if o[0] == config_id), None)
    if found is None:
        known = ", ".join(o[0] for o in options.config) or "none"
        raise OptionError(f"config option {config_id!r} is not offered (offered: {known})")
    _, kind, current, choices = found
    params: dict[str, Any] = {"sessionId": session_id, "configId": config_id}
    if kind == "boolean":
        flag = raw.lower() in ("1", "true", "yes", "on")
        if flag == current:
            return None
        params.update(type="boolean", value=flag)
        return SET_CONFIG_OPTION, params
    value = match(choices, raw) if choices else raw
    if value is None:
        offered = ", ".join(c.value for c in choices)
        raise OptionError(f"{config_id} {raw!r} is not offered (offered: {offered})")
    if value == current:
        return None
    params["value"] = value
    return SET_CONFIG_OPTION, params
