"""``xwm-bridge toolbridge``: an MCP server over stdio with chat, claude_review, vault_kv."""
