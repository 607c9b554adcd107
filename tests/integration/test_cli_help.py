"""``--help`` of every command, read from the real executable, held to what the code
defines: the options listed are the options that exist (and the reverse), every
default printed is the real default, every environment variable named is one the
code reads, and every method and route named is served. A drift fails here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache

import click
import pytest

from tests.conftest import ROOT
from tests.integration.test_cli import run

SOURCE = ROOT / "xwm_bridge"
#: an environment variable's name (``CLAUDE_REVIEW_*`` is matched as a prefix)
ENV_NAME = re.compile(r"(?<![A-Za-z0-9_.-])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+_?(?:\*)?")
#: a JSON-RPC method of the bridge contract named in a help text
METHOD = re.compile(r"\b(?:acp|session|xworkmate|bridge|permission|gemini)\.[a-z][a-zA-Z.]*[a-z]")
#: notifications, named in help texts, that are not methods a client calls
NOTIFICATIONS = {"session.update"}


def commands() -> Iterator[tuple[tuple[str, ...], click.Command]]:
    from xwm_bridge.cli import cli

    def walk(
        path: tuple[str, ...], cmd: click.Command
    ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk((*path, name), sub)

    yield from walk((), cli)


COMMANDS = dict(commands())


@cache
def help_text(path: tuple[str, ...]) -> str:
    proc = run(*path, "--help")
    assert proc.returncode == 0 and proc.stderr == "", (path, proc.stderr)
    return proc.stdout


def listed_options(text: str) -> set[str]:
    """The option strings of the ``Options:`` block (``--agent-bin, --gemini-bin PATH``)."""
    block = text.split("\nOptions:\n", 1)[1].split("\nCommands:\n", 1)[0]
    found: set[str] = set()
    for line in block.splitlines():
        head = line.strip()
        if not line.startswith("  -"):
            continue
        for part in re.split(r",\s*", re.split(r"\s{2,}", head, maxsplit=1)[0]):
            found.add(part.split()[0])
    return found


def defined_options(cmd: click.Command) -> set[str]:
    opts: set[str] = set()
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            opts.update(param.opts, param.secondary_opts)
    return opts | {"-h", "--help"}


def true_defaults() -> dict[tuple[str, str], str]:
    """(command, option) → the default the code really uses, as help should print it."""
    from xwm_bridge.adapters.agent_adapter import AdapterSettings
    from xwm_bridge.config import BridgeConfig

    cfg, adapter = BridgeConfig(), AdapterSettings()
    truth: dict[tuple[str, str], str] = {}
    for path in COMMANDS:
        name = " ".join(path)
        truth[(name, "--log-level")] = cfg.log_level
        truth[(name, "--log-format")] = cfg.log_format
        truth[(name, "--listen")] = cfg.listen
    for name in ("agent-adapter", "gemini-adapter"):
        truth[(name, "--listen")] = adapter.listen
        truth[(name, "--agent-bin")] = adapter.agent_bin
        truth[(name, "--agent-args")] = " ".join(adapter.agent_args)
    return truth


def option_help(text: str) -> dict[str, str]:
    """Each option's help text, joined across its wrapped lines (key: its first name)."""
    block = text.split("\nOptions:\n", 1)[1].split("\nCommands:\n", 1)[0]
    helps: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        if line.startswith("  -"):
            head, _, rest = line.strip().partition("  ")
            current = head.split(",")[0].split()[0]
            helps[current] = rest.strip()
        elif current and line.strip():
            helps[current] += " " + line.strip()
    return {k: re.sub(r"-\s(?=[a-z])", "-", v) for k, v in helps.items()}  # "human- readable"


@cache
def source_text() -> str:
    return "\n".join(p.read_text() for p in SOURCE.rglob("*.py"))


