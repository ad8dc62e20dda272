"""Tests for the mailpush Helm chart.

The chart is rendered with Helm's own engine (helm-python-sdk → Helm Go SDK);
every manifest is validated with kubernetes-validate in strict mode (unknown
fields are errors) for the oldest supported and a recent Kubernetes version.

Run: python3 -m pytest -q tests/helm
"""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import CHART_DIR, NAMESPACE, RELEASE, Rendered

FULLNAME = f"{RELEASE}-mailpush"
# Oldest supported (pod-index label) and a recent release.
K8S_VERSIONS = ["1.28.0", "1.36.0"]

SASL_TLS = {
    "kafka": {
        "brokers": "b-1.kafka:9096,b-2.kafka:9096",
        "sasl": {
            "enabled": True,
            "mechanism": "SCRAM-SHA-512",
            "existingSecret": "kafka-creds",
            "usernameKey": "user",
            "passwordKey": "pass",
        },
        "tls": {
            "enabled": True,
            "existingSecret": "kafka-tls",
            "caKey": "ca.pem",
            "certKey": "client.pem",
            "keyKey": "client.key",
            "keyPasswordKey": "key-password",
        },
        "properties": {"client.rack": "eu-west-1a", "socket.keepalive.enable": True},
    }
}

CUSTOM_TOPICS = {
    "topics": {
        "events": "prod.email.received.v1",
        "devices": "prod.mailpush.devices",
        "keys": "prod.mailpush.address-keys",
        "jobs": "prod.mailpush.push-jobs",
        "deadLetters": "prod.mailpush.dlq",
    }
}

STRIMZI_TOPICS = {"topics": {"strimzi": {"enabled": True, "cluster": "my-cluster"}}}

RESOURCES = {
    "resources": {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"cpu": 2, "memory": "1Gi"},
    }
}

VARIATIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "replicas3": {"replicas": 3},
    "static": {"replicas": 3, "ownership": {"mode": "static"}},
    "autoscaling": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8,
                                    "metrics": [{"type": "Pods", "pods": {"metric": {"name": "mailpush_consumer_lag"},
                                                                          "target": {"type": "AverageValue", "averageValue": "1000"}}}]}},
    "sasl_tls": SASL_TLS,
    "servicemonitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "custom_topics": CUSTOM_TOPICS,
    "strimzi_topics": STRIMZI_TOPICS,
    "strimzi_topics_static": {"replicas": 2, "ownership": {"mode": "static"}, **STRIMZI_TOPICS},
    "resources": RESOURCES,
    "everything": {
        "replicas": 5,
        **SASL_TLS,
        "topics": {**CUSTOM_TOPICS["topics"], "strimzi": {"enabled": True, "cluster": "prod-kafka", "partitions": 24,
                                                          "replicas": 3}},
        **RESOURCES,
        "serviceMonitor": {"enabled": True},
        "image": {"digest": "sha256:" + "a" * 64},
        "mailpush": {
            "logLevel": "debug",
            "logFormat": "text",
            "httpPort": 9090,
            "shutdownGraceSeconds": 60,
            "alertTitle": "New mail",
            "alertBody": "You have new mail",
            "sponsorWebhook": {"existingSecret": "sponsor", "key": "url"},
            "extraArgs": ["-X", "fetch.wait.max.ms=100"],
        },
        "persistence": {"storageClassName": "fast-ssd", "size": "5Gi", "whenDeleted": "Delete",
                        "annotations": {"backup.example.com/enabled": "true"}},
        "extraEnv": [{"name": "MAILPUSH_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
                      "valueFrom": {"secretKeyRef": {"name": "oauth", "key": "secret"}}}],
        "extraVolumes": [{"name": "extra", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "extra", "mountPath": "/extra", "readOnly": True}],
        "podDisruptionBudget": {"maxUnavailable": "20%"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "mail",
                         "effect": "NoSchedule"}],
        "priorityClassName": "high",
        "podAnnotations": {"example.com/team": "mail"},
    },
}


@pytest.fixture(params=sorted(VARIATIONS), scope="module")
def variation(request, render) -> tuple[str, Rendered]:
    return request.param, render(VARIATIONS[request.param])


# ---------------------------------------------------------------------------
# Manifests are valid Kubernetes objects
# ---------------------------------------------------------------------------

SERVICEMONITOR_FIELDS = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "metadata": {"name", "namespace", "labels"},
    "spec": {"selector", "namespaceSelector", "endpoints"},
    "endpoint": {"port", "path", "scheme", "interval", "scrapeTimeout"},
}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", duration))


