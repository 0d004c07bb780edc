"""deploy/kubernetes: every manifest is valid against the Kubernetes JSON schemas (offline, strict: an unknown field
fails), and the manifests keep their promises: one beat, probes on /healthz and /readyz, a preStop inside the grace
period, nothing privileged, workers reached by nothing, keys mounted as files."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

KUBERNETES = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSION = "1.33"  # hostUsers (user namespaces) is on by default from 1.33: the worker's sandbox needs it


def manifests() -> list[dict]:
    documents = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            documents += [document for document in yaml.safe_load_all(path.read_text()) if document]
    return documents


def named(kind: str, name: str) -> dict:
    (manifest,) = [m for m in manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    return manifest


def pod(kind: str, name: str) -> dict:
    return named(kind, name)["spec"]["template"]["spec"]


@pytest.mark.parametrize("manifest", manifests(), ids=lambda m: f"{m['kind']}/{m['metadata']['name']}")
def test_every_manifest_is_valid_against_the_kubernetes_schemas(manifest):
    assert kubernetes_validate.validate(manifest, VERSION, strict=True) == VERSION


def test_a_manifest_with_a_misspelled_field_fails_validation_naming_it():
    deployment = named("Deployment", "switchboard-beat")
    deployment["spec"]["replica"] = 1
    with pytest.raises(kubernetes_validate.ValidationError) as failure:
        kubernetes_validate.validate(deployment, VERSION, strict=True)
    assert failure.value.message == "Additional properties are not allowed ('replica' was unexpected)"


def test_a_manifest_with_a_wrong_type_fails_validation_naming_the_field():
    deployment = named("Deployment", "switchboard-web")
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError) as failure:
        kubernetes_validate.validate(deployment, VERSION, strict=True)
    assert (list(failure.value.path), failure.value.message) == (
        ["spec", "replicas"],
        "'two' is not of type 'integer', 'null'",
    )


def test_the_kustomization_lists_every_manifest_and_makes_the_keys_secret():
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    on_disk = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk
    (secret,) = kustomization["secretGenerator"]
    assert secret["name"] == "switchboard-keys" and all(f.startswith("keys/") for f in secret["files"])


def test_beat_is_single_and_never_overlaps_itself():
    beat = named("Deployment", "switchboard-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    assert not [h for h in manifests() if h["kind"] == "HorizontalPodAutoscaler" and "beat" in h["metadata"]["name"]]


def test_web_is_probed_on_healthz_and_readyz_and_stops_within_its_grace_period():
    spec = pod("Deployment", "switchboard-web")
    (web,) = spec["containers"]
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    pre_stop = int(web["lifecycle"]["preStop"]["exec"]["command"][1])
    drain, uvicorn_grace = 20, 5  # GATEWAY_DRAIN_SECONDS's default, --timeout-graceful-shutdown (scripts/container)
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain + uvicorn_grace
    annotations = named("Deployment", "switchboard-web")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"


def test_the_autoscalers_scale_web_and_workers_and_the_budgets_keep_one_of_each():
    scaled = {h["spec"]["scaleTargetRef"]["name"] for h in manifests() if h["kind"] == "HorizontalPodAutoscaler"}
    assert scaled == {"switchboard-web", "switchboard-worker"}
    budgets = {
        p["metadata"]["name"]: p["spec"]["minAvailable"] for p in manifests() if p["kind"] == "PodDisruptionBudget"
    }
    assert budgets == {"switchboard-web": 1, "switchboard-worker": 1}


def every_pod() -> dict[str, dict]:
    pods = {name: pod("Deployment", f"switchboard-{name}") for name in ("web", "worker", "beat")}
    return pods | {"migrate": pod("Job", "switchboard-migrate")}


def test_nothing_is_privileged_and_every_container_runs_read_only_as_the_image_user_with_limits():
    for spec in every_pod().values():
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10001
        for container in spec["containers"]:
            context = container["securityContext"]
            assert "privileged" not in context and context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True and context["capabilities"] == {"drop": ["ALL"]}
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_only_the_worker_may_make_namespaces_for_bubblewrap_and_in_a_user_namespace_of_its_own():
    pods = every_pod()
    worker = pods.pop("worker")
    context = worker["containers"][0]["securityContext"]
    assert worker["hostUsers"] is False and context["procMount"] == "Unmasked"
    assert context["seccompProfile"] == context["appArmorProfile"] == {"type": "Unconfined"}
    for spec in pods.values():
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "hostUsers" not in spec and "procMount" not in spec["containers"][0]["securityContext"]


def test_keys_are_mounted_as_files_and_only_workers_hold_the_key_that_opens_credentials():
    for name, spec in every_pod().items():
        (keys,) = [v for v in spec["volumes"] if v["name"] == "keys"]
        files = {item["path"] for item in keys["secret"]["items"]}
        assert keys["secret"]["secretName"] == "switchboard-keys" and keys["secret"]["defaultMode"] == 0o400
        assert ("credential_key" in files) == (name == "worker") and "database_url" in files
        (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "keys"]
        assert mount == {"name": "keys", "mountPath": "/run/secrets/switchboard", "readOnly": True}
        assert not [e for e in spec["containers"][0].get("env", []) if "value" in e and "_FILE" not in e["name"]]


def policy(name: str) -> dict:
    return named("NetworkPolicy", name)["spec"]


def egress_ports(rules: list[dict]) -> set[int]:
    return {port["port"] for rule in rules if "to" not in rule for port in rule["ports"]}


def test_web_reaches_only_the_stores_and_dns_and_is_reached_on_its_port():
    web = policy("switchboard-web")
    assert web["policyTypes"] == ["Ingress", "Egress"] and web["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 8000}]}
    ]
    assert egress_ports(web["egress"]) == {5432, 6379, 53} and all("to" not in rule for rule in web["egress"])


def test_nothing_reaches_workers_and_workers_reach_upstreams_but_not_the_metadata_service():
    worker = policy("switchboard-worker")
    assert worker["policyTypes"] == ["Ingress", "Egress"] and worker["ingress"] == []
    (upstreams,) = [rule for rule in worker["egress"] if "to" in rule]
    blocks = {block["ipBlock"]["cidr"]: block["ipBlock"]["except"] for block in upstreams["to"]}
    assert blocks["0.0.0.0/0"] == ["169.254.169.254/32"] and "::/0" in blocks
    assert egress_ports(worker["egress"]) == {5432, 6379, 53}


def test_beat_and_the_migration_reach_the_stores_only():
    stores = policy("switchboard-stores-only")
    selected = {e["key"]: e["values"] for e in stores["podSelector"]["matchExpressions"]}
    assert selected["app.kubernetes.io/component"] == ["beat", "migrate"] and stores["ingress"] == []
    assert egress_ports(stores["egress"]) == {5432, 6379, 53} and all("to" not in rule for rule in stores["egress"])
