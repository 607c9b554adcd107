"""How a stdio agent is started: its clean environment and its optional sandbox.

Environment: ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` from the bridge's own
environment, plus the names the registry entry and the provider's ``pass_env``
list (``PREFIX_*`` globs allowed), plus the provider's explicit ``env`` items.
Nothing else of the bridge's environment reaches the agent; a bridge secret
variable (``SECRET_ENV_VARS``: ``GEMINI_*`` must not copy
``GEMINI_ADAPTER_AUTH_TOKEN``) is never copied, whatever the pattern, and a
copied variable whose value (or one item of a comma-separated value) is one of
the bridge's configured secrets or the value of a bridge secret variable is
dropped too (set it in ``env`` explicitly if the agent really needs it).

Sandbox (``agents.sandbox: bwrap``): the agent runs under bubblewrap with the
whole filesystem read-only, a private ``/tmp``, its own ``/dev`` and ``/proc``,
its own PID namespace (killed with its parent) and write access only to the
session's working directory, the agent's state dirs (registry) and the
provider's ``writable_paths``. Reads are not confined; the network is not.
The agent's program stays visible when it lives under the host's ``/tmp``: the
top ``/tmp`` entry of its executable (as named and resolved), of its absolute
arguments and of its ``PATH``, ``PYTHONPATH`` and ``NODE_PATH`` entries is bound
read-only over the private ``/tmp`` (a checkout or venv under ``/tmp``).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from xwm_bridge.config import SECRET_ENV_VARS, BridgeConfig, ProviderConfig
from xwm_bridge.observability.logging import add_secrets
from xwm_bridge.providers.stdio import codec, registry
from xwm_bridge.providers.stdio.agent import AgentError, AgentSpec
from xwm_bridge.providers.stdio.client_fs import confined_root

log = logging.getLogger("xwm_bridge.agents")

BASE_ENV = ("PATH", "HOME", "LANG", "TMPDIR")
SANDBOX_TMP = "/tmp"
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class AgentEnv:
    #: the agent's environment (its API keys): never in a repr
    env: dict[str, str] = field(repr=False)
    #: copied variables left out because their value is a bridge secret
    withheld: tuple[str, ...] = ()


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def agent_environment(
    environ: Mapping[str, str],
    pass_names: Iterable[str],
    explicit: Iterable[str],
    secrets: Iterable[str] = (),
) -> AgentEnv:
    """The agent's whole environment (see the module docstring)."""
    patterns = [*BASE_ENV, *pass_names]
    secret_values = {s for s in secrets if s}
    # the bridge's secret variables hold its credentials even when its config does not
    # (GEMINI_ADAPTER_AUTH_TOKEN under serve): their values are withheld under any name
    for name in SECRET_ENV_VARS:
        secret_values.update(p for p in (v.strip() for v in environ.get(name, "").split(",")) if p)
    env: dict[str, str] = {}
    withheld: list[str] = []
    for name, value in environ.items():
        if not _matches(name, patterns):
            continue
        if name in SECRET_ENV_VARS:
            withheld.append(name)
            continue
        # a token list (XWM_CLIENT_TOKENS, XWM_ADMIN_TOKENS) is withheld for any item
        if value in secret_values or any(p.strip() in secret_values for p in value.split(",")):
            withheld.append(name)
            continue
        env[name] = value
    for item in explicit:
        name, _, value = item.partition("=")
        env[name] = value
    return AgentEnv(env, tuple(sorted(withheld)))


_PROGRAM_PATH_VARS = ("PATH", "PYTHONPATH", "NODE_PATH")


