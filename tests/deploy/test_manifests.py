"""deploy/k8s, validated without a cluster: every overlay renders, every object passes the
Kubernetes schemas (strict), and the structure that keeps the service up is there."""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from gateway.metrics import GatewayMetrics
from ops.processes import REPO_ROOT
from ops.role import SERVICE_ROLES
from tests.config.test_readme import variables_read_by_the_code
from tests.deploy.manifests import (
    KUBERNETES_VERSION,
    OVERLAYS,
    Manifest,
    component,
    container,
    of_kind,
    render,
    role,
)

ALL = ("base", *OVERLAYS)
SECRETS_DIR = "/run/secrets/switchyard/"
SERVING = {"web", "gateway", "guardrails", "s3-endpoint", "batcher", "celery-worker"}
# Who calls vLLM: the gateway and the batcher send requests, the watcher scrapes /metrics.
VLLM_CALLERS = {"gateway", "batcher", "fleet-watcher"}
# Who asks the guardrail service for checks: every door's stages, and async results'.
GUARDRAIL_CALLERS = {"gateway", "batcher"}


@pytest.mark.parametrize("overlay", ALL)
def test_every_object_passes_the_kubernetes_schemas_strictly(overlay: str) -> None:
    objects = render(overlay)
    assert len(objects) > 20
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_refuses_a_misspelt_field() -> None:
    deployment = copy.deepcopy(of_kind(render("prod"), "Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["readynessProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def _stack_children() -> set[str]:
    """The processes `make up` starts under a literal name (its simulators' are f-strings)."""
    source = (REPO_ROOT / "ops" / "stack.py").read_text()
    return set(re.findall(r'_child\(\s*"([a-z0-9-]+)"', source))


@pytest.mark.parametrize("overlay", ALL)
def test_every_process_of_the_stack_has_a_workload_running_its_role(overlay: str) -> None:
    children = _stack_children()
    assert {"web", "gateway", "celery-beat"} <= children  # the scan itself works
    deployments = of_kind(render(overlay), "Deployment")
    roles = {role(d) for d in deployments}

    assert children <= set(SERVICE_ROLES)
    assert roles == set(SERVICE_ROLES)
    assert all(component(d) == role(d) for d in deployments)


@pytest.mark.parametrize("overlay", ALL)
def test_every_pod_has_probes_resources_and_runs_as_non_root(overlay: str) -> None:
    for workload in of_kind(render(overlay), "Deployment"):
        name = workload["metadata"]["name"]
        pod = workload["spec"]["template"]["spec"]
        main = container(workload)
        assert "readinessProbe" in main, name
        assert "livenessProbe" in main, name
        assert {"cpu", "memory"} <= main["resources"]["requests"].keys(), name
        assert {"cpu", "memory"} <= main["resources"]["limits"].keys(), name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert main["securityContext"]["allowPrivilegeEscalation"] is False, name


def _routes(role_name: str) -> set[str]:
    """The paths each role's own code answers, read from that code."""
    if role_name == "gateway":
        source = (REPO_ROOT / "gateway" / "app.py").read_text()
        return set(re.findall(r'\("GET", "(/[a-z/]*)"\)', source))
    if role_name == "web":
        from config.health import LIVENESS_PATH, READINESS_PATH

        return {LIVENESS_PATH, READINESS_PATH}
    if role_name == "s3-endpoint":
        source = (REPO_ROOT / "s3endpoint" / "app.py").read_text()
        return set(re.findall(r'incoming\.path == "(/[a-z]+)"', source))
    if role_name == "guardrails":
        from guardrails.protocol import HEALTH_PATH, METRICS_PATH

        return {HEALTH_PATH, METRICS_PATH}
    if role_name == "batcher":
        return {"/metrics"}  # prometheus_client's server on SWITCHYARD_BATCHER_METRICS_PORT
    return set()


def _probes(main: Manifest) -> list[dict[str, Any]]:
    return [main[p] for p in ("readinessProbe", "livenessProbe", "startupProbe") if p in main]


@pytest.mark.parametrize("overlay", ALL)
def test_http_probes_ask_real_routes_and_exec_probes_the_roles_own_check(overlay: str) -> None:
    from ops.role import PROBED_ROLES

    for workload in of_kind(render(overlay), "Deployment"):
        main, name = container(workload), role(workload)
        ports = {p["name"]: p["containerPort"] for p in main.get("ports", [])}
        env = {e["name"]: e["value"] for e in main.get("env", [])}
        for probe in _probes(main):
            if "httpGet" in probe:
                assert probe["httpGet"]["path"] in _routes(name), (name, probe)
                assert probe["httpGet"]["port"] in ports, (name, probe)
            else:
                assert name in PROBED_ROLES
                assert probe["exec"]["command"] == ["python", "-m", "ops.role", "probe", name]
        # A probe comes from the kubelet, to the pod's IP: nothing may listen on loopback only.
        if name == "batcher":
            assert env["SWITCHYARD_BATCHER_METRICS_PORT"] == str(ports["metrics"])
            assert env["SWITCHYARD_BATCHER_METRICS_HOST"] == "0.0.0.0"
        if name == "guardrails":
            assert env["SWITCHYARD_GUARDRAIL_HOST"] == "0.0.0.0"
        assert "SWITCHYARD_BIND_HOST" not in env  # the roles' default: every interface


@pytest.mark.parametrize("overlay", ALL)
def test_the_gateway_scales_on_cpu_and_on_a_queue_depth_it_exports(overlay: str) -> None:
    (hpa,) = of_kind(render(overlay), "HorizontalPodAutoscaler")
    exported = {m.name for m in GatewayMetrics(process_collectors=False).registry.collect()}

    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "switchyard-gateway",
    }
    kinds = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert kinds["Resource"]["resource"]["name"] == "cpu"
    assert kinds["Pods"]["pods"]["metric"]["name"] in exported
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_the_overlays_scale_as_named() -> None:
    (dev_hpa,) = of_kind(render("dev"), "HorizontalPodAutoscaler")
    (prod_hpa,) = of_kind(render("prod"), "HorizontalPodAutoscaler")
    assert {d["spec"]["replicas"] for d in of_kind(render("dev"), "Deployment")} == {1}
    assert (dev_hpa["spec"]["minReplicas"], dev_hpa["spec"]["maxReplicas"]) == (1, 1)
    assert prod_hpa["spec"]["minReplicas"] >= 3
    singletons = {"celery-beat", "fleet-watcher"}
    for workload in of_kind(render("prod"), "Deployment"):
        name = role(workload)
        if name in singletons:
            assert workload["spec"]["replicas"] == 1
            assert workload["spec"]["strategy"]["type"] == "Recreate"  # never two at once
        elif name in SERVING - {"gateway"}:
            assert workload["spec"]["replicas"] >= 2, name
        if name in SERVING:
            terms = workload["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
            (term,) = terms["preferredDuringSchedulingIgnoredDuringExecution"]
            selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
            assert selector == workload["spec"]["selector"]["matchLabels"], name


@pytest.mark.parametrize("overlay", ALL)
def test_every_serving_role_has_a_disruption_budget_over_its_pods(overlay: str) -> None:
    objects = render(overlay)
    selectors = {
        role(d): d["spec"]["template"]["metadata"]["labels"] for d in of_kind(objects, "Deployment")
    }
    covered = set()
    for budget in of_kind(objects, "PodDisruptionBudget"):
        wanted = budget["spec"]["selector"]["matchLabels"]
        matched = [name for name, labels in selectors.items() if wanted.items() <= labels.items()]
        assert len(matched) == 1, budget["metadata"]["name"]
        covered.add(matched[0])
    assert covered >= SERVING


@pytest.mark.parametrize("overlay", ALL)
def test_only_the_callers_of_vllm_reach_its_pods(overlay: str) -> None:
    objects = render(overlay)
    policies = of_kind(objects, "NetworkPolicy")
    (policy,) = [p for p in policies if p["metadata"]["name"] == "vllm-ingress"]
    headless = [s for s in of_kind(objects, "Service") if s["spec"].get("clusterIP") == "None"]
    assert headless, "a headless Service lists the vLLM replicas"
    selected = policy["spec"]["podSelector"]["matchLabels"]
    for service in headless:  # the policy covers the pods each headless Service lists
        assert selected.items() <= service["spec"]["selector"].items()

    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted: set[str] = set()
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, peer  # no namespace or IP block lets others in
            expressions = {e["key"]: e for e in peer["podSelector"]["matchExpressions"]}
            assert expressions["app.kubernetes.io/name"]["values"] == ["switchyard"]
            assert expressions["app.kubernetes.io/component"]["operator"] == "In"
            admitted |= set(expressions["app.kubernetes.io/component"]["values"])
    assert admitted == VLLM_CALLERS


@pytest.mark.parametrize("overlay", ALL)
def test_only_the_gateways_and_the_batcher_reach_the_guardrail_service(overlay: str) -> None:
    """It binds every interface in a pod: a NetworkPolicy admits its callers only, and the
    token it asks them for is a secret file every Switchyard pod is given."""
    objects = render(overlay)
    policies = of_kind(objects, "NetworkPolicy")
    (policy,) = [p for p in policies if p["metadata"]["name"] == "switchyard-guardrails-ingress"]
    (service,) = [
        s
        for s in of_kind(objects, "Service")
        if s["metadata"]["name"].endswith("switchyard-guardrails")
    ]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= service["spec"]["selector"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted: set[str] = set()
    for rule in policy["spec"]["ingress"]:
        assert rule["ports"] == [{"protocol": "TCP", "port": 8095}]
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, peer
            expressions = {e["key"]: e for e in peer["podSelector"]["matchExpressions"]}
            assert expressions["app.kubernetes.io/name"]["values"] == ["switchyard"]
            admitted |= set(expressions["app.kubernetes.io/component"]["values"])
    assert admitted == GUARDRAIL_CALLERS
    (settings,) = of_kind(objects, "ConfigMap")
    assert settings["data"]["SWITCHYARD_GUARDRAIL_TOKEN_FILE"].startswith(SECRETS_DIR)


@pytest.mark.parametrize("overlay", ALL)
def test_settings_are_variables_the_code_reads_and_secrets_are_only_files(overlay: str) -> None:
    objects = render(overlay)
    (settings,) = of_kind(objects, "ConfigMap")
    known = variables_read_by_the_code()
    data = settings["data"]
    assert not sorted(n for n in data if n.removesuffix("_FILE") not in known)
    secret_files = {n: v for n, v in data.items() if n.endswith("_FILE")}
    assert "SWITCHYARD_SECRET_KEY_FILE" in secret_files
    assert all(v.startswith(SECRETS_DIR) for v in secret_files.values())
    # No secret's value sits in the ConfigMap or a container's environment.
    secrets = {n.removesuffix("_FILE") for n in secret_files}
    for workload in of_kind(objects, "Deployment") + of_kind(objects, "Job"):
        spec = workload["spec"]["template"]["spec"]
        main = spec["containers"][0]
        assert not secrets & {e["name"] for e in main.get("env", [])}
        mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert mounts["secrets"] == SECRETS_DIR.rstrip("/")
        assert volumes["secrets"]["secret"]["secretName"].startswith("switchyard-secrets")
    assert not secrets & data.keys()
    generated = of_kind(objects, "Secret")
    if overlay == "dev":  # its generated Secret holds every file the settings name
        (secret,) = generated
        keys = set(secret.get("data", {})) | set(secret.get("stringData", {}))
        assert {v.removeprefix(SECRETS_DIR) for v in secret_files.values()} <= keys
    else:
        assert generated == []  # production's Secret is made outside Git


def test_the_migrate_job_runs_the_migrate_role_before_anything_reads_the_database() -> None:
    for overlay in ALL:
        (job,) = of_kind(render(overlay), "Job")
        main = job["spec"]["template"]["spec"]["containers"][0]
        assert main["args"] == ["migrate"]
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
