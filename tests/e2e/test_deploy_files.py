"""The deploy files agree with the daemon: probes, drain time, compose validity."""

from __future__ import annotations

import os
import shutil
import subprocess
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
    assert 'ENTRYPOINT ["xwm-bridge"]' in text
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
