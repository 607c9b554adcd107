# syntax=docker/dockerfile:1
# The base is pinned to a Python patch release and a Debian release. For reproducible
# builds also pin the digest your registry serves:
#   FROM python:3.11.14-slim-bookworm@sha256:<digest>
FROM python:3.11.14-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY xwm_bridge ./xwm_bridge
# dependencies are pinned in pyproject.toml
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --prefix=/install ".[fast]"

FROM python:3.11.14-slim-bookworm
# tini is PID 1: it forwards SIGTERM to the daemon and reaps the orphans that stdio agent
# process trees leave behind (the daemon kills an agent's whole process group, but a
# grandchild that escaped it is re-parented to PID 1)
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1* \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 bridge \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/xwm-bridge \
        --shell /usr/sbin/nologin bridge \
    && install -d -o bridge -g bridge -m 0700 /var/lib/xwm-bridge
COPY --from=build /install /usr/local
USER 10001
# sessions.db (the SQLite session store) lives here, and so do HOME and the XDG
# directories: stdio agents (opencode, gemini) write their config, caches and logs
# there, which works with a read-only root filesystem. Mount a volume on it to keep
# sessions across container re-creation.
ENV XWM_STATE_DIR=/var/lib/xwm-bridge \
    HOME=/var/lib/xwm-bridge \
    XDG_CONFIG_HOME=/var/lib/xwm-bridge/.config \
    XDG_CACHE_HOME=/var/lib/xwm-bridge/.cache \
    XDG_STATE_HOME=/var/lib/xwm-bridge/.local/state \
    XWM_LOG_FORMAT=json
VOLUME ["/var/lib/xwm-bridge"]
EXPOSE 8787
# The bridge refuses a non-loopback address without ACP_AUTH_TOKEN: pass it at run time.
ENV ACP_LISTEN_ADDR=0.0.0.0:8787
HEALTHCHECK --interval=30s --timeout=3s CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8787/livez', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["/usr/bin/tini", "--", "xwm-bridge"]
CMD ["serve"]
