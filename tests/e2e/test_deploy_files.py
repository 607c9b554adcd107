"""The deploy files agree with the daemon: probes, drain time, compose validity."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from xwm_bridge.config import Limits

DEPLOY = ROOT / "deploy"


def test_k8s_probes_and_grace_period(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "xwm-bridge.yaml").read_text()))
    kinds = {d["kind"] for d in docs}
    assert kinds == {"Secret", "ConfigMap", "Deployment", "Service"}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    limits = Limits()
    assert (
        pod["terminationGracePeriodSeconds"]
        > limits.shutdown_grace + limits.upstream_cancel_timeout
    )
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    from xwm_bridge.config import load_config

    path = tmp_path / "config.yaml"
    path.write_text(config["data"]["config.yaml"])
    loaded = load_config(config_file=str(path), env={"ACP_AUTH_TOKEN": "x"})
    assert loaded.config.listen == "0.0.0.0:8787"


def test_dockerfile_healthcheck_and_exec_entrypoint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "/livez" in text
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "xwm-bridge"]' in text
    assert "USER 10001" in text


def compose_services(file: str) -> dict[str, Any]:
    """``docker-compose config`` (validates against the compose schema; no engine needed)."""
    tool = shutil.which("docker-compose")
    if tool is None:
        if os.environ.get("CI") == "true":
            raise AssertionError("docker-compose is required in CI (.ci/run installs it)")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    env = {**os.environ, "ACP_AUTH_TOKEN": "x"}
    out = subprocess.run(
        [tool, "-f", str(ROOT / file), "config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    services: dict[str, Any] = yaml.safe_load(out.stdout)["services"]
    return services


def test_compose_file_is_valid() -> None:
    services = compose_services("docker-compose.yml")
    assert set(services) == {"fake-upstream", "bridge", "nginx"}
    for mount in services["nginx"]["volumes"]:
        source = mount["source"] if isinstance(mount, dict) else mount.split(":")[0]
        assert os.path.exists(source), source


def test_replicas_compose_file_is_valid() -> None:
    """Two bridges on one Redis behind nginx (issue 6)."""
    services = compose_services("docker-compose.replicas.yml")
    assert set(services) == {"redis", "fake-upstream", "bridge-1", "bridge-2", "nginx"}
    for name in ("bridge-1", "bridge-2"):
        env_of = services[name]["environment"]
        assert env_of["XWM_SESSION_STORE"] == "redis"
        assert env_of["XWM_REDIS_URL"] == "redis://redis:6379/0"
    conf = (DEPLOY / "nginx" / "replicas.conf").read_text()
    assert "server bridge-1:8787" in conf and "server bridge-2:8787" in conf
    for mount in services["nginx"]["volumes"]:
        source = mount["source"] if isinstance(mount, dict) else mount.split(":")[0]
        assert os.path.exists(source), source


def test_images_keep_the_session_store_on_a_writable_path() -> None:
    assert "XWM_STATE_DIR=/var/lib/xwm-bridge" in (ROOT / "Dockerfile").read_text()
    unit = (DEPLOY / "systemd" / "xwm-bridge.service").read_text()
    assert "XWM_STATE_DIR=/var/lib/xwm-bridge" in unit and "StateDirectory=xwm-bridge" in unit
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "xwm-bridge.yaml").read_text()))
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert "/var/lib/xwm-bridge" in mounts


# --- issue 15 item 12: deployment files as users run them -----------------------------


def test_compose_services_have_healthchecks_restart_and_healthy_dependencies() -> None:
    for file in ("docker-compose.yml", "docker-compose.replicas.yml"):
        services = compose_services(file)
        for name, service in services.items():
            assert service.get("restart") == "unless-stopped", (file, name)
            check = service.get("healthcheck")
            assert check and check.get("test"), (file, name)
            for dep, spec in (service.get("depends_on") or {}).items():
                assert spec == {"condition": "service_healthy"}, (file, name, dep)
        # the fake upstream is built from the bridge's image: its own check, on its port
        upstream = " ".join(services["fake-upstream"]["healthcheck"]["test"])
        assert "9010" in upstream and "8787" not in upstream
    replicas = compose_services("docker-compose.replicas.yml")
    for name in ("bridge-1", "bridge-2"):
        assert "redis" in replicas[name]["depends_on"]  # waits for Redis, no exit 2
    assert "redis-cli" in " ".join(replicas["redis"]["healthcheck"]["test"])


def test_dockerfile_init_home_and_pinned_base() -> None:
    import re

    text = (ROOT / "Dockerfile").read_text()
    bases = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert bases and all(
        re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:\w+)?", b) for b in bases
    )
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "xwm-bridge"]' in text
    assert re.search(r"apt-get install .*tini=", text)
    for var in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        assert re.search(rf"\b{var}=/var/lib/xwm-bridge", text), var


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    assert hadolint.exists(), "hadolint is a [dev] dependency"
    out = subprocess.run(
        [str(hadolint), str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


SYSTEMD_HARDENING = {
    "Type": "notify",
    "NotifyAccess": "main",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "CapabilityBoundingSet": "",
    "SystemCallFilter": "@system-service",
    "LockPersonality": "yes",
    "UMask": "0077",
}


def unit_settings() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (DEPLOY / "systemd" / "xwm-bridge.service").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), value.strip())
    return out


def test_systemd_unit_is_hardened_and_notifies() -> None:
    settings = unit_settings()
    for key, value in SYSTEMD_HARDENING.items():
        assert settings.get(key) == value, (key, settings.get(key))


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("CI") == "true":
            raise AssertionError("systemd-analyze is required in CI (.ci/run installs systemd)")
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    text = (DEPLOY / "systemd" / "xwm-bridge.service").read_text()
    console = Path(sys.executable).with_name("xwm-bridge")
    unit = tmp_path / "xwm-bridge.service"  # the same unit, pointing at this checkout's binary
    unit.write_text(text.replace("/opt/xwm-bridge/.venv/bin/xwm-bridge", str(console)))
    out = subprocess.run(
        [tool, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    security = subprocess.run(
        [tool, "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    exposure = float(
        security.stdout.rsplit("Overall exposure level", 1)[1].split(":")[1].split()[0]
    )
    assert exposure <= 3.0, security.stdout  # systemd's "OK" band


def test_k8s_seccomp_fsgroup_startup_probe_and_versioned_image() -> None:
    from xwm_bridge import __version__

    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "xwm-bridge.yaml").read_text()))
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["fsGroup"] == 10001
    container = pod["containers"][0]
    assert container["startupProbe"]["httpGet"]["path"] == "/livez"
    image = container["image"]
    assert not image.endswith(":latest") and ":" in image.rsplit("/", 1)[-1]
    assert image.rsplit(":", 1)[1] == __version__


def test_example_config_runs_on_a_laptop_and_shows_the_sections(tmp_path: Path) -> None:
    from xwm_bridge.config import load_config

    path = DEPLOY / "config.example.yaml"
    doc = yaml.safe_load(path.read_text())
    assert {"agents", "store", "router", "multi_agent"} <= set(doc)
    assert any(p.get("kind") == "stdio" and p.get("command") for p in doc["providers"])
    # no variable needs to be set, and it listens on loopback (no token needed there)
    cfg = load_config(config_file=str(path), env={"HOME": str(tmp_path)}).config
    assert cfg.listen.startswith("127.0.0.1:")
    assert cfg.router.llm_base_url and cfg.multi_agent.base_url


async def test_example_config_serves(start_bridge: Any, tmp_path: Path) -> None:
    import aiohttp

    from tests.conftest import base_env

    bridge = await start_bridge(
        "--config", str(DEPLOY / "config.example.yaml"), env=base_env(HOME=str(tmp_path))
    )
    async with aiohttp.ClientSession() as http, http.get(f"{bridge.url}/readyz") as resp:
        assert resp.status == 200


def test_quick_tour_starts_one_daemon() -> None:
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("## Quick tour", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    starts = [
        line for line in tour.splitlines() if "xwm-bridge serve" in line or "make run" in line
    ]
    assert len(starts) == 1, starts