def program_paths(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The host ``/tmp`` entries the agent's program needs (see the module
    docstring), in a stable order; empty when nothing of it is under ``/tmp``."""
    candidates: list[str] = []
    exe = shutil.which(argv[0], path=env.get("PATH")) if argv else None
    if exe:
        candidates += [os.path.abspath(exe), os.path.realpath(exe)]
    candidates += [arg for arg in argv if os.path.isabs(arg)]
    for name in _PROGRAM_PATH_VARS:
        candidates += env.get(name, "").split(os.pathsep)
    prefix = SANDBOX_TMP + os.sep
    tops: list[str] = []
    for path in candidates:
        if not path.startswith(prefix):
            continue
        top = prefix + path[len(prefix) :].split(os.sep, 1)[0]
        if top != prefix and top not in tops and os.path.isdir(top):
            tops.append(top)
    return tops


def bwrap_argv(
    bwrap: str,
    argv: Sequence[str],
    cwd: str,
    writable: Iterable[str],
    visible: Iterable[str] = (),
    *,
    bind_cwd: bool = True,
) -> list[str]:
    """``argv`` wrapped in bubblewrap (see the module docstring). ``visible`` are
    host paths bound read-only over the private ``/tmp``; ``writable`` ones (and
    ``cwd``, unless ``bind_cwd`` is false: then it is only where the command starts)
    are bound read-write on top. Paths that do not exist are skipped."""
    out = [
        bwrap,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        SANDBOX_TMP,
    ]
    for path in visible:
        if os.path.exists(path):
            out += ["--ro-bind", path, path]
    seen: set[str] = set()
    for path in [cwd, *writable] if bind_cwd else writable:
        if not path or path in seen or not os.path.exists(path):
            continue
        seen.add(path)
        out += ["--bind", path, path]
    out += ["--setenv", "TMPDIR", SANDBOX_TMP]
    if cwd:
        out += ["--chdir", cwd]
    return [*out, "--", *argv]


def _prepare_state(paths: Iterable[str]) -> list[str]:
    """Create the agent's state directories (not files) so they can be bound."""
    out = []
    for path in paths:
        is_file = os.path.splitext(path)[1] != "" and not path.endswith(os.sep)
        if not is_file:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                log.warning(
                    "cannot create agent state dir", extra={"path": path, "error": str(exc)}
                )
                continue
        out.append(path)
    return out


def agent_spec(
    provider: ProviderConfig,
    config: BridgeConfig,
    cwd: str = "",
    environ: Mapping[str, str] | None = None,
) -> AgentSpec:
    """The spawn spec of ``provider``'s agent; ``cwd`` is the session directory a
    sandboxed agent is confined to (unsandboxed agents serve every directory)."""
    agents = config.agents
    entry = registry.entry_for(provider)
    gives_mcp = bool(provider.mcp_servers or provider.toolbridge or provider.client_mcp_servers)
    mcp_env = entry.mcp_env if entry is not None and gives_mcp else ()
    built = agent_environment(
        os.environ if environ is None else environ,
        (*(entry.env if entry else ()), *provider.pass_env),
        (*mcp_env, *provider.env),
        config.own_secrets(),
    )
    if built.withheld:
        log.warning(
            "agent environment: variables holding a bridge secret were not copied",
            extra={"agent": provider.id, "names": list(built.withheld)},
        )
    # keys copied from the bridge's environment stay out of the logs too
    add_secrets(v for k, v in built.env.items() if _SECRET_NAME.search(k))
    argv: tuple[str, ...] = provider.command
    workdir = cwd or provider.cwd
    if agents.sandbox == "bwrap":
        if shutil.which(agents.bwrap_path) is None:
            raise AgentError(
                f"agents.sandbox is bwrap but {agents.bwrap_path} is not installed "
                "(Debian: apt install bubblewrap)"
            )
        # the client's directory is bound writable: it must be one of ours (the
        # provider's own cwd is the operator's; none at all binds nothing)
        if cwd and config.allowed_roots:
            confined = confined_root(cwd, config.allowed_roots)
            if confined is None:
                raise AgentError(
                    "agents.sandbox is bwrap: the working directory is outside allowed_roots"
                    " (it would be bound writable for the agent)"
                )
            workdir = confined
        writable = [
            *_prepare_state(registry.state_paths(entry, built.env)),
            *provider.writable_paths,
        ]
        visible = program_paths(argv, built.env)
        argv = tuple(bwrap_argv(agents.bwrap_path, argv, workdir, writable, visible))
        built.env["TMPDIR"] = SANDBOX_TMP
    return AgentSpec(
        name=provider.id,
        argv=argv,
        env=built.env,
        cwd=workdir,
        capabilities=codec.client_capabilities(
            fs_read=agents.fs_enabled and provider.fs_read,
            fs_write=agents.fs_enabled,
            terminal=agents.terminal_enabled,
        ),
        initialize_timeout=agents.initialize_timeout,
        stop_grace=agents.stop_grace,
    )
