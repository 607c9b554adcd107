"""Sans-I/O pieces of opening an agent session: features, auth plans, options,
MCP server lists, prompt blocks."""

from __future__ import annotations

import base64
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from xwm_bridge.config import AgentsConfig, BridgeConfig, McpServerConfig, ProviderConfig
from xwm_bridge.providers.artifacts import ArtifactLimits
from xwm_bridge.providers.stdio import auth, mcp, options, prompt, registry
from xwm_bridge.providers.stdio.features import AgentFeatures

GEMINI_INIT = {
    "protocolVersion": 1,
    "authMethods": [
        {"id": "oauth-personal", "name": "Log in with Google"},
        {"id": "gemini-api-key", "name": "Gemini API key"},
    ],
    "agentCapabilities": {
        "loadSession": True,
        "promptCapabilities": {"image": True, "audio": True, "embeddedContext": True},
        "mcpCapabilities": {"http": True, "sse": True},
    },
}
OPENCODE_INIT = {
    "agentCapabilities": {
        "loadSession": True,
        "mcpCapabilities": {"http": True, "sse": True},
        "promptCapabilities": {"embeddedContext": True, "image": True},
        "sessionCapabilities": {"close": {}, "fork": {}, "list": {}, "resume": {}},
    },
    "authMethods": [{"id": "opencode-login", "name": "Login with opencode"}],
}


def test_features() -> None:
    g = AgentFeatures.of(GEMINI_INIT)
    assert g.load_session and not g.resume_session and g.image and g.mcp_sse
    assert g.auth_method_ids == ("oauth-personal", "gemini-api-key")
    o = AgentFeatures.of(OPENCODE_INIT)
    assert o.resume_session and not o.audio
    assert AgentFeatures.of(None) == AgentFeatures()
    assert AgentFeatures().describe_auth() == "none advertised"


def provider(**kw: Any) -> ProviderConfig:
    return ProviderConfig("gemini", kind="stdio", command=("gemini", "--acp"), **kw)


def test_auth_plans() -> None:
    features = AgentFeatures.of(GEMINI_INIT)
    entry = registry.entry("gemini")
    configured = auth.plan(
        provider(auth_method="gemini-api-key", auth_api_key="k1"), features, entry, {}
    )
    assert configured.params == {"methodId": "gemini-api-key", "_meta": {"api-key": "k1"}}
    assert configured.key_source == "config"
    from_env = auth.plan(provider(), features, entry, {"GEMINI_API_KEY": "k2"})
    assert (
        from_env.params["_meta"] == {"api-key": "k2"}
        and from_env.key_source == "env:GEMINI_API_KEY"
    )
    method_only = auth.plan(provider(auth_method="oauth-personal"), features, entry, {})
    assert method_only.params == {"methodId": "oauth-personal"}
    codex = auth.plan(
        ProviderConfig("codex", kind="stdio", command=("codex-acp",)),
        AgentFeatures.of({"authMethods": [{"id": "api-key", "name": "API Key"}]}),
        registry.entry("codex"),
        {"OPENAI_API_KEY": "sk-1"},
    )
    assert codex.params == {"methodId": "api-key", "_meta": {"api-key": {"apiKey": "sk-1"}}}
    with pytest.raises(auth.AuthUnavailable) as info:
        auth.plan(provider(), features, entry, {})
    assert str(info.value) == (
        "agent gemini requires authentication and no usable method is configured (its "
        "authMethods: oauth-personal (Log in with Google), gemini-api-key (Gemini API key)); "
        "set providers[].auth_method (and auth_api_key), or set GEMINI_API_KEY for the agent"
    )
    with pytest.raises(auth.AuthUnavailable, match="'vertex' is not one of its authMethods"):
        auth.plan(provider(auth_method="vertex"), features, entry, {})


OPENCODE_SESSION = {
    "sessionId": "ses_1",
    "configOptions": [
        {
            "id": "model",
            "category": "model",
            "type": "select",
            "currentValue": "fake/fake-model",
            "options": [
                {"value": "opencode/big-pickle", "name": "OpenCode Zen/Big Pickle"},
                {"value": "fake/fake-model", "name": "Fake LLM/Fake Model"},
                {"value": "fake/other-model", "name": "Fake LLM/Other"},
            ],
        },
        {
            "id": "mode",
            "category": "mode",
            "type": "select",
            "currentValue": "build",
            "options": [{"value": "build", "name": "build"}, {"value": "plan", "name": "plan"}],
        },
        {"id": "verbose", "type": "boolean", "currentValue": False},
    ],
}
GEMINI_SESSION = {
    "sessionId": "e6",
    "modes": {"availableModes": [{"id": "default"}, {"id": "yolo"}], "currentModeId": "default"},
    "models": {
        "availableModels": [{"modelId": "auto", "name": "Auto"}, {"modelId": "gemini-2.5-pro"}],
        "currentModelId": "auto",
    },
}


