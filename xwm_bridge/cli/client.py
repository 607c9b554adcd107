"""``xwm-bridge client`` (issue 13): a terminal client of a running bridge. The protocol
side (the connection, tables, event lines, a turn's output) is ``xwm_bridge/client.py``."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from xwm_bridge.cli.common import CONFIG_OPTION, _fail, _load
from xwm_bridge.cli.group import cli


@cli.group("client")
@click.option(
    "--url",
    metavar="URL",
    default=None,
    help="The bridge, e.g. http://127.0.0.1:8787 (default: the config's listen address).",
)
@CONFIG_OPTION
@click.pass_context
def client_group(ctx: click.Context, url: str | None, config_file: str | None) -> None:
    """A terminal client of a running bridge: list and watch sessions, run a turn,
    answer permission requests. Token: ACP_AUTH_TOKEN, else the config's auth_token,
    else its first admin_tokens (XWM_ADMIN_TOKENS) entry, else its first client_tokens
    (XWM_CLIENT_TOKENS) one."""
    cfg = _load(config_file).config
    from xwm_bridge.client import listen_url

    # the daemon's own config: one with admin or client tokens only gave no token at all
    token = cfg.auth_token or next(iter(cfg.admin_tokens), "") or next(iter(cfg.client_tokens), "")
    ctx.obj = (url or listen_url(cfg.listen), token)


def _client_run(ctx: click.Context, main: Any) -> None:
    from xwm_bridge.client import Client, ClientError

    url, token = ctx.obj

    async def go() -> int:
        async with Client(url, token) as client:
            code: int = await main(client)
            return code

    try:
        code = asyncio.run(go())
    except ClientError as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


@client_group.command("list")
@click.option(
    "--state", default=None, help="running, completed, failed, cancelled, interrupted, idle"
)
@click.option("--provider", default=None)
@click.option("--thread", "thread_id", default=None)
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the session.list result as JSON.")
@click.pass_context
def client_list(
    ctx: click.Context,
    state: str | None,
    provider: str | None,
    thread_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Sessions, newest first, with their last turn."""
    from xwm_bridge.client import Client, json_text, session_table

    params: dict[str, Any] = {"limit": limit}
    for key, value in (("state", state), ("provider", provider), ("threadId", thread_id)):
        if value:
            params[key] = value

    async def main(client: Client) -> int:
        result = await client.call("session.list", params)
        if as_json:
            click.echo(json_text(result, indent=True))
        elif result["sessions"]:
            click.echo(session_table(result["sessions"]))
        else:
            click.echo("no sessions")
        return 0

    _client_run(ctx, main)


@client_group.command("watch")
@click.option("--since", default=None, help="Resume after this cursor (printed with --json).")
@click.option("--kinds", default=None, help="Comma-separated: session,turn,queue,health,permission")
@click.option(
    "--count", type=click.IntRange(min=0), default=0, help="Stop after this many events (0: never)."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
@click.pass_context
def client_watch(
    ctx: click.Context, since: str | None, kinds: str | None, count: int, as_json: bool
) -> None:
    """Follow the live feed (bridge.watch) until interrupted."""
    from xwm_bridge.client import Client, event_line, json_text

    params: dict[str, Any] = {}
    if since:
        params["since"] = since
    if kinds:
        params["kinds"] = [k.strip() for k in kinds.split(",") if k.strip()]

    async def main(client: Client) -> int:
        seen = 0
        done = asyncio.Event()

        def on_note(msg: dict[str, Any]) -> None:
            nonlocal seen
            if msg.get("method") != "bridge.event":
                return
            event = msg.get("params") or {}
            if event.get("kind") == "watch":
                return
            line = json_text(event) if as_json else event_line(event)
            if line:
                click.echo(line)
                seen += 1
            if count and seen >= count:
                done.set()

        client.on_notification = on_note
        while not done.is_set():
            # both owned here: awaited together, both cancelled (a no-op once done) after
            watch = asyncio.ensure_future(client.call("bridge.watch", params, wait_s=None))
            stop = asyncio.ensure_future(done.wait())
            try:
                finished, _ = await asyncio.wait({watch, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watch.cancel()
                stop.cancel()
            if watch in finished:
                params["since"] = watch.result().get("cursor")
        return 0

    _client_run(ctx, main)


@client_group.command("run")
@click.option("--provider", required=True, help="Provider id (see acp.capabilities).")
@click.option("--session", "session_id", default=None, help="Session id (default: a new one).")
@click.option("--thread", "thread_id", default=None)
@click.option("--cwd", "working_directory", default=None, help="The turn's working directory.")
@click.argument("prompt")
@click.pass_context
def client_run(
    ctx: click.Context,
    provider: str,
    session_id: str | None,
    thread_id: str | None,
    working_directory: str | None,
    prompt: str,
) -> None:
    """Run one turn: output on stdout, a progress line and permission prompts on stderr.
    Exits 0 when the turn succeeds, 1 when it fails, 130 when interrupted."""
    import uuid

    from xwm_bridge.client import Client, run_turn, stdin_lines

    sid = session_id or f"cli-{uuid.uuid4().hex[:12]}"
    params: dict[str, Any] = {
        "sessionId": sid,
        "taskPrompt": prompt,
        "routing": {
            "routingMode": "explicit",
            "explicitExecutionTarget": "singleAgent",
            "explicitProviderId": provider,
        },
    }
    if thread_id:
        params["threadId"] = thread_id
    if working_directory:
        params["workingDirectory"] = working_directory

    async def main(client: Client) -> int:
        try:
            result = await run_turn(client, params, sys.stdout, sys.stderr, stdin_lines())
        except asyncio.CancelledError:
            await client.call("session.cancel", {"sessionId": sid})
            raise
        return 0 if result.get("success") else 1

    _client_run(ctx, main)


@client_group.command("approve")
@click.argument("request_id")
@click.argument("option_id")
@click.pass_context
def client_approve(ctx: click.Context, request_id: str, option_id: str) -> None:
    """Answer a pending permission request (ids from `client watch` or the console)."""
    from xwm_bridge import coerce
    from xwm_bridge.client import Client, ClientError, shown

    async def main(client: Client) -> int:
        listed = await client.call("permission.list", {})
        match = [r for r in listed["requests"] if r["requestId"] == request_id]
        if not match:
            raise ClientError(f"no pending permission request {shown(request_id)}")
        sessions = sorted({coerce.text(r.get("sessionId")) for r in match})
        if len(sessions) > 1:  # replicas of before the ids had a tag: each counted from 1
            raise ClientError(
                f"permission request {shown(request_id)} is pending in {len(sessions)} "
                f"sessions ({', '.join(shown(s) for s in sessions)}): answer it in the "
                "console or with session.permission, which names the session"
            )
        result = await client.call(
            "session.permission",
            {"sessionId": match[0]["sessionId"], "requestId": request_id, "optionId": option_id},
        )
        click.echo(f"{shown(request_id)}: {shown(result.get('outcome') or option_id)}")
        return 0

    _client_run(ctx, main)
