"""The custom-metrics path's pure parts: spec.addons.customMetrics, the two tools (Prometheus
from the proxy with its tags, the adapter from its own source), Prometheus' scrape
configuration (which pods, through which node address), the adapter's command line, RBAC and
APIServices, and both planners with their conditions."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import yaml

from operators.addons import custommetrics, prometheus
from operators.addons.custommetrics import planning as adapter_planning
from operators.addons.custommetrics import rendering as adapter_rendering
from operators.addons.lifecycle import Build, Hook, Start, Stop
from operators.addons.prometheus import planning, rendering
from operators.addons.registry import runners
from operators.api import appmetrics
from operators.api.clusters import CUSTOM_METRICS_LOCAL_RULE, CustomMetricsSpec, FakeCluster
from operators.reconciling import clusters as cluster_planning
from operators.reconciling.clusters import AddonState

CA = b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"
NOW = "2026-12-03T09:00:00Z"


def cluster(**addon: Any) -> FakeCluster:
    return FakeCluster.model_validate({
        "metadata": {"name": "west", "namespace": "default", "generation": 1, "uid": "u"},
        "spec": {"addons": {"customMetrics": addon}}})


# -- the spec -----------------------------------------------------------------------------------

def test_custom_metrics_is_off_unless_asked_for_and_needs_a_local_control_plane() -> None:
    assert FakeCluster.model_validate({"metadata": {"name": "a"}}).spec.custom_metrics is None
    on = cluster().spec.custom_metrics
    assert on == CustomMetricsSpec(scrapeInterval="5s", retention="2h", metrics=[])
    assert cluster(enabled=False).spec.custom_metrics is None
    assert "backend 'local'" in CUSTOM_METRICS_LOCAL_RULE["message"]
    assert CUSTOM_METRICS_LOCAL_RULE in FakeCluster.resource.rules


def test_the_api_server_checks_the_interval_retention_and_metric_names() -> None:
    schema = FakeCluster.model_json_schema()["$defs"]["CustomMetricsSpec"]["properties"]
    (interval,) = schema["scrapeInterval"]["x-kubernetes-validations"]
    assert interval["rule"] == "duration(self) >= duration('1s') && " \
                               "duration(self) <= duration('5m')"
    (retention,) = schema["retention"]["x-kubernetes-validations"]
    assert "from 10m to 720h" in retention["message"]
    names = schema["metrics"]["items"]
    assert re.fullmatch(names["pattern"], "vllm_num_requests_waiting")
    assert not re.fullmatch(names["pattern"], "vllm:num_requests_waiting"), \
        "no annotation key holds a colon"
    assert names["maxLength"] == 56
    assert schema["metrics"]["x-kubernetes-list-type"] == "set"


# -- the tools ----------------------------------------------------------------------------------

def test_prometheus_is_built_with_kubernetes_discovery_only_and_stamped(tmp_path: Path) -> None:
    argv = prometheus.TOOL.install_argv("go")
    assert argv[argv.index("-tags") + 1] == "remove_all_sd,enable_kubernetes_sd"
    assert "builtinassets" not in argv[argv.index("-tags") + 1], "the module has no UI assets"
    ldflags = argv[argv.index("-ldflags") + 1]
    assert "-X github.com/prometheus/common/version.Version=3.16.0" in ldflags
    assert "BuildDate" not in ldflags, "alike builds"
    assert argv[-1] == "github.com/prometheus/prometheus/cmd/prometheus@v0.316.0"
    assert prometheus.TOOL.cache_path(tmp_path) == \
        tmp_path / "prometheus" / "v0.316.0" / "prometheus"


def test_the_adapter_is_built_from_its_committed_module_on_the_library() -> None:
    source = custommetrics.TOOL.source
    gomod = (source / "go.mod").read_text()
    assert gomod.startswith("module fakefleet.dev/custom-metrics-adapter\n")
    assert f"\t{custommetrics.LIBRARY} {custommetrics.LIBRARY_VERSION}\n" in gomod
    assert "replace" not in gomod
    assert (source / "go.sum").stat().st_size > 0
    assert {path.name for path in source.glob("*.go")} >= {"main.go", "provider.go"}
    assert len(custommetrics.TOOL.version) == 12


def test_prometheus_comes_before_the_adapter_started_with_its_port() -> None:
    names = [runner.addon.name for runner in runners()]
    assert names.index("prometheus") < names.index("custom-metrics-adapter")


# -- Prometheus' rendering ----------------------------------------------------------------------

def test_prometheus_listens_on_loopback_and_keeps_its_memory_limit_to_itself() -> None:
    argv = rendering.argv(Path("/c/prometheus"), config=Path("/s/prometheus.yml"),
                          data=Path("/s/data"), port=19090)
    assert argv == ["/c/prometheus", "--config.file=/s/prometheus.yml",
                    "--storage.tsdb.path=/s/data", "--web.listen-address=127.0.0.1:19090",
                    "--no-auto-gomemlimit"]


def test_prometheus_boolean_flags_are_spelled_as_kingpin_parses_them() -> None:
    # kingpin refuses "--auto-gomemlimit=false" ("unexpected false") and Prometheus exits.
    argv = rendering.argv(Path("/c/prometheus"), config=Path("/s/prometheus.yml"),
                          data=Path("/s/data"), port=19090)
    assert not [arg for arg in argv if arg.endswith(("=false", "=true"))]


def test_durations_are_whole_units_as_prometheus_reads_them() -> None:
    assert [rendering.duration(s) for s in (5, 0.5, 7200, 1.25)] == \
        ["5s", "500ms", "7200s", "1250ms"]


def config(metrics: list[str] | None = None) -> dict[str, Any]:
    return rendering.config(kubeconfig=Path("/s/kubeconfig"), engine_port=41000,
                            scrape_interval=5, retention=7200, metrics=metrics or [])


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """What Prometheus' relabelling makes of a target's labels (None: dropped), for the
    actions the configuration uses: keep, and replace with its defaults."""
    labels = dict(labels)
    for rule in rules:
        value = ";".join(labels.get(name, "") for name in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule.get("action") == "keep":
            if match is None:
                return None
            continue
        if match is not None:
            template = re.sub(r"\$\{?(\d)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(template)
    return labels


def pod(**annotations: str) -> dict[str, str]:
    found = {"__address__": "10.128.0.7", "__meta_kubernetes_namespace": "serving",
             "__meta_kubernetes_pod_name": "vllm-0", "__meta_kubernetes_pod_node_name": "gpu-3",
             "__meta_kubernetes_pod_host_ip": "127.64.0.4"}
    for key, value in annotations.items():
        name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
        found[f"__meta_kubernetes_pod_annotation_{name}"] = value
        found[f"__meta_kubernetes_pod_annotationpresent_{name}"] = "true"
    return found


WAITING = "fakefleet.dev/metric.vllm_num_requests_waiting"


def test_a_pod_that_opts_in_is_scraped_through_its_node_at_the_engine_s_port() -> None:
    (job,) = config()["scrape_configs"]
    target = relabel(job["relabel_configs"], pod(**{"prometheus.io/scrape": "true"}))
    assert target is not None
    assert target["__address__"] == "127.64.0.4:41000"
    assert target["__metrics_path__"] == "/pods/serving/vllm-0/metrics"
    assert (target["namespace"], target["pod"], target["node"]) == ("serving", "vllm-0", "gpu-3")
    assert job["honor_labels"], "the engine's page labels its series as this relabelling does"
    (discovery,) = job["kubernetes_sd_configs"]
    assert discovery == {"role": "pod", "kubeconfig_file": "/s/kubeconfig", "selectors": [
        {"role": "pod", "field": "status.phase=Running"}]}


def test_other_pods_are_not_targets_unless_they_declare_a_listed_metric() -> None:
    (job,) = config()["scrape_configs"]
    assert relabel(job["relabel_configs"], pod(**{WAITING: "30"})) is None
    assert relabel(job["relabel_configs"], pod(**{"prometheus.io/scrape": "false"})) is None
    (listed,) = config(["vllm_num_requests_waiting"])["scrape_configs"]
    assert relabel(listed["relabel_configs"], pod(**{WAITING: "30"})) is not None
    assert relabel(listed["relabel_configs"], pod(**{"fakefleet.dev/metric.other": "1"})) \
        is None
    assert rendering.present("vllm_num_requests_waiting") == \
        "__meta_kubernetes_pod_annotationpresent_fakefleet_dev_metric_vllm_num_requests_waiting"


def test_samples_are_kept_small_and_scraped_every_interval() -> None:
    rendered = config()
    assert rendered["global"]["scrape_interval"] == "5s"
    assert rendered["storage"] == {"tsdb": {"retention": {"time": "7200s", "size": "256MiB"}}}


def test_prometheus_may_list_and_watch_pods_only() -> None:
    role, binding = rendering.rbac()
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list", "watch"]}]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                    "name": "fakefleet:prometheus"}]


# -- Prometheus' planning -----------------------------------------------------------------------

SETTINGS = planning.settings(CustomMetricsSpec(), 41000)
UP = planning.Observed(control_plane_running=True, binary=True, engine_port=41000)
SCRAPING = planning.Observed(control_plane_running=True, binary=True, installed=True,
                             supervised=True, ready=True, hooked=True, port=19090,
                             engine_port=41000, settings=SETTINGS)


def test_prometheus_is_built_then_started_once_the_engine_has_its_port() -> None:
    assert planning.plan(cluster(), planning.Observed(control_plane_running=True)) == [Build()]
    no_engine = planning.Observed(control_plane_running=True, binary=True)
    assert planning.plan(cluster(), no_engine) == []
    state = planning.condition(cluster(), no_engine)
    assert state == AddonState(False, "Waiting", "waiting for the cluster's engine: Prometheus "
                                                 "scrapes the pods through its plain port")
    assert planning.plan(cluster(), UP) == [Start()]
    started = planning.Observed(**{**UP.__dict__, "supervised": True, "settings": SETTINGS})
    assert planning.plan(cluster(), started) == []
    assert planning.plan(cluster(), planning.Observed(**{**started.__dict__, "ready": True})) \
        == [Hook()], "nothing to hook, but the lifecycle marks it hooked"
    assert planning.plan(cluster(), SCRAPING) == []


def test_the_condition_says_where_its_api_is_and_which_pods_it_scrapes() -> None:
    state = planning.condition(cluster(), SCRAPING)
    assert state == AddonState(True, "Running", (
        "Prometheus 3.16.0 at http://127.0.0.1:19090 (its HTTP API; no web UI), scraping "
        "every 5s the pods annotated prometheus.io/scrape: \"true\""))
    listed = planning.condition(cluster(metrics=["vllm_num_requests_waiting"]), SCRAPING)
    assert listed is not None
    assert listed.message.endswith("or an annotation of vllm_num_requests_waiting")
    building = planning.condition(cluster(), planning.Observed(control_plane_running=True,
                                                               building_for=60))
    assert building is not None
    assert building.reason == "Building"
    assert "a cold build takes about 16 minutes" in building.message


def test_a_new_configuration_restarts_prometheus_and_disabling_it_stops_it() -> None:
    assert planning.plan(cluster(scrapeInterval="10s"), SCRAPING) == [Stop(unhook=False),
                                                                      Start()]
    moved = planning.Observed(**{**SCRAPING.__dict__, "engine_port": 41001})
    assert planning.plan(cluster(), moved) == [Stop(unhook=False), Start()]
    assert planning.plan(cluster(enabled=False), SCRAPING) == [Stop()]
    assert planning.condition(cluster(enabled=False), SCRAPING) is None


# -- the adapter's rendering --------------------------------------------------------------------

def test_the_adapter_serves_on_loopback_asking_prometheus_with_delegated_auth() -> None:
    argv = adapter_rendering.argv(
        Path("/c/adapter"), kubeconfig=Path("/s/kubeconfig"), port=19443, cert=Path("/s/t.crt"),
        key=Path("/s/t.key"), prometheus=19090, metrics=["b_metric", "a_metric"])
    assert argv[0] == "/c/adapter"
    for flag in ("--lister-kubeconfig=/s/kubeconfig", "--authentication-kubeconfig=/s/kubeconfig",
                 "--authorization-kubeconfig=/s/kubeconfig", "--bind-address=127.0.0.1",
                 "--secure-port=19443", "--tls-cert-file=/s/t.crt",
                 "--prometheus-url=http://127.0.0.1:19090"):
        assert flag in argv
    assert argv[-2:] == ["--metric=a_metric", "--metric=b_metric"]


def test_the_adapter_may_delegate_authentication_and_list_pods() -> None:
    roles = {(obj["kind"], obj["roleRef"]["name"] if "roleRef" in obj else "")
             for obj in adapter_rendering.rbac()}
    assert ("ClusterRoleBinding", "system:auth-delegator") in roles
    assert ("RoleBinding", "extension-apiserver-authentication-reader") in roles
    role = next(o for o in adapter_rendering.rbac() if o["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list"]}]
    assert all(s["name"] == "fakefleet:custom-metrics-adapter"
               for o in adapter_rendering.rbac() for s in o.get("subjects", []))


def test_both_versions_reach_loopback_through_an_externalname_service() -> None:
    v1beta2, v1beta1 = adapter_rendering.apiservices(port=19443, ca_pem=CA)
    assert v1beta2["metadata"]["name"] == "v1beta2.custom.metrics.k8s.io"
    assert v1beta2["spec"]["versionPriority"] > v1beta1["spec"]["versionPriority"]
    assert v1beta1["spec"]["version"] == "v1beta1"
    for apiservice in (v1beta2, v1beta1):
        assert apiservice["spec"]["service"] == {
            "name": "custom-metrics-apiserver", "namespace": "kube-system", "port": 19443}
        assert apiservice["spec"]["caBundle"] == base64.b64encode(CA).decode()
        assert "insecureSkipTLSVerify" not in apiservice["spec"]
    service = adapter_rendering.service(19443)
    assert (service["spec"]["type"], service["spec"]["externalName"]) == ("ExternalName",
                                                                          "localhost")
    assert adapter_rendering.SERVICE_HOST == "custom-metrics-apiserver.kube-system.svc"


# -- the adapter's planning ---------------------------------------------------------------------

ADAPTER_SETTINGS = adapter_planning.settings(CustomMetricsSpec(), 19090)
SERVING = adapter_planning.Observed(control_plane_running=True, binary=True, installed=True,
                                    supervised=True, ready=True, hooked=True, port=19443,
                                    prometheus=19090, settings=ADAPTER_SETTINGS)


def test_the_adapter_starts_once_prometheus_has_a_port_and_is_hooked_once_ready() -> None:
    none_yet = adapter_planning.Observed(control_plane_running=True, binary=True)
    assert adapter_planning.plan(cluster(), none_yet) == []
    state = adapter_planning.condition(cluster(), none_yet)
    assert state is not None
    assert (state.reason, state.message) == (
        "Waiting", "waiting for the cluster's Prometheus, which the adapter queries")
    up = adapter_planning.Observed(control_plane_running=True, binary=True, prometheus=19090)
    assert adapter_planning.plan(cluster(), up) == [Start()]
    started = adapter_planning.Observed(**{**up.__dict__, "supervised": True,
                                           "settings": ADAPTER_SETTINGS})
    assert adapter_planning.plan(cluster(), started) == [], "no APIService before it answers"
    ready = adapter_planning.Observed(**{**started.__dict__, "ready": True})
    assert adapter_planning.plan(cluster(), ready) == [Hook()]
    assert adapter_planning.plan(cluster(), SERVING) == []


def test_the_adapter_s_condition_says_what_it_serves_from_where() -> None:
    state = adapter_planning.condition(cluster(), SERVING)
    assert state == AddonState(True, "Running", (
        "the custom-metrics adapter (sigs.k8s.io/custom-metrics-apiserver v1.37.0) serving "
        "custom.metrics.k8s.io (v1beta2, v1beta1) for pods at https://127.0.0.1:19443, from "
        "Prometheus at http://127.0.0.1:19090: every metric Prometheus has of a pod"))
    crashed = adapter_planning.condition(cluster(), adapter_planning.Observed(
        control_plane_running=True, binary=True, supervised=True, prometheus=19090,
        restarts=2, log_tail="F1203 --metric=a:b: is not a Prometheus metric name\n"))
    assert crashed is not None
    assert crashed.reason == "Crashed"
    assert crashed.message.endswith("restarted 2 times: F1203 --metric=a:b: is not a "
                                    "Prometheus metric name")


def test_a_new_allowlist_restarts_the_adapter_and_disabling_it_unhooks_it() -> None:
    listed = cluster(metrics=["vllm_num_requests_waiting"])
    assert adapter_planning.plan(listed, SERVING) == [Stop(unhook=False), Start()]
    moved = adapter_planning.Observed(**{**SERVING.__dict__, "prometheus": 19091})
    assert adapter_planning.plan(cluster(), moved) == [Stop(unhook=False), Start()]
    assert adapter_planning.plan(cluster(enabled=False), SERVING) == [Stop()]


def test_the_cluster_status_carries_both_conditions_outside_ready() -> None:
    observed = cluster_planning.Observed(
        control_plane_running=True, secret_current=True, engine_running=True,
        endpoint="https://127.0.0.1:1", addons=(
            (planning.CONDITION, AddonState(False, "Building", "building Prometheus")),
            (adapter_planning.CONDITION, AddonState(False, "Waiting", "waiting"))))
    status = cluster_planning.status(cluster(), observed, now=NOW, previous=None)
    assert status.phase == "Ready", "only HPAs on application metrics wait for them"
    conditions = {c.type: c for c in status.conditions}
    assert conditions["PrometheusReady"].reason == "Building"
    assert conditions["CustomMetricsReady"].reason == "Waiting"


def test_the_example_is_valid_and_its_pods_serve_a_listed_metric() -> None:
    examples = Path(__file__).parent.parent / "examples" / "custom-metrics"
    kinds = {doc["kind"]: doc for doc in yaml.safe_load_all(
        (examples / "cluster.yaml").read_text())}
    spec = FakeCluster.model_validate(kinds["FakeCluster"]).spec.custom_metrics
    assert spec is not None
    workload = {doc["kind"]: doc for doc in yaml.safe_load_all(
        (examples / "vllm.yaml").read_text())}
    template = workload["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    metrics, problems = appmetrics.parse(appmetrics.declared(template))
    assert not problems
    assert [name for name, _ in metrics] == spec.metrics, "scraped without prometheus.io/scrape"
    (target,) = workload["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert target["pods"]["metric"]["name"] in spec.metrics