def test_options_from_config_options_and_legacy_state() -> None:
    oc = options.SessionOptions.of(OPENCODE_SESSION)
    assert oc.model.config_id == "model" and oc.model.current == "fake/fake-model"
    assert oc.mode.current == "build" and [c.value for c in oc.mode.choices] == ["build", "plan"]
    call = options.select_call("ses_1", oc.model, "other-model", "model")
    assert call == (
        "session/set_config_option",
        {"sessionId": "ses_1", "configId": "model", "value": "fake/other-model"},
        "fake/other-model",
    )
    assert options.select_call("ses_1", oc.model, "fake/fake-model", "model") is None
    assert options.select_call("ses_1", oc.mode, "plan", "mode")[0] == "session/set_config_option"
    assert options.option_call("ses_1", oc, "verbose=true") == (
        "session/set_config_option",
        {"sessionId": "ses_1", "configId": "verbose", "type": "boolean", "value": True},
    )
    with pytest.raises(options.OptionError, match="'nope' is not offered"):
        options.option_call("ses_1", oc, "nope=1")
    g = options.SessionOptions.of(GEMINI_SESSION)
    assert options.select_call("e6", g.model, "gemini-2.5-pro", "model") == (
        "session/set_model",
        {"sessionId": "e6", "modelId": "gemini-2.5-pro"},
        "gemini-2.5-pro",
    )
    assert options.select_call("e6", g.mode, "yolo", "mode")[0] == "session/set_mode"
    with pytest.raises(options.OptionError, match=re.escape("offered: auto, gemini-2.5-pro")):
        options.select_call("e6", g.model, "gpt-4o", "model")
    with pytest.raises(options.OptionError, match="no model selection"):
        options.select_call("x", options.SessionOptions().model, "m", "model")
    # a later answer without the state keeps what was known
    kept = options.SessionOptions.of({}, g)
    assert kept.model.current == "auto"


def test_model_matching() -> None:
    choices = (
        options.Choice("fake/alpha", "Alpha"),
        options.Choice("other/alpha", "Alpha 2"),
        options.Choice("fake/beta", "Beta"),
    )
    assert options.match(choices, "fake/beta") == "fake/beta"
    assert options.match(choices, "BETA") == "fake/beta"
    assert options.match(choices, "alpha") is None  # ambiguous
    assert options.match(choices, "Alpha 2") == "other/alpha"
    assert options.match(choices, "") is None


def test_mcp_selection() -> None:
    servers = (
        McpServerConfig("files", command="mcp-files", args=("--root", "/srv"), env=("K=v1",)),
        McpServerConfig("web", type="http", url="https://x/mcp", headers=("Authorization: B t",)),
        McpServerConfig("old", type="sse", url="https://x/sse"),
    )
    p = ProviderConfig("a", kind="stdio", command=("a",), mcp_servers=servers, toolbridge=True)
    config = BridgeConfig(agents=AgentsConfig(toolbridge_env=("LLM_API_KEY=k",)))
    chosen = mcp.select(p, config, AgentFeatures(mcp_http=True), [])
    assert chosen.names() == ["files", "web", "xwm-toolbridge"]
    assert chosen.servers[0] == {
        "name": "files",
        "command": "mcp-files",
        "args": ["--root", "/srv"],
        "env": [{"name": "K", "value": "v1"}],
    }
    assert chosen.servers[1]["headers"] == [{"name": "Authorization", "value": "B t"}]
    assert chosen.servers[2]["args"] == ["-m", "xwm_bridge", "toolbridge"]
    assert chosen.servers[2]["env"] == [{"name": "LLM_API_KEY", "value": "k"}]
    assert chosen.skipped == (("old", "agent does not accept sse MCP servers"),)
    client = mcp.parse_client(
        [{"name": "c", "command": "x", "args": ["1"], "env": [{"name": "T", "value": "s3"}]}]
    )
    assert mcp.secret_values(client) == ["s3"]
    for bad, message in (
        ("x", "mcpServers must be a list"),
        ([{"name": "c"}], "command: required"),
        ([{"name": "c", "type": "http", "url": "ftp://x"}], "http(s) URL"),
        ([{"name": "c", "type": "ws", "url": "http://x"}], "type: must be"),
        ([{"name": "c", "command": "x", "env": [{"name": "T"}]}], "env must be a list"),
    ):
        with pytest.raises(mcp.McpError, match=re.escape(message)):
            mcp.parse_client(bad)


