"""deploy/kubernetes.yaml holds together: the replicas' command is one ``forkserve serve``
accepts, the gateway's is one the installed gateway accepts, and the ports, labels,
probes and balance thresholds agree with each other and with ``forkserve serve --dp-size``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from runtime.cli import build_parser
from runtime.server.data_parallel import GATEWAY_BALANCE

MANIFEST = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes.yaml"


@pytest.fixture(scope="module")
def docs() -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_replicas_serve_on_the_port_their_probes_and_the_gateway_use(docs):
    replica = docs[("Deployment", "forkserve-replica")]
    container = _container(replica)
    command = container["command"]
    assert command[:2] == ["forkserve", "serve"]
    ns = build_parser().parse_args(command[1:])  # every flag is one forkserve serve knows
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert ns.port == port and ns.host == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/health_generate", "port": "http"}
    gateway = _container(docs[("Deployment", "forkserve-gateway")])["command"]
    assert int(_flag(gateway, "--service-discovery-port")) == port
    label = replica["spec"]["template"]["metadata"]["labels"]
    key, value = _flag(gateway, "--selector").split("=")
    assert label[key] == value and replica["spec"]["selector"]["matchLabels"] == label


def test_the_gateway_command_is_valid_and_matches_dp_size(docs):
    launch_router = pytest.importorskip("sglang_router.launch_router")
    deployment = docs[("Deployment", "forkserve-gateway")]
    command = _container(deployment)["command"]
    assert command[:3] == ["python", "-m", "sglang_router.launch_router"]
    args = launch_router.parse_router_args(command[3:])  # the installed gateway's own parser
    assert args.service_discovery and args.policy == "cache_aware"
    assert (args.balance_abs_threshold, args.balance_rel_threshold) == GATEWAY_BALANCE
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "forkserve-gateway"
    role = docs[("Role", "forkserve-gateway")]["rules"][0]
    assert role["resources"] == ["pods"] and set(role["verbs"]) >= {"get", "list", "watch"}
    service = docs[("Service", "forkserve")]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
