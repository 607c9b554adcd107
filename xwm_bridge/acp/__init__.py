"""The ACP front door: the bridge as an Agent Client Protocol agent.

An ACP client (Zed, a headless ACP CLI, the official SDKs' clients) talks to one
agent, the bridge — over ``xwm-bridge acp`` (stdio) or ``serve``'s
``/acp/remote`` (WebSocket, Streamable HTTP). Behind it every ``session/prompt``
is one bridge turn through :meth:`~xwm_bridge.app.methods.BridgeMethods.session_turn`,
so queues, routing, executors, cancel, persistence and metrics are those of
``serve``. Sans-I/O pieces: :mod:`.codec`, :mod:`.prompts`, :mod:`.updates`,
:mod:`.options`, :mod:`.remote`; the transports that move bytes live in ``transport/``.
"""
