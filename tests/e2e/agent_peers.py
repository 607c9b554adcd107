"""Locating the real stdio ACP agents installed by .ci/run (``.peers/agents``) and
building their configs against the in-repo fake LLM."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

AGENTS_DIR = ROOT / ".peers" / "agents" / "node_modules" / ".bin"


def environ_of(pid: int) -> dict[str, str]:
    raw = (Path("/proc") / str(pid) / "environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def request_tool_names(body: Any) -> set[str]:
    """Tool names an agent offered the model: OpenAI ``tools`` or Gemini
    ``functionDeclarations``."""
    names: set[str] = set()
    for tool in body.get("tools") or [] if isinstance(body, dict) else []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and function.get("name"):
            names.add(str(function["name"]))
        for decl in tool.get("functionDeclarations") or []:
            if isinstance(decl, dict) and decl.get("name"):
                names.add(str(decl["name"]))
    return names


def require_agent(name: str) -> str:
    """Path of an installed agent; skip locally, fail in CI, when it is missing."""
    path = AGENTS_DIR / name
    if path.exists():
        return str(path)
    message = f"{name} not installed in {AGENTS_DIR} (run .ci/run or its issue-8 block)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def isolated_env(home: Path) -> list[str]:
    """Keep the agents' config, caches and state inside the test's temp folder."""
    dirs = {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_STATE_HOME": home / ".local" / "state",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return [f"{k}={v}" for k, v in dirs.items()]


def opencode_provider(tmp: Path, llm_url: str, workdir: Path) -> dict[str, Any]:
    binary = require_agent("opencode")
    (workdir / "opencode.json").write_text(
        json.dumps(
            {
                "autoupdate": False,
                "share": "disabled",
                "provider": {
                    "fake": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Fake LLM",
                        "options": {"baseURL": f"{llm_url}/v1", "apiKey": "sk-local"},
                        "models": {
                            "fake-model": {"name": "Fake Model", "tool_call": True},
                            "other-model": {
                                "name": "Other Model",
                                "tool_call": True,
                                "attachment": True,
                                "modalities": {"input": ["text", "image"], "output": ["text"]},
                            },
                        },
                    }
                },
                "model": "fake/fake-model",
                "small_model": "fake/fake-model",
                "permission": {"edit": "ask", "bash": "ask"},
            }
        )
    )
    env = [
        *isolated_env(tmp / "home"),
        "OPENCODE_DISABLE_MODELS_FETCH=1",
        "OPENCODE_DISABLE_AUTOUPDATE=1",
        "OPENCODE_DISABLE_SHARE=1",
    ]
    return {
        "id": "opencode",
        "label": "OpenCode (local)",
        "kind": "stdio",
        "command": [binary, "acp"],
        "env": env,
        "cwd": str(workdir),
    }
