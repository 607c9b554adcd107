"""Tools ``chat`` and ``claude_review`` (adapters.md §2.5-2.6), hardened.

``chat`` only ever sends the server's key to the configured base URL (no tool
argument can change the URL). ``claude_review`` runs the CLI without a shell in
its own process group, with a deadline and a cap on what it may print.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from typing import Any

import aiohttp
import orjson

from xwm_bridge import coerce, procgroups
from xwm_bridge.config import ToolbridgeConfig, without_secrets
from xwm_bridge.llm import ChatRequest, LLMError, complete

#: how long, after the CLI exits, a process it left may keep its output open
EXIT_GRACE = 0.5


class ToolError(Exception):
    """A tool failure; its text becomes ``Error: <text>`` with ``isError: true``."""


async def chat(http: aiohttp.ClientSession, cfg: ToolbridgeConfig, args: dict[str, Any]) -> str:
    if not cfg.llm_api_key:
        raise ToolError("LLM_API_KEY environment variable not set")
    prompt = coerce.text(args.get("prompt"))
    if not prompt:
        raise ToolError("prompt is required")
    model = coerce.text(args.get("model")) or cfg.llm_model or "gpt-4o"
    messages = []
    system = coerce.text(args.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    req = ChatRequest(cfg.llm_base_url, cfg.llm_api_key, model, messages, cfg.chat_timeout)
    try:
        return await complete(http, req)
    except LLMError as exc:
        raise ToolError(str(exc)) from None


def go_duration(seconds: float) -> str:
    """Render like Go's ``time.Duration.String`` for whole-ms values: ``10m0s``, ``1.5s``."""
    ms = round(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def claude_argv(binary: str, cfg: ToolbridgeConfig, args: dict[str, Any]) -> list[str]:
    prompt = coerce.text(args.get("prompt"))
    if not prompt:
        raise ToolError("prompt is required")
    # ``-p`` (``--print``) takes no value: the prompt is the CLI's positional argument.
    # Right after ``-p`` a prompt such as ``--dangerously-skip-permissions`` was parsed
    # as that option (undoing ``--permission-mode plan``); after ``--``, last, it is
    # only ever the prompt (and no variadic option such as ``--tools`` can swallow it)
    argv = [binary, "-p", "--output-format", "json", "--permission-mode", "plan"]
    for flag, key, default in (
        ("--model", "model", cfg.claude_review_model),
        ("--system-prompt", "system", cfg.claude_review_system),
        ("--tools", "tools", cfg.claude_review_tools),
    ):
        value = coerce.text(args.get(key)) or default
        if value:
            argv += [flag, value]
    return [*argv, "--", prompt]


def parse_claude_output(stdout: str, stderr: str) -> str:
    """Sans-I/O: the last stdout line that is a JSON object is the payload (§2.6)."""
    payload: dict[str, Any] | None = None
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            payload = doc
            break
    if payload is None:
        message = "claude CLI did not return JSON output"
        if stderr.strip():
            message += f". stderr: {stderr.strip()}"
        raise ToolError(message)
    text = coerce.text(payload.get("result"))
    if payload.get("is_error") is True:
        raise ToolError(text or "claude review failed")
    if not text:
        raise ToolError("claude review returned empty output")
    return text


def resolve_binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ToolError(f"claude CLI not found: {name}")
    return found


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> bytes:
    buf = bytearray()
    while chunk := await stream.read(64 * 1024):
        buf += chunk
        if len(buf) > cap:
            raise ToolError(f"claude review output exceeded {cap} bytes")
    return bytes(buf)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL to the CLI's group, also after it exited while the group has members
    (never to a number that may be a stranger's by then)."""
    procgroups.kill_group(proc.pid, reaped=proc.returncode is not None)


async def claude_review(cfg: ToolbridgeConfig, args: dict[str, Any]) -> str:
    argv = claude_argv(cfg.claude_bin, cfg, args)
    argv[0] = resolve_binary(cfg.claude_bin)
    try:
        proc, watch = await procgroups.start(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, killed as a whole
            env=without_secrets(os.environ),
        )
    except OSError as exc:  # found but not runnable: a missing interpreter, ENOEXEC, EACCES
        why = exc.strerror or type(exc).__name__
        raise ToolError(f"claude review failed: cannot run {argv[0]}: {why}") from None
    assert proc.stdout is not None and proc.stderr is not None
    cap = cfg.claude_output_max_bytes
    try:
        async with asyncio.timeout(cfg.claude_review_timeout):
            # a TaskGroup, not gather: when one stream overflows the other reader is cancelled
            async with asyncio.TaskGroup() as group:
                out_task = group.create_task(_read_capped(proc.stdout, cap))
                err_task = group.create_task(_read_capped(proc.stderr, cap))
                await watch.wait_exit()  # not proc.wait(): on asyncio's loop, its pipes too
                code = proc.returncode
                # it exited: a process it left may hold its stdout/stderr open
                _, held = await asyncio.wait((out_task, err_task), timeout=EXIT_GRACE)
                if held:
                    _kill_group(proc)  # its output then ends, instead of at the deadline
                    _, held = await asyncio.wait(held, timeout=EXIT_GRACE)
                if held:
                    # held by a process outside its group (one that made a session of
                    # its own), which no kill reaches: our ends closed, the readers end
                    # with what the CLI wrote, instead of at the deadline
                    watch.close()
        out, err = out_task.result(), err_task.result()
    except* ToolError as eg:
        raise eg.exceptions[0] from None
    except* TimeoutError:
        raise ToolError(
            f"claude review timed out after {go_duration(cfg.claude_review_timeout)}"
        ) from None
    finally:
        _kill_group(proc)  # always: nothing the CLI started outlives the call
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await watch.wait_exit()
        watch.close()  # its pipes, also when a process outside its group holds them
    stdout = out.decode("utf-8", errors="replace")
    stderr = err.decode("utf-8", errors="replace")
    if code != 0:
        raise ToolError(f"claude review failed: {stderr.strip() or f'exit status {code}'}")
    return parse_claude_output(stdout, stderr)
