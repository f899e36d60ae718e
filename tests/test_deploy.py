"""The deployment files work as written, checked without Docker or a cluster.

Kubernetes manifests are validated against the API's JSON schemas that the
``kubernetes-validate`` package bundles (strict: an unknown or misspelt field fails), then
cross-checked where a schema cannot see (a Service that selects no pod, a catalog path that
is not the mounted ConfigMap). The health-check commands of the Dockerfile and the compose
file are run for real against a local HTTP server.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from aiohttp import web
from kubernetes_validate.utils import all_versions

from app.catalog.loader import load
from app.demo import DEMO_SECRET
from app.settings import ConfigError, Settings
from tests.conftest import ROOT
from tests.dockerfile import healthcheck_command, instructions

MANIFESTS = ROOT / "deploy" / "kubernetes"
OLDEST_KUBERNETES = (1, 30)
KUBERNETES = sorted(
    {v for v in all_versions() if tuple(map(int, v.split(".")[:2])) >= OLDEST_KUBERNETES}
)
SECRETS = {
    "TOOLGATE_JWT_SECRET",
    "TOOLGATE_DATABASE_URL",
    "TOOLGATE_REDIS_URL",
    "TOOLGATE_KNOWN_VALUES_KEY",
}


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def manifest(kind: str) -> dict[str, Any]:
    (found,) = [d for p in MANIFESTS.glob("*.yaml") for d in documents(p) if d["kind"] == kind]
    return found


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


# --- Kubernetes ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(MANIFESTS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_manifest_is_valid_for_every_supported_kubernetes(path: Path) -> None:
    assert KUBERNETES
    docs = documents(path)
    assert docs
    for doc in docs:
        for version in KUBERNETES:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_deployment_runs_several_non_root_pods_with_probes_and_limits() -> None:
    deployment = manifest("Deployment")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (server,) = pod["containers"]
    (port,) = server["ports"]
    assert server["command"][server["command"].index("--port") + 1] == str(port["containerPort"])
    assert server["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert server["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"]["port"] in {port["name"], port["containerPort"]}
    for container in pod["containers"] + pod["initContainers"]:
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_pods_migrate_before_they_serve() -> None:
    pod = manifest("Deployment")["spec"]["template"]["spec"]
    (migrate,) = pod["initContainers"]
    assert migrate["command"] == ["toolgate", "migrate"]
    assert migrate["image"] == pod["containers"][0]["image"]
    assert pod["containers"][0]["command"][:2] == ["toolgate", "serve"]


def test_secrets_come_from_the_secret_by_reference_only() -> None:
    pod = manifest("Deployment")["spec"]["template"]["spec"]
    secret = manifest("Secret")["metadata"]["name"]
    for container in pod["containers"] + pod["initContainers"]:
        for variable in container["env"]:
            if variable["name"] in SECRETS:
                assert "value" not in variable, variable["name"]
                assert variable["valueFrom"]["secretKeyRef"]["name"] == secret
                assert variable["valueFrom"]["secretKeyRef"]["key"] == variable["name"]
    server_env = {v["name"] for v in pod["containers"][0]["env"]}
    assert server_env >= SECRETS


def test_the_example_secret_is_refused_as_it_stands() -> None:
    """Applied by mistake, the placeholders cannot become a working, guessable secret."""
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        Settings.from_env(manifest("Secret")["stringData"]).check_keys()


def test_the_catalog_path_is_the_mounted_configmap_and_it_is_valid(tmp_path: Path) -> None:
    pod = manifest("Deployment")["spec"]["template"]["spec"]
    configmap = manifest("ConfigMap")
    server = pod["containers"][0]
    catalog = next(v["value"] for v in server["env"] if v["name"] == "TOOLGATE_CATALOG")
    mount = next(m for m in server["volumeMounts"] if m["mountPath"] == catalog)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    for name, text in configmap["data"].items():
        assert name.endswith(".yaml")  # the loader reads a directory's *.yaml files
        (tmp_path / name).write_text(text)
    assert load(tmp_path, {}).tools


def test_the_service_budget_and_autoscaler_all_reach_the_deployments_pods() -> None:
    deployment = manifest("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    service = manifest("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    budget = manifest("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    autoscaler = manifest("HorizontalPodAutoscaler")
    assert autoscaler["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert autoscaler["spec"]["minReplicas"] >= 2


# --- Docker ----------------------------------------------------------------------------------


def test_the_image_installs_the_package_and_runs_unprivileged() -> None:
    steps = instructions()
    runs = " ".join(a for k, a in steps if k == "RUN")
    assert "pip install --no-cache-dir ." in runs
    assert not re.search(r"pip install[^&]*(\s-e\s|--editable)", runs)
    (user,) = [a for k, a in steps if k == "USER"]
    assert user.split(":")[0] not in {"0", "root"}
    assert "TOOLGATE_CATALOG=" in " ".join(a for k, a in steps if k == "ENV")
    assert "/healthz" in " ".join(healthcheck_command())


def test_the_build_context_keeps_what_the_image_copies_and_drops_local_state() -> None:
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {".git", ".venv", ".toolgate", "tests"} <= set(ignored)
    copied = {
        source.split("/")[0] for k, a in instructions() if k == "COPY" for source in a.split()[:-1]
    }
    assert copied.isdisjoint(ignored)


def test_compose_waits_for_healthy_services_and_keeps_postgres_data() -> None:
    services = compose()["services"]
    assert "/readyz" in " ".join(services["toolgate"]["healthcheck"]["test"])
    assert "/_control/stats" in " ".join(services["providers"]["healthcheck"]["test"])
    conditions = services["toolgate"]["depends_on"]
    assert set(conditions) == {"postgres", "redis", "providers"}
    assert {c["condition"] for c in conditions.values()} == {"service_healthy"}
    for name in conditions:
        assert services[name]["healthcheck"]["test"]
    (volume,) = services["postgres"]["volumes"]
    name, path = volume.split(":")
    assert path == "/var/lib/postgresql/data"
    assert name in compose()["volumes"]


def test_compose_publishes_its_ports_on_loopback_only() -> None:
    """compose runs toolgate with the published demo secret: a port published on every
    interface let anyone on the network mint an admin token for any tenant (and drive the
    demo providers' control endpoints)."""
    services = compose()["services"]
    assert services["toolgate"]["environment"]["TOOLGATE_JWT_SECRET"] == DEMO_SECRET
    published = [port for service in services.values() for port in service.get("ports", [])]
    assert published
    for port in published:
        assert str(port).startswith("127.0.0.1:"), port


def test_compose_says_how_to_mint_a_token() -> None:
    header = (ROOT / "docker-compose.yml").read_text().split("\nservices:")[0]
    assert "docker compose exec -T toolgate toolgate token --sub" in header


# --- health-check commands, run for real -----------------------------------------------------

HEALTH_CHECKS: dict[str, Callable[[], list[str]]] = {
    "Dockerfile HEALTHCHECK": lambda: healthcheck_command(),
    "compose toolgate": lambda: compose()["services"]["toolgate"]["healthcheck"]["test"][1:],
    "compose providers": lambda: compose()["services"]["providers"]["healthcheck"]["test"][1:],
}


@pytest.fixture
async def health_server() -> AsyncIterator[tuple[int, dict[str, int]]]:
    """Answers every GET with the status in ``answer["status"]``."""
    answer = {"status": 200}

    async def respond(request: web.Request) -> web.Response:
        return web.Response(status=answer["status"])

    app = web.Application()
    app.router.add_get("/{tail:.*}", respond)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1], answer  # type: ignore[union-attr]
    await runner.cleanup()


@pytest.mark.parametrize("source", sorted(HEALTH_CHECKS))
async def test_a_health_check_passes_only_while_its_endpoint_answers_200(
    source: str, health_server: tuple[int, dict[str, int]]
) -> None:
    port, answer = health_server
    command = HEALTH_CHECKS[source]()
    assert command[0] == "python"
    local = [sys.executable] + [
        re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", a) for a in command[1:]
    ]

    def exit_code() -> int:
        return subprocess.run(local, capture_output=True, timeout=30, check=False).returncode

    assert await asyncio.to_thread(exit_code) == 0
    answer["status"] = 503
    assert await asyncio.to_thread(exit_code) != 0