def check_servicemonitor(doc: dict[str, Any]) -> None:
    """kubernetes-validate has no schema for this CRD; check its fields by hand
    against the monitoring.coreos.com/v1 ServiceMonitor API."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc) <= SERVICEMONITOR_FIELDS[""]
    assert set(doc["metadata"]) <= SERVICEMONITOR_FIELDS["metadata"]
    spec = doc["spec"]
    assert set(spec) <= SERVICEMONITOR_FIELDS["spec"]
    assert set(spec["selector"]) == {"matchLabels"}
    assert all(isinstance(v, str) for v in spec["selector"]["matchLabels"].values())
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert len(spec["endpoints"]) == 1
    for ep in spec["endpoints"]:
        assert set(ep) <= SERVICEMONITOR_FIELDS["endpoint"]
        assert ep["scheme"] in ("http", "https")
        assert DURATION.match(ep["interval"]) and DURATION.match(ep["scrapeTimeout"])
        assert _seconds(ep["scrapeTimeout"]) <= _seconds(ep["interval"])


KAFKATOPIC_FIELDS = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "metadata": {"name", "namespace", "labels", "annotations"},
    "spec": {"topicName", "partitions", "replicas", "config"},
}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def check_kafkatopic(doc: dict[str, Any]) -> None:
    """kubernetes-validate has no schema for this CRD; check its fields by hand
    against the kafka.strimzi.io/v1beta2 KafkaTopic API."""
    assert doc["apiVersion"] == "kafka.strimzi.io/v1beta2"
    assert set(doc) <= KAFKATOPIC_FIELDS[""]
    meta = doc["metadata"]
    assert set(meta) <= KAFKATOPIC_FIELDS["metadata"]
    assert DNS_SUBDOMAIN.match(meta["name"]) and len(meta["name"]) <= 253, meta["name"]
    assert all(isinstance(v, str) for v in meta["labels"].values())
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", meta["labels"]["strimzi.io/cluster"])
    spec = doc["spec"]
    assert set(spec) <= KAFKATOPIC_FIELDS["spec"]
    assert TOPIC_NAME.match(spec["topicName"])
    assert isinstance(spec["partitions"], int) and spec["partitions"] >= 1
    assert isinstance(spec["replicas"], int) and 1 <= spec["replicas"] <= 32767
    assert all(isinstance(k, str) and isinstance(v, (str, int, bool)) for k, v in spec["config"].items())


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_every_manifest_validates_strictly(variation, k8s_version):
    name, rendered = variation
    assert rendered.docs, "nothing rendered"
    for doc in rendered.docs:
        if doc["kind"] == "ServiceMonitor":
            check_servicemonitor(doc)
            continue
        if doc["kind"] == "KafkaTopic":
            check_kafkatopic(doc)
            continue
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"[{name}] {doc['kind']}/{doc['metadata']['name']}: {path}: {e.message}")


def test_expected_objects(variation):
    name, rendered = variation
    kinds = sorted(d["kind"] for d in rendered.docs)
    expected = ["ConfigMap", "PodDisruptionBudget", "Service", "Service", "ServiceAccount",
                "StatefulSet"]
    if VARIATIONS[name].get("serviceMonitor", {}).get("enabled"):
        expected.append("ServiceMonitor")
    if VARIATIONS[name].get("autoscaling", {}).get("enabled"):
        expected.append("HorizontalPodAutoscaler")
    if VARIATIONS[name].get("topics", {}).get("strimzi", {}).get("enabled"):
        static = VARIATIONS[name].get("ownership", {}).get("mode") == "static"
        expected += ["KafkaTopic"] * (5 if static else 6)
    assert kinds == sorted(expected)
    for doc in rendered.docs:
        assert doc["metadata"]["namespace"] == NAMESPACE
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


@pytest.mark.parametrize("values", [{}, SASL_TLS, {"serviceMonitor": {"enabled": True}}, STRIMZI_TOPICS],
                         ids=["default", "sasl_tls", "servicemonitor", "strimzi_topics"])
def test_helm_lint_strict(values):
    report = helm.lint(str(CHART_DIR), values, strict=True, namespace=NAMESPACE,
                       kube_version="v1.28.0")
    assert report["errors"] == []
    # Severity 2 = warning, 3 = error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_kube_version_floor_is_declared(chart):
    assert chart.metadata["kubeVersion"] == ">=1.28.0-0"
    assert chart.metadata["apiVersion"] == "v2"


# ---------------------------------------------------------------------------
# Security
# ---------------------------------------------------------------------------


def test_security_settings(variation):
    _, r = variation
    pod_sc = r.pod["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] == 10001
    assert pod_sc["runAsGroup"] == 10001
    assert pod_sc["fsGroup"] == 10001
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}

    sc = r.container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}

    # Writable paths: /tmp (emptyDir) and the state PVC only.
    volumes = {v["name"]: v for v in r.pod["volumes"]}
    mounts = {m["mountPath"]: m for m in r.container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert mounts["/var/lib/mailpush"]["name"] == "state"
    assert [t["metadata"]["name"] for t in r.sts["spec"]["volumeClaimTemplates"]] == ["state"]

    assert r.pod["automountServiceAccountToken"] is False
    assert r.one("ServiceAccount")["automountServiceAccountToken"] is False
    assert r.pod["serviceAccountName"] == r.one("ServiceAccount")["metadata"]["name"]
    assert "hostNetwork" not in r.pod and "hostPID" not in r.pod


def test_no_secret_material_in_configmap(render):
    r = render(SASL_TLS)
    for key in r.config:
        assert "PASSWORD" not in key and "USERNAME" not in key, key
    # ...they come from the existing Secrets instead.
    assert r.env["MAILPUSH_KAFKA_SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {
        "name": "kafka-creds", "key": "user"}
    assert r.env["MAILPUSH_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "kafka-creds", "key": "pass"}
    assert r.env["MAILPUSH_KAFKA_SSL_KEY_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "kafka-tls", "key": "key-password"}


# ---------------------------------------------------------------------------
# Partition ownership: a consumer group (default) or static
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 3, 7])
def test_group_ownership_is_the_default(render, replicas):
    r = render({"replicas": replicas})
    assert r.sts["spec"]["replicas"] == replicas
    assert r.env["MAILPUSH_GROUP"]["value"] == FULLNAME, "one group per release"
    assert r.env["MAILPUSH_STATE_TOPIC"]["value"] == "mailpush.state"
    assert "MAILPUSH_INSTANCE" not in r.env and "MAILPUSH_INSTANCES" not in r.env
    assert "mailpush.io/instances" not in (r.sts["metadata"].get("annotations") or {})
    assert not r.of_kind("HorizontalPodAutoscaler")
    assert "one consumer group" in r.notes and "kubectl scale statefulset" in r.notes


def test_static_membership_is_on_by_default_with_a_session_a_restart_fits_in(render):
    """A rolling restart moves no partition: each pod rejoins under its own name within the session timeout."""
    r = render({})
    assert r.env["MAILPUSH_GROUP_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert r.env["MAILPUSH_GROUP_SESSION_TIMEOUT_MS"]["value"] == "30000"
    # The readiness probe is what `helm upgrade --wait` and the rollout wait for: /readyz, which answers 200
    # only once the pod has joined the group and processes every partition assigned to it.
    assert r.container["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("values, instance_id, session", [
    ({"staticMembership": False}, None, "6000"),
    ({"staticMembership": False, "sessionTimeoutMs": 10000}, None, "10000"),
    ({"sessionTimeoutMs": 45000}, {"fieldRef": {"fieldPath": "metadata.name"}}, "45000"),
])
def test_static_membership_and_session_can_be_set(render, values, instance_id, session):
    r = render({"ownership": values})
    assert (r.env.get("MAILPUSH_GROUP_INSTANCE_ID") or {}).get("valueFrom") == instance_id
    assert r.env["MAILPUSH_GROUP_SESSION_TIMEOUT_MS"]["value"] == session


def test_static_ownership_sets_no_group_timing(render):
    r = render({"ownership": {"mode": "static"}})
    assert "MAILPUSH_GROUP_INSTANCE_ID" not in r.env and "MAILPUSH_GROUP_SESSION_TIMEOUT_MS" not in r.env


def test_group_and_state_topic_can_be_named(render):
    r = render({"ownership": {"group": "mail-fleet", "stateTopic": "mp.state"}})
    assert r.env["MAILPUSH_GROUP"]["value"] == "mail-fleet"
    assert r.env["MAILPUSH_STATE_TOPIC"]["value"] == "mp.state"


@pytest.mark.parametrize("replicas", [1, 3, 7])
def test_static_instances_equal_replicas(render, replicas):
    r = render({"replicas": replicas, "ownership": {"mode": "static"}})
    assert r.sts["spec"]["replicas"] == replicas
    assert r.env["MAILPUSH_INSTANCES"]["value"] == str(replicas)
    assert r.sts["metadata"]["annotations"]["mailpush.io/instances"] == str(replicas)
    assert "MAILPUSH_GROUP" not in r.env
    # Nothing else may set the count (a ConfigMap value or a flag would be
    # overridden by / override the pod's env).
    assert "MAILPUSH_INSTANCES" not in r.config
    assert "MAILPUSH_INSTANCE" not in r.config
    assert not any(a.startswith("--instance") for a in r.container["args"])
    assert f"Instances: {replicas}." in r.notes


def test_static_instance_index_comes_from_pod_index_label(render):
    r = render({"ownership": {"mode": "static"}})
    assert r.env["MAILPUSH_INSTANCE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    # Ordinals must start at 0 so that pod-index N is instance N of n.
    assert "ordinals" not in r.sts["spec"]


def test_autoscaler_owns_the_replica_count_when_enabled(render):
    r = render({"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 9, "targetCPUUtilizationPercentage": 60}})
    hpa = r.one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": r.sts["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 9)
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 60
    assert "replicas" not in r.sts["spec"], "the HPA, not helm, sets the replica count"


def test_statefulset_shape(variation):
    _, r = variation
    spec = r.sts["spec"]
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    # Scaling down must never delete the offsets needed to move partitions.
    assert spec["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Retain"
    headless = [s for s in r.of_kind("Service") if s["spec"].get("clusterIP") == "None"]
    assert len(headless) == 1
    assert spec["serviceName"] == headless[0]["metadata"]["name"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    assert r.container["args"][0] == "run"
    assert r.container["envFrom"][0] == {"configMapRef": {"name": r.one("ConfigMap")["metadata"]["name"]}}
    assert r.config["MAILPUSH_STATE_DIR"] == "/var/lib/mailpush"


def test_config_checksum_changes_with_config(render):
    a = render({})
    b = render({"mailpush": {"logLevel": "debug"}})
    key = "checksum/config"
    assert a.sts["spec"]["template"]["metadata"]["annotations"][key] != \
        b.sts["spec"]["template"]["metadata"]["annotations"][key]


# ---------------------------------------------------------------------------
# Graceful shutdown
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("grace,margin", [(None, None), (25, 10), (60, 5), (1, 1), (300, 30)])
def test_termination_grace_exceeds_shutdown_grace(render, default_values, grace, margin):
    values: dict[str, Any] = {"mailpush": {}}
    if grace is not None:
        values["mailpush"]["shutdownGraceSeconds"] = grace
        values["mailpush"]["terminationGraceMarginSeconds"] = margin
    r = render(values)
    grace = grace or default_values["mailpush"]["shutdownGraceSeconds"]
    margin = margin or default_values["mailpush"]["terminationGraceMarginSeconds"]
    tgps = r.pod["terminationGracePeriodSeconds"]
    assert tgps > grace
    assert tgps == grace + margin
    assert r.config["MAILPUSH_SHUTDOWN_GRACE_SECONDS"] == str(grace)


# ---------------------------------------------------------------------------
# Probes, ports, Services
# ---------------------------------------------------------------------------


def _probe_port(r: Rendered, probe: dict[str, Any]) -> int:
    port = probe["httpGet"]["port"]
    if isinstance(port, str):
        return next(p["containerPort"] for p in r.container["ports"] if p["name"] == port)
    return port


@pytest.mark.parametrize("port", [None, 9090])
def test_probes_and_http_port(render, port):
    r = render({"mailpush": {"httpPort": port}} if port else {})
    port = port or 8080
    c = r.container
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert _probe_port(r, c[probe]) == port
    assert r.config["MAILPUSH_HTTP_PORT"] == str(port)


def test_services_select_the_pods(variation):
    _, r = variation
    pod_labels = r.sts["spec"]["template"]["metadata"]["labels"]
    container_ports = {p["name"] for p in r.container["ports"]}
    for svc in r.of_kind("Service"):
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in container_ports
        # Metrics of a not-ready instance are exactly the ones to see.
        assert svc["spec"]["publishNotReadyAddresses"] is True
    pdb = r.one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_servicemonitor_off_by_default(render):
    assert render({}).of_kind("ServiceMonitor") == []


def test_servicemonitor_targets_the_http_service_once(render):
    r = render({"serviceMonitor": {"enabled": True, "labels": {"release": "prom"},
                                   "interval": "15s", "scrapeTimeout": "5s"}})
    sm = r.one("ServiceMonitor")
    check_servicemonitor(sm)
    assert sm["metadata"]["labels"]["release"] == "prom"
    selected = [s for s in r.of_kind("Service")
                if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert len(selected) == 1, "ServiceMonitor must match exactly one Service"
    svc = selected[0]
    assert svc["spec"].get("clusterIP") != "None"
    ep = sm["spec"]["endpoints"][0]
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ep["path"] == "/metrics"
    assert (ep["interval"], ep["scrapeTimeout"]) == ("15s", "5s")


def test_kafkatopics_off_by_default(render):
    assert render({}).of_kind("KafkaTopic") == []


def test_kafkatopics_create_the_configured_topics_compacted_where_mailpush_needs_it(render):
    r = render({**CUSTOM_TOPICS, "ownership": {"stateTopic": "prod.mailpush.state"}, "topics": {
        **CUSTOM_TOPICS["topics"], "strimzi": {"enabled": True, "cluster": "prod-kafka", "partitions": 24, "replicas": 2}}})
    topics = r.of_kind("KafkaTopic")
    for doc in topics:
        check_kafkatopic(doc)
        assert doc["metadata"]["labels"]["strimzi.io/cluster"] == "prod-kafka"
        assert doc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", \
            "helm uninstall must not delete the topics (the operator would delete their records)"
        assert (doc["spec"]["partitions"], doc["spec"]["replicas"]) == (24, 2)
    policies = {doc["spec"]["topicName"]: doc["spec"]["config"]["cleanup.policy"] for doc in topics}
    assert policies == {
        "prod.email.received.v1": "delete", "prod.mailpush.devices": "compact", "prod.mailpush.address-keys": "compact",
        "prod.mailpush.push-jobs": "delete", "prod.mailpush.dlq": "delete", "prod.mailpush.state": "compact",
    }
    assert len({doc["metadata"]["name"] for doc in topics}) == 6
    # The service is configured with the same names the topics are created with.
    cfg = r.config
    configured = {cfg[k] for k in ("MAILPUSH_EVENTS_TOPIC", "MAILPUSH_DEVICES_TOPIC", "MAILPUSH_KEYS_TOPIC",
                                   "MAILPUSH_JOBS_TOPIC", "MAILPUSH_DEAD_LETTER_TOPIC")}
    env = {e["name"]: e.get("value") for e in r.one("StatefulSet")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert set(policies) == configured | {env["MAILPUSH_STATE_TOPIC"]}


def test_notes_say_where_the_topics_come_from(render):
    assert "mailpush topics --brokers" in render({}).notes
    assert "missing state topic" in render({}).notes
    assert "missing state topic" not in render({"ownership": {"mode": "static"}}).notes, "static ownership has none"
    notes = render(STRIMZI_TOPICS).notes
    assert 'KafkaTopics of the Strimzi cluster "my-cluster"' in notes
    assert f"get kafkatopics -l app.kubernetes.io/instance={RELEASE}" in notes


def test_kafkatopics_leave_out_the_state_topic_with_static_ownership(render):
    topics = render({"ownership": {"mode": "static"}, **STRIMZI_TOPICS}).of_kind("KafkaTopic")
    assert "mailpush.state" not in {doc["spec"]["topicName"] for doc in topics}
    assert len(topics) == 5


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def test_default_configuration(render, default_values):
    cfg = render({}).config
    assert cfg == {
        "MAILPUSH_BROKERS": "kafka:9092",
        "MAILPUSH_STATE_DIR": "/var/lib/mailpush",
        "MAILPUSH_HTTP_PORT": "8080",
        "MAILPUSH_LOG_LEVEL": "info",
        "MAILPUSH_LOG_FORMAT": "json",
        "MAILPUSH_TTL_SECONDS": "2419200",
        "MAILPUSH_DEDUPE_WINDOW_SECONDS": "604800",
        "MAILPUSH_SHUTDOWN_GRACE_SECONDS": "25",
        "MAILPUSH_EVENTS_TOPIC": "email.received",
        "MAILPUSH_DEVICES_TOPIC": "mailpush.devices",
        "MAILPUSH_KEYS_TOPIC": "mailpush.address-keys",
        "MAILPUSH_JOBS_TOPIC": "mailpush.push-jobs",
        "MAILPUSH_DEAD_LETTER_TOPIC": "mailpush.dead-letters",
    }


def test_custom_topics(render):
    cfg = render(CUSTOM_TOPICS).config
    t = CUSTOM_TOPICS["topics"]
    assert cfg["MAILPUSH_EVENTS_TOPIC"] == t["events"]
    assert cfg["MAILPUSH_DEVICES_TOPIC"] == t["devices"]
    assert cfg["MAILPUSH_KEYS_TOPIC"] == t["keys"]
    assert cfg["MAILPUSH_JOBS_TOPIC"] == t["jobs"]
    assert cfg["MAILPUSH_DEAD_LETTER_TOPIC"] == t["deadLetters"]
    assert "prod.email.received.v1" in render(CUSTOM_TOPICS).notes


def test_large_numbers_are_not_rendered_in_float_notation(render):
    cfg = render({"mailpush": {"ttlSeconds": 31536000, "dedupeWindowSeconds": 2592000}}).config
    assert cfg["MAILPUSH_TTL_SECONDS"] == "31536000"
    assert cfg["MAILPUSH_DEDUPE_WINDOW_SECONDS"] == "2592000"


def test_sasl_and_tls(render):
    r = render(SASL_TLS)
    cfg = r.config
    assert cfg["MAILPUSH_BROKERS"] == "b-1.kafka:9096,b-2.kafka:9096"
    assert cfg["MAILPUSH_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert cfg["MAILPUSH_KAFKA_SASL_MECHANISMS"] == "SCRAM-SHA-512"
    assert cfg["MAILPUSH_KAFKA_SSL_CA_LOCATION"] == "/etc/mailpush/kafka-tls/ca.pem"
    assert cfg["MAILPUSH_KAFKA_SSL_CERTIFICATE_LOCATION"] == "/etc/mailpush/kafka-tls/client.pem"
    assert cfg["MAILPUSH_KAFKA_SSL_KEY_LOCATION"] == "/etc/mailpush/kafka-tls/client.key"
    assert cfg["MAILPUSH_KAFKA_CLIENT_RACK"] == "eu-west-1a"
    assert cfg["MAILPUSH_KAFKA_SOCKET_KEEPALIVE_ENABLE"] == "true"
    vol = next(v for v in r.pod["volumes"] if v["name"] == "kafka-tls")
    assert vol["secret"]["secretName"] == "kafka-tls"
    mount = next(m for m in r.container["volumeMounts"] if m["name"] == "kafka-tls")
    assert mount == {"name": "kafka-tls", "mountPath": "/etc/mailpush/kafka-tls", "readOnly": True}


@pytest.mark.parametrize("sasl,tls,explicit,expected", [
    (False, False, "", None),
    (True, False, "", "SASL_PLAINTEXT"),
    (False, True, "", "SSL"),
    (True, True, "", "SASL_SSL"),
    (False, False, "SSL", "SSL"),
])
def test_security_protocol(render, sasl, tls, explicit, expected):
    values = {"kafka": {"securityProtocol": explicit,
                        "sasl": {"enabled": sasl, "existingSecret": "s" if sasl else ""},
                        "tls": {"enabled": tls}}}
    r = render(values)
    assert r.config.get("MAILPUSH_KAFKA_SECURITY_PROTOCOL") == expected
    if tls:
        # No Secret given: the system CA bundle, nothing mounted.
        assert "MAILPUSH_KAFKA_SSL_CA_LOCATION" not in r.config
        assert "kafka-tls" not in {v["name"] for v in r.pod["volumes"]}


def test_sponsor_webhook(render):
    plain = render({"mailpush": {"sponsorWebhook": {"url": "https://sponsor.example/push"}}})
    assert plain.config["MAILPUSH_SPONSOR_WEBHOOK_URL"] == "https://sponsor.example/push"
    assert "MAILPUSH_SPONSOR_WEBHOOK_URL" not in plain.env
    secret = render({"mailpush": {"sponsorWebhook": {"url": "https://x.example",
                                                     "existingSecret": "sp", "key": "u"}}})
    assert "MAILPUSH_SPONSOR_WEBHOOK_URL" not in secret.config
    assert secret.env["MAILPUSH_SPONSOR_WEBHOOK_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "sp", "key": "u"}
    assert "MAILPUSH_SPONSOR_WEBHOOK_URL" not in render({}).config


def test_resources(render, default_values):
    assert render({}).container["resources"] == default_values["resources"]
    got = render(RESOURCES).container["resources"]
    assert got["requests"] == {"cpu": "250m", "memory": "256Mi"}
    assert got["limits"] == {"cpu": 2, "memory": "1Gi"}


def test_image_reference(render, chart):
    assert render({}).container["image"] == f"ghcr.io/example/mailpush:{chart.metadata['appVersion']}"
    assert render({"image": {"tag": "1.2.3"}}).container["image"] == "ghcr.io/example/mailpush:1.2.3"
    digest = "sha256:" + "b" * 64
    assert render({"image": {"tag": "1.2.3", "digest": digest}}).container["image"] == \
        f"ghcr.io/example/mailpush@{digest}"


def test_persistence(render):
    r = render({"persistence": {"size": "10Gi", "storageClassName": "gp3"}})
    pvc = r.sts["spec"]["volumeClaimTemplates"][0]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert pvc["spec"]["storageClassName"] == "gp3"
    assert "storageClassName" not in render({}).sts["spec"]["volumeClaimTemplates"][0]["spec"]


# ---------------------------------------------------------------------------
# values.schema.json rejects bad values
# ---------------------------------------------------------------------------

INVALID_VALUES = {
    "replicas_zero": {"replicas": 0},
    "replicas_negative": {"replicas": -1},
    "replicas_string": {"replicas": "3"},
    "replicas_fraction": {"replicas": 1.5},
    "log_level_loud": {"mailpush": {"logLevel": "loud"}},
    "log_format_xml": {"mailpush": {"logFormat": "xml"}},
    "unknown_top_level_key": {"replica": 3},
    "unknown_nested_key": {"mailpush": {"ttl": 5}},
    "brokers_empty": {"kafka": {"brokers": ""}},
    "brokers_without_port": {"kafka": {"brokers": "kafka"}},
    "sasl_without_secret": {"kafka": {"sasl": {"enabled": True}}},
    "sasl_bad_mechanism": {"kafka": {"sasl": {"mechanism": "GSSAPI"}}},
    "security_protocol_bad": {"kafka": {"securityProtocol": "TLS"}},
    "shutdown_grace_zero": {"mailpush": {"shutdownGraceSeconds": 0}},
    "margin_zero": {"mailpush": {"terminationGraceMarginSeconds": 0}},
    "ttl_zero": {"mailpush": {"ttlSeconds": 0}},
    "http_port_privileged": {"mailpush": {"httpPort": 80}},
    "topic_with_space": {"topics": {"events": "email received"}},
    "root_user": {"podSecurityContext": {"runAsNonRoot": False}},
    "writable_root_fs": {"securityContext": {"readOnlyRootFilesystem": False}},
    "privilege_escalation": {"securityContext": {"allowPrivilegeEscalation": True}},
    "capability_added": {"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}},
    "pull_policy": {"image": {"pullPolicy": "Sometimes"}},
    "bad_digest": {"image": {"digest": "latest"}},
    "when_deleted": {"persistence": {"whenDeleted": "Maybe"}},
    "servicemonitor_interval": {"serviceMonitor": {"interval": "soon"}},
    "pdb_zero": {"podDisruptionBudget": {"maxUnavailable": 0}},
    "kafka_property_bad_name": {"kafka": {"properties": {"Bad Name": "x"}}},
    "ownership_mode": {"ownership": {"mode": "foo"}},
    "state_topic_bad": {"ownership": {"stateTopic": "mailpush state"}},
    "session_below_a_second": {"ownership": {"sessionTimeoutMs": 500}},
    "static_membership_not_bool": {"ownership": {"staticMembership": "yes"}},
    "autoscaling_max_zero": {"autoscaling": {"maxReplicas": 0}},
    "autoscaling_unknown_key": {"autoscaling": {"targetMemory": 80}},
    "strimzi_partitions_zero": {"topics": {"strimzi": {"partitions": 0}}},
    "strimzi_replicas_string": {"topics": {"strimzi": {"replicas": "3"}}},
    "strimzi_cluster_bad_name": {"topics": {"strimzi": {"cluster": "My Cluster"}}},
    "strimzi_unknown_key": {"topics": {"strimzi": {"retention": "7d"}}},
}


@pytest.mark.parametrize("values", INVALID_VALUES.values(), ids=INVALID_VALUES.keys())
def test_schema_rejects_invalid_values(chart, values):
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(chart.merge_values(values))
    # An install/upgrade renders through the same check.
    with pytest.raises(helm.HelmValuesError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_schema_rejects_loud_log_level_with_a_useful_message(chart):
    with pytest.raises(helm.HelmValuesError, match="logLevel"):
        chart.render({"mailpush": {"logLevel": "loud"}}, name=RELEASE)


@pytest.mark.parametrize("values", [
    {"replicas": 1}, {"replicas": 64}, {"mailpush": {"logLevel": "trace"}},
    {"mailpush": {"logLevel": "critical", "logFormat": "text"}},
    {"kafka": {"brokers": "10.0.0.1:9092"}}, *VARIATIONS.values(),
], ids=lambda v: json.dumps(v, sort_keys=True)[:60])
def test_schema_accepts_valid_values(chart, values):
    chart.validate_schema(chart.merge_values(values))


@pytest.mark.parametrize("values,message", [
    ({"kafka": {"properties": {"security.protocol": "SSL"}}}, "kafka.securityProtocol"),
    ({"kafka": {"properties": {"sasl.password": "x"}}}, "set by the chart"),
    ({"kafka": {"tls": {"enabled": True, "existingSecret": "t", "certKey": "c.pem"}}}, "together"),
    ({"kafka": {"tls": {"enabled": True, "certKey": "c.pem", "keyKey": "k.pem"}}}, "existingSecret"),
    ({"ownership": {"mode": "static"}, "autoscaling": {"enabled": True}}, "ownership.mode group"),
    ({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}, "minReplicas"),
    ({"topics": {"strimzi": {"enabled": True}}}, "topics.strimzi.cluster"),
])
def test_template_rejects_conflicting_values(chart, values, message):
    with pytest.raises(helm.HelmRenderError, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_defaults_and_schema_agree(chart, default_values):
    schema = chart.schema
    assert schema is not None
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(default_values)
    enum = schema["properties"]["mailpush"]["properties"]["logLevel"]["enum"]
    assert enum == ["trace", "debug", "info", "notice", "warning", "error", "critical"]
    assert schema["properties"]["mailpush"]["properties"]["logFormat"]["enum"] == ["json", "text"]
    assert schema["properties"]["replicas"]["minimum"] == 1


# ---------------------------------------------------------------------------
# values.yaml is documented
# ---------------------------------------------------------------------------

# Keys whose children are plain Kubernetes fields, documented by the parent.
PASSTHROUGH = {"resources", "podSecurityContext", "securityContext"}
KEY_LINE = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9_.-]*):(\s|$)")


def test_values_yaml_is_fully_commented():
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    undocumented = []
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = KEY_LINE.match(line)
        if not m:
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parents = [k for _, k in stack]
        stack.append((indent, key))
        if parents and parents[0] in PASSTHROUGH:
            continue
        prev = lines[i - 1].strip() if i else ""
        if not prev.startswith("#"):
            undocumented.append(".".join(parents + [key]))
    assert undocumented == []


def test_every_schema_property_is_in_values_yaml(chart, default_values):
    """The schema and values.yaml describe the same keys (no stale entries)."""
    def walk(schema: dict[str, Any], values: Any, path: str):
        if schema.get("additionalProperties") is False:
            for key in schema.get("properties", {}):
                if key == "global" or (path == "" and key in PASSTHROUGH):
                    continue
                assert isinstance(values, dict) and key in values, f"{path}{key} missing in values.yaml"
                walk(schema["properties"][key], values[key], f"{path}{key}.")
    walk(chart.schema, default_values, "")


def test_notes_render(render):
    notes = render({"replicas": 3, "ownership": {"mode": "static"}}).notes
    assert "p % 3 == N" in notes
    assert "docs/operations.md" in notes
    assert f"state-{FULLNAME}-N" in notes


# ---------------------------------------------------------------------------
# Re-sharding guard (needs `lookup`, which is empty offline: simulate it)
# ---------------------------------------------------------------------------

LOOKUP = '{{- $existing := lookup "apps/v1" "StatefulSet" .Release.Namespace $fullname }}'


def _chart_with_existing_sts(tmp_path, annotation: str | None, running: int | None):
    import shutil
    chart_copy = tmp_path / "mailpush"
    shutil.copytree(CHART_DIR, chart_copy)
    sts = chart_copy / "templates" / "statefulset.yaml"
    text = sts.read_text()
    assert text.count(LOOKUP) == 1, "guard's lookup line changed; update this test"
    meta = '(dict "annotations" (dict "mailpush.io/instances" "%s"))' % annotation \
        if annotation is not None else "(dict)"
    status = f'(dict "replicas" {running})' if running is not None else "(dict)"
    fake = '{{- $existing := dict "metadata" %s "status" %s }}' % (meta, status)
    sts.write_text(text.replace(LOOKUP, fake))
    return helm.Chart.load(chart_copy)


@pytest.mark.parametrize("annotation,running,replicas,refused", [
    ("2", 2, 3, True),     # change while running: refused
    ("3", 1, 1, True),     # scale-down while one pod still runs: refused
    ("2", 0, 3, False),    # stopped first (kubectl scale --replicas=0): allowed
    ("2", 2, 2, False),    # same count (image/config upgrade): allowed
    ("2", None, 3, False), # no status yet
    (None, 2, 3, False),   # StatefulSet from before the annotation existed
])
def test_replica_change_guard_with_static_ownership(tmp_path, annotation, running, replicas, refused):
    static = {"replicas": replicas, "ownership": {"mode": "static"}}
    with _chart_with_existing_sts(tmp_path, annotation, running) as c:
        if refused:
            with pytest.raises(helm.HelmRenderError, match="Scale the StatefulSet"):
                c.render(static, name=RELEASE, namespace=NAMESPACE)
        else:
            r = Rendered(c.render(static, name=RELEASE, namespace=NAMESPACE))
            assert r.sts["spec"]["replicas"] == replicas


@pytest.mark.parametrize("replicas", [1, 3, 8])
def test_group_ownership_scales_a_running_release(tmp_path, replicas):
    """`helm upgrade --set replicas=N` on a running fleet: no guard, the group moves the partitions."""
    with _chart_with_existing_sts(tmp_path, "2", 2) as c:
        r = Rendered(c.render({"replicas": replicas}, name=RELEASE, namespace=NAMESPACE))
        assert r.sts["spec"]["replicas"] == replicas