def test_prompt_blocks(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"\x89PNG....")
    (tmp_path / "b.md").write_text("# title")
    (tmp_path / "c.bin").write_bytes(b"\xff\xfe\x00")
    limits = ArtifactLimits((str(tmp_path),), max_files=3, max_file_bytes=100, max_total_bytes=1000)
    items = prompt.load(
        [
            {"name": "rel", "path": "relative.txt"},
            {"name": "gone", "path": str(tmp_path / "gone.txt")},
            {"name": "a.png", "path": str(tmp_path / "a.png")},
            {"name": "b.md", "path": str(tmp_path / "b.md")},
            {"path": str(tmp_path / "c.bin")},
        ],
        [{"label": "x.txt", "encoding": "base64", "content": base64.b64encode(b"hey").decode()}],
        limits,
    )
    reasons = {i.name: i.reason for i in items}
    assert reasons["rel"] == "not an absolute path" and reasons["gone"].startswith("cannot read")
    assert reasons["x.txt"] == "more than 3 files"
    rich = AgentFeatures(image=True, embedded_context=True)
    blocks, report = prompt.compose("do it", items, rich, "earlier context")
    assert [b["type"] for b in blocks] == ["text", "text", "text", "image", "resource", "resource"]
    assert blocks[0]["text"] == "earlier context" and blocks[2]["text"] == "do it"
    assert blocks[4]["resource"] == {
        "uri": f"file://{tmp_path / 'b.md'}",
        "mimeType": "text/markdown",
        "text": "# title",
    }
    assert "blob" in blocks[5]["resource"]
    sent = [r["sentAs"] for r in report]
    assert sent == ["text", "text", "image", "resource", "resource", "text"]
    plain_blocks, plain_report = prompt.compose("do it", items, AgentFeatures())
    assert [b["type"] for b in plain_blocks] == ["text", "text"]
    assert plain_blocks[0]["text"].startswith("User-selected local attachments:\n- rel: ")
    assert plain_report[2]["reason"] == "the agent does not take image or embedded content"
    assert prompt.compose("x", [], AgentFeatures()) == ([{"type": "text", "text": "x"}], [])


def test_many_attachments_are_loaded_in_linear_time() -> None:
    """The file cap was checked by counting the loaded items again for every entry:
    quadratic, so the ~250,000 small inline artifacts a 4 MiB request holds kept a
    worker thread (and the turn) busy for many minutes; 30,000 took ~20 s, now ~0.1 s."""
    limits = ArtifactLimits(("/nonexistent",), max_files=24)
    started = time.monotonic()
    items = prompt.load([{"content": "x"}] * 30_000, None, limits)
    assert time.monotonic() - started < 3
    assert sum(1 for i in items if i.data is not None) == 24
    assert items[-1].reason == "more than 24 files"


def test_an_attachment_whose_directory_is_swapped_after_the_check_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory on the attachment's path swapped for a symlink out of the root
    between the check and the open: only the last component was opened O_NOFOLLOW, so
    the file outside was read and sent to the agent. Now nothing on the way is followed."""
    root = tmp_path / "work"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "notes.txt").write_text("inside")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("secret")
    check = prompt._inside

    def racing(real: str, roots: tuple[str, ...]) -> bool:
        inside = check(real, roots)
        (root / "sub").rename(root / "sub.old")
        (root / "sub").symlink_to(outside)
        return inside

    monkeypatch.setattr(prompt, "_inside", racing)
    limits = ArtifactLimits((str(root),))
    [item] = prompt.load([{"path": str(root / "sub" / "notes.txt")}], None, limits)
    assert item.data is None and item.reason.startswith("cannot read")
    monkeypatch.setattr(prompt, "_inside", check)
    [whole] = prompt.load([{"path": "/"}], None, ArtifactLimits(("/",)))
    assert whole.data is None  # a reason, not an IndexError


def test_an_attachment_grown_since_its_fstat_stays_within_the_total_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget was checked against the size fstat gave; what was then read (up to
    the per-file cap) was taken whole, past ``max_total_bytes``."""
    (tmp_path / "a.log").write_text("x" * 50)
    (tmp_path / "b.log").write_text("y" * 50)
    fstat = os.fstat

    def smaller(fd: int) -> os.stat_result:
        st = fstat(fd)
        fields = list(st)
        fields[stat.ST_SIZE] = 1
        return os.stat_result(fields)

    monkeypatch.setattr(prompt.os, "fstat", smaller)
    limits = ArtifactLimits((str(tmp_path),), max_file_bytes=60, max_total_bytes=80)
    a, b = prompt.load([{"path": str(tmp_path / n)} for n in ("a.log", "b.log")], None, limits)
    assert a.data == b"x" * 50
    assert b.data is None and b.reason == "over the total size cap"


def test_history_context() -> None:
    assert prompt.history_context([]) == ""
    text = prompt.history_context(["first", "x" * 3000])
    assert "\n1. first\n2. " + "x" * 2000 + "…\n" in text
    assert text.startswith("[Context from the bridge")


def test_a_catalog_save_that_fails_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that failed (disk full) left its ``.agent-catalog-*`` temp file behind,
    one more each time the catalog was saved."""
    from xwm_bridge.providers.stdio import catalog

    path = tmp_path / "state" / "agent-catalog.json"
    store = catalog.AgentCatalog(path)

    def full(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(catalog.os, "replace", full)
    for _ in range(3):
        store.learn_init("agent", {"agentInfo": {"name": "a"}})
    assert os.listdir(path.parent) == []
