"""The Kubernetes manifests as a cluster would get them: each overlay rendered by
``kubectl kustomize`` (offline), parsed into plain objects."""

from __future__ import annotations

import functools
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from ops.processes import REPO_ROOT

K8S = REPO_ROOT / "deploy" / "k8s"
OVERLAYS = ("dev", "prod")
# The schemas every object is checked against: the oldest Kubernetes the manifests support.
KUBERNETES_VERSION = "1.32.0"

Manifest = dict[str, Any]


def kubectl() -> str:
    """kubectl's path; the test fails, naming what is missing, rather than skip."""
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail(
            "kubectl is not on PATH: the deployment tests render deploy/k8s with "
            "`kubectl kustomize` (offline, no cluster needed). Install kubectl 1.27+ "
            "(Debian/Ubuntu: the kubernetes apt repository, or the static binary)."
        )
    return found


@functools.cache
def _render(directory: str) -> tuple[Manifest, ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", directory], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(overlay: str) -> list[Manifest]:
    """Every object of ``overlay`` ("dev", "prod", or "base")."""
    directory = K8S / "base" if overlay == "base" else K8S / "overlays" / overlay
    return list(_render(str(directory)))


def of_kind(objects: list[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objects if o["kind"] == kind]


def component(obj: Manifest) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def container(deployment: Manifest) -> Manifest:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, deployment["metadata"]["name"]
    return dict(containers[0])


def role(workload: Manifest) -> str:
    """The role the container runs: its args, given to the image's ops.role entrypoint."""
    args = container(workload)["args"]
    assert len(args) == 1, args
    return str(args[0])
