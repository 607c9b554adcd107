# syntax=docker/dockerfile:1
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY xwm_bridge ./xwm_bridge
# dependencies are pinned in pyproject.toml
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --prefix=/install ".[fast]"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin bridge \
    && install -d -o bridge -g bridge -m 0700 /var/lib/xwm-bridge
COPY --from=build /install /usr/local
USER 10001
# sessions.db (the SQLite session store) lives here: mount a volume to keep sessions
# across container re-creation
ENV XWM_STATE_DIR=/var/lib/xwm-bridge
VOLUME ["/var/lib/xwm-bridge"]
EXPOSE 8787
# The bridge refuses a non-loopback address without ACP_AUTH_TOKEN: pass it at run time.
ENV ACP_LISTEN_ADDR=0.0.0.0:8787
HEALTHCHECK --interval=30s --timeout=3s CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8787/livez', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["xwm-bridge"]
CMD ["serve"]
