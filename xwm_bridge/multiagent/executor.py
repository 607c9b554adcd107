"""The multi-agent executor: planner once, then up to N rounds of workers → reviewer.

Each model call has its own deadline (``multi_agent.call_timeout``); the whole
turn runs in the task the turn runner cancels on ``session.cancel``, so a cancel
aborts the call in flight (the HTTP request is torn down) or stops the loop
between steps. Parallel workers run in a TaskGroup owned by the turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.core.context import TurnContext
from xwm_bridge.core.executors import CANCELLED
from xwm_bridge.llm import (
    ChatRequest,
    LLMError,
    LLMRefusal,
    complete_choice,
    normalize_base_url,
)
from xwm_bridge.multiagent import protocol as p
from xwm_bridge.netaddr import HostPolicy, endpoint_of

log = logging.getLogger("xwm_bridge.multi_agent")


class MultiAgentExecutor:
    MODE = p.MODE

    def __init__(self, config: BridgeConfig, http: aiohttp.ClientSession) -> None:
        self._config = config
        self._http = http
        #: where a client's own aiGatewayBaseUrl may point (as the classifier's)
        self._client_hosts = HostPolicy(
            config.multi_agent.allowed_hosts, config.configured_endpoints()
        )

    def _endpoint(self, params: Mapping[str, Any]) -> tuple[str, str]:
        """(base URL, key): the client's pair, else the server's; never mixed."""
        key = coerce.text(params.get("aiGatewayApiKey"))
        if key:
            return coerce.text(params.get("aiGatewayBaseUrl")), key
        ma = self._config.multi_agent
        return ma.base_url, ma.api_key

    def _refused_host(self, params: Mapping[str, Any], base_url: str) -> str:
        """The host of a client's own ``aiGatewayBaseUrl`` the bridge may not dial, or
        ``""``: the client must not make the bridge call into its network (SSRF)."""
        if not coerce.text(params.get("aiGatewayApiKey")):
            return ""  # the server's endpoint
        # the URL the call will use: no aiGatewayBaseUrl means the default
        # (https://api.openai.com/v1), which a list must name like any other host
        host, _, port = endpoint_of(normalize_base_url(base_url)).rpartition(":")
        if host and self._client_hosts.allows(host, int(port or 0)):
            return ""
        return host or base_url

    async def execute(self, ctx: TurnContext) -> dict[str, Any]:
        params = ctx.params
        ma = self._config.multi_agent
        prompt = p.task_prompt(
            ctx.session.history, coerce.text(params.get("taskPrompt")), params.get("attachments")
        )
        await ctx.emit(p.preparing().update())
        base_url, key = self._endpoint(params)
        if not key:
            return await self._fail(ctx, p.MISSING_KEY)
        refused = self._refused_host(params, base_url)
        if refused:
            log.info("multi-agent turn refused: host not allowed", extra={"host": refused[:256]})
            return await self._fail(ctx, p.HOST_NOT_ALLOWED)
        if not prompt:
            return await self._fail(ctx, p.NO_PROMPT)
        model = coerce.text(params.get("model")) or self._config.multi_agent_model or "gpt-4o"

        #: the ``finish_reason`` of each call since the round began (its workers')
        finishes: list[str] = []

        async def call(messages: list[dict[str, str]]) -> str:
            req = ChatRequest(base_url, key, model, messages, ma.call_timeout, ma.max_tokens)
            text, finish = await complete_choice(self._http, req)
            finishes.append(finish)
            return text

        #: what an error in a later round keeps: the best reviewed draft so far (a
        #: refusal keeps nothing: the run is refused, its drafts were step updates)
        kept: dict[str, Any] = {}
        try:
            plan = await call(p.planner_messages(prompt))
            await ctx.emit(p.Step("Planner", "architect", plan, 1).update())
            best_draft, best_score, draft, feedback = "", -1.0, "", ""
            best_stop = ""
            for iteration in range(1, ma.max_iterations + 1):
                finishes.clear()
                drafts = await self._work(ctx, call, prompt, plan, iteration, draft, feedback)
                stop = p.draft_stop(finishes)  # a worker's answer cut short or filtered
                draft = p.merge_drafts(drafts)
                review = await call(p.reviewer_messages(prompt, plan, draft))
                parsed = p.parse_score(review)
                score = 0.0 if parsed is None else parsed
                await ctx.emit(p.Step("Reviewer", "tester", review, iteration, score).update())
                if score > best_score:
                    best_draft, best_score, best_stop = draft, score, stop
                kept = p.kept_draft(best_draft, best_score, iteration, plan)
                if score >= ma.score_threshold:
                    return p.success_result(
                        ctx.turn_id, draft, score, iteration, approved=True, plan=plan, stop=stop
                    )
                feedback = review
            return p.success_result(
                ctx.turn_id,
                best_draft,
                best_score,
                ma.max_iterations,
                approved=False,
                plan=plan,
                stop=best_stop,
            )
        except LLMRefusal as exc:  # a call's answer filtered to nothing: the run is refused
            return await self._fail(ctx, str(exc), stopReason="refusal")
        except LLMError as exc:
            return await self._fail(ctx, str(exc), **kept)

    async def _work(
        self,
        ctx: TurnContext,
        call: Any,
        prompt: str,
        plan: str,
        iteration: int,
        previous: str,
        feedback: str,
    ) -> list[str]:
        workers = self._config.multi_agent.workers

        async def one(worker: int) -> str:
            messages = p.worker_messages(
                prompt, plan, worker=worker, workers=workers, previous=previous, feedback=feedback
            )
            draft: str = await call(messages)
            step = p.Step("Worker", "engineer", draft, iteration, worker=worker)
            await ctx.emit(step.update())
            return draft

        if workers == 1:
            return [await one(1)]
        current = asyncio.current_task()
        assert current is not None
        cancels = current.cancelling()
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(i)) for i in range(1, workers + 1)]
                # wait in the body: a worker's failure then cancels this await and
                # the group takes its own cancel back (CPython 3.11 leaves it counted
                # when it lands in the group's exit), so ``cancelling()`` counts
                # only cancels from outside
                await asyncio.wait(tasks)
        except* LLMError as eg:
            if current.cancelling() > cancels:
                # the client's cancel came while the round wound down after a
                # worker's failure: the group prefers the error and swallows the
                # cancel, which is what the turn must end with
                raise asyncio.CancelledError from None
            raise eg.exceptions[0] from None
        return [t.result() for t in tasks]

    async def _fail(self, ctx: TurnContext, message: str, **extra: Any) -> dict[str, Any]:
        log.info("multi-agent turn failed", extra={"turn_id": ctx.turn_id, "error": message})
        await ctx.emit(p.error_update(message))
        return p.failure_result(ctx.turn_id, message, **extra)

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]:
        await ctx.emit(p.error_update(CANCELLED))
        return p.failure_result(ctx.turn_id, CANCELLED, cancelled=True)