def read_by_the_code(name: str) -> bool:
    """The code reads this variable: its name (or, for ``PREFIX_*``, a name with that
    prefix) is a string literal somewhere in the package."""
    if name.endswith(("*", "_")):
        return (
            re.search(r'"' + re.escape(name.rstrip("*")) + r"[A-Z0-9_]+\"", source_text())
            is not None
        )
    if name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):  # names built in proxy.py
        from xwm_bridge.proxy import ProxySettings

        proxy = {"NO_PROXY": {"HTTP_PROXY": "http://p:1"}}.get(name, {})
        settings = ProxySettings.from_env({**proxy, name: "http://p:1" if proxy == {} else "x"})
        return settings.active and (name != "NO_PROXY" or settings.no_proxy_text == "x")
    return f'"{name}"' in source_text()


IDS = [" ".join(p) or "(top)" for p in COMMANDS]


@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_the_options_listed_are_the_options_that_exist(path: tuple[str, ...]) -> None:
    assert listed_options(help_text(path)) == defined_options(COMMANDS[path])


@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_every_default_printed_is_the_real_one(path: tuple[str, ...]) -> None:
    truth = true_defaults()
    name = " ".join(path)
    for option, text in option_help(help_text(path)).items():
        prose = re.sub(r"\[default: [^\]]*\]", "", text)  # click's own: checked below
        for said in re.findall(r"\bdefault:?\s+([^;,)\s]+(?:\s--[a-z]+)?)", prose):
            if said.startswith("the") or said.startswith("a"):
                continue  # "default: the config's listen address", "default: a new one"
            assert (name, option) in truth, (name, option, said)
            assert said.rstrip(".") == truth[(name, option)], (name, option, said)
        shown = re.search(r"\[default: ([^;\]]+)", text)
        if shown:  # click's own show_default
            param = next(p for p in COMMANDS[path].params if option in p.opts)
            assert shown.group(1) == str(param.default), (name, option)


@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_every_environment_variable_named_is_read(path: tuple[str, ...]) -> None:
    from xwm_bridge.config.env_vars import ENV_VARS, NESTED_ENV_VARS

    text = help_text(path)
    prose = text.split("\n", 1)[1]  # not the usage line's argument names (REQUEST_ID)
    for name in ENV_NAME.findall(prose):
        assert read_by_the_code(name), (path, name)
    # and an option's "(env NAME…)" is the variable of that very setting
    config_vars = {**ENV_VARS, **{k.split(".", 1)[1]: v for k, v in NESTED_ENV_VARS.items()}}
    cmd = COMMANDS[path]
    for option, help_ in option_help(text).items():
        param = next((p for p in cmd.params if option in getattr(p, "opts", ())), None)
        said = re.search(r"\(env ([A-Z0-9_]+)", help_)
        if param is None or said is None or param.name not in config_vars:
            continue
        if path and path[0] in ("agent-adapter", "gemini-adapter") and param.name == "listen":
            continue  # the adapter's own GEMINI_ADAPTER_LISTEN_ADDR (read_by_the_code above)
        assert said.group(1) == config_vars[param.name], (path, option, said.group(1))


def test_every_method_and_route_named_is_served() -> None:
    """The reverse of test_cli.py's check: nothing is advertised that does not exist."""
    from xwm_bridge.adapters.agent_adapter import ADAPTER_PATHS, AdapterMethods, AdapterSettings
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.app.methods import BridgeMethods
    from xwm_bridge.config import BridgeConfig
    from xwm_bridge.config.sections import StoreConfig
    from xwm_bridge.transport.http import SERVE_PATHS

    cfg = BridgeConfig(store=StoreConfig(backend="memory"))
    served = set(BridgeMethods(Bridge(cfg)).table())
    settings = AdapterSettings()
    adapter = set(AdapterMethods(Bridge(settings.bridge_config(cfg)), settings).table())
    for path, methods in (((), served), (("serve",), served), (("agent-adapter",), adapter)):
        named = set(METHOD.findall(help_text(path))) - NOTIFICATIONS
        assert named, path
        assert named <= methods, (path, sorted(named - methods))
    for path, paths in ((("serve",), SERVE_PATHS), (("agent-adapter",), ADAPTER_PATHS)):
        text = help_text(path)
        routes = set(re.findall(r"(?<![\w.])/[a-z][\w/{}.-]*[\w}]|(?<=\s)/(?=[,\s])", text))
        assert routes <= set(paths), (path, sorted(routes - set(paths)))
