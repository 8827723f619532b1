//! The Kubernetes manifests of `deploy/k8s`: accepted by the API's schemas (checked offline by
//! `kubernetes-validate`, which `scripts/setup` installs) and consistent with how tally runs,
//! for the instances' StatefulSet and the reconciler's Deployment alike: the topology they
//! mount validates with the environment they give it, the instance id is the pod name, the
//! probes and the metrics port are tally's, the state dir is the pod's volume, and each
//! selector picks the pods it is meant for.

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn k8s_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s")
}

/// Every manifest, by `<kind>/<name>`.
fn manifests() -> HashMap<String, Value> {
    let mut by_name = HashMap::new();
    for entry in std::fs::read_dir(k8s_dir()).expect("deploy/k8s exists") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("readable");
            let doc: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let kind = doc["kind"].as_str().expect("a kind");
            let name = doc["metadata"]["name"].as_str().expect("a name");
            let key = format!("{kind}/{name}");
            assert!(by_name.insert(key.clone(), doc).is_none(), "one {key} manifest");
        }
    }
    by_name
}

/// True when the `matchLabels`-style `selector` picks pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .expect("a label selector")
        .iter()
        .all(|(k, v)| &labels[k] == v)
}

/// The environment variables of container `c`, by name.
fn env_of(c: &Value) -> HashMap<&str, &Value> {
    c["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().expect("name"), e))
        .collect()
}

/// The port of an address `host:port`.
fn port_of(address: &str) -> u16 {
    address.rsplit(':').next().expect("port").parse().expect("a port")
}

/// What every tally pod template must do, whichever controller runs it: the instance id from
/// the pod name, the ConfigMap's topology mounted where `topology_arg` says and valid with the
/// variables the pod sets (its credentials from the Secret), the state dir on the volume named
/// `state`, a read-only root as a non-root user, tally's probes on the `http` port (`port`),
/// and a grace period that covers the last commit. Returns the topology.
fn check_pod(m: &HashMap<String, Value>, pod: &Value, topology_arg: &str, port: u16) -> tally::topology::Topology {
    let c = &pod["containers"][0];
    let env = env_of(c);
    // The instance id is the pod name: unique, and part of the transactional ids.
    assert_eq!(
        env["TALLY_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );

    // The topology it mounts validates with the variables the pod sets, and nothing else.
    let mounts = c["volumeMounts"].as_array().expect("mounts");
    let topology_mount = mounts
        .iter()
        .find(|v| v["mountPath"] == topology_arg)
        .unwrap_or_else(|| panic!("nothing is mounted at {topology_arg}"));
    let topology_volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == topology_mount["name"])
        .expect("the topology's volume");
    let configmap = format!(
        "ConfigMap/{}",
        topology_volume["configMap"]["name"]
            .as_str()
            .expect("a ConfigMap volume")
    );
    let key = topology_mount["subPath"].as_str().expect("the topology's key");
    let topology_text = m[&configmap]["data"][key].as_str().expect("topology");
    let asked = std::cell::RefCell::new(Vec::new());
    let topology = tally::config::load_str("configmap.yaml", topology_text, |name| {
        asked.borrow_mut().push(name.to_string());
        env.get(name).map(|_| format!("value-of-{name}"))
    })
    .unwrap_or_else(|e| panic!("the ConfigMap's topology is invalid: {e}"));
    let asked = asked.into_inner();
    assert!(!asked.is_empty(), "credentials come from the environment");
    for name in &asked {
        let from_secret = &env[name.as_str()]["valueFrom"]["secretKeyRef"];
        let secret = format!("Secret/{}", from_secret["name"].as_str().expect("from a Secret"));
        let key = from_secret["key"].as_str().expect("key");
        assert!(
            m.get(&secret).is_some_and(|s| s["stringData"].get(key).is_some()),
            "`${{{name}}}` comes from {secret}, which has `{key}`"
        );
    }

    // The state dir is the pod's volume; the root filesystem is read-only.
    let state = mounts.iter().find(|v| v["name"] == "state").expect("a state mount");
    assert_eq!(
        Path::new(state["mountPath"].as_str().expect("path")),
        topology.state_dir
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);

    // HTTP: tally serves the probes and /metrics on the address it is given.
    let http = &c["ports"][0];
    assert_eq!(
        (http["name"].as_str(), http["containerPort"].as_u64()),
        (Some("http"), Some(port.into()))
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/health/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/health/live");

    // SIGTERM's last commit waits at most 10 s per step (offsets, deliveries, commit, abort).
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("a grace period");
    assert!(grace >= 40, "the grace period covers the last commit: {grace}s");
    topology
}

/// The container's arguments.
fn args_of(c: &Value) -> Vec<&str> {
    c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("text"))
        .collect()
}

#[test]
fn the_manifests_pass_the_kubernetes_schemas() {
    let files: Vec<PathBuf> = std::fs::read_dir(k8s_dir())
        .expect("deploy/k8s exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(&files)
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("No module named kubernetes_validate"),
        "kubernetes-validate is missing: run scripts/setup"
    );
    assert!(out.status.success(), "kubernetes-validate refused a manifest:\n{text}");
    // The PodMonitor is a custom resource (no schema offline); everything else is checked.
    let passed = text.lines().filter(|l| l.contains(" passed for resource ")).count();
    assert_eq!(passed, files.len() - 1, "every built-in resource checked:\n{text}");
}

#[test]
fn the_statefulset_runs_tally_as_its_comments_say() {
    let m = manifests();
    let sts = &m["StatefulSet/tally"];
    let pod = &sts["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let labels = &sts["spec"]["template"]["metadata"]["labels"];

    // `tally run <topology> --http-address <address>`.
    let args = args_of(c);
    assert_eq!(args[0], "run");
    let address = args
        .iter()
        .position(|a| *a == "--http-address")
        .map(|i| args[i + 1])
        .expect("an HTTP address");
    let topology = check_pod(&m, pod, args[1], port_of(address));
    assert!(
        topology.reconciler_view().is_ok(),
        "the reconciler runs on its own, not in these pods"
    );

    // A restarted pod finds its stores on its own volume.
    assert_eq!(sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "state");
    let monitor = &m["PodMonitor/tally"]["spec"];
    assert_eq!(monitor["podMetricsEndpoints"][0]["port"], "http");
    assert_eq!(monitor["podMetricsEndpoints"][0]["path"], "/metrics");

    // Everything that selects the pods selects these labels.
    for selector in [
        &sts["spec"]["selector"]["matchLabels"],
        &m["Service/tally"]["spec"]["selector"],
        &m["PodDisruptionBudget/tally"]["spec"]["selector"]["matchLabels"],
        &monitor["selector"]["matchLabels"],
    ] {
        assert!(selects(selector, labels), "{selector} matches the pods {labels}");
    }
    assert_eq!(sts["spec"]["serviceName"], m["Service/tally"]["metadata"]["name"]);
    assert_eq!(
        m["Service/tally"]["spec"]["clusterIP"], "None",
        "headless: stable pod names"
    );
}

#[test]
fn the_reconciler_runs_as_a_deployment_of_its_own() {
    let m = manifests();
    let deployment = &m["Deployment/tally-reconciler"];
    let pod = &deployment["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(deployment["spec"]["replicas"], 2);

    // `tally reconcile live <topology> --instance-id <pod name>`, HTTP on TALLY_HTTP_ADDRESS.
    let args = args_of(c);
    assert_eq!(args[..2], ["reconcile", "live"]);
    let id = args
        .iter()
        .position(|a| *a == "--instance-id")
        .map(|i| args[i + 1])
        .expect("an instance id");
    assert_eq!(id, "$(TALLY_INSTANCE_ID)", "the pod name, expanded by Kubernetes");
    let env = env_of(c);
    let address = env["TALLY_HTTP_ADDRESS"]["value"].as_str().expect("an HTTP address");
    let topology = check_pod(&m, pod, args[2], port_of(address));
    if let Err(why) = topology.reconciler_view() {
        panic!("`tally reconcile live` refuses the ConfigMap's topology: {why}");
    }
    // The flag and the variable are the command's own.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["reconcile", "live", "--help"])
        .output()
        .expect("tally runs");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--instance-id") && help.contains("TALLY_HTTP_ADDRESS"),
        "{help}"
    );

    // Its stores come back from their changelogs: an emptyDir, no claim, no StatefulSet.
    let state = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "state")
        .expect("a state volume");
    assert!(state["emptyDir"].is_object(), "{state}");
    let sts_pod = &m["StatefulSet/tally"]["spec"]["template"]["spec"];
    assert_eq!(
        pod["terminationGracePeriodSeconds"], sts_pod["terminationGracePeriodSeconds"],
        "as long to commit on SIGTERM as the instances"
    );

    // Its own budget and the PodMonitor pick its pods; the instances' controller, Service and
    // budget do not (they would count or adopt them), nor does its budget pick the instances.
    let sts_labels = &m["StatefulSet/tally"]["spec"]["template"]["metadata"]["labels"];
    let budget = &m["PodDisruptionBudget/tally-reconciler"]["spec"];
    assert_eq!(budget["maxUnavailable"], 1);
    for selector in [
        &deployment["spec"]["selector"]["matchLabels"],
        &budget["selector"]["matchLabels"],
        &m["PodMonitor/tally"]["spec"]["selector"]["matchLabels"],
    ] {
        assert!(
            selects(selector, labels),
            "{selector} matches the reconciler's pods {labels}"
        );
    }
    assert!(!selects(&budget["selector"]["matchLabels"], sts_labels));
    assert!(!selects(&deployment["spec"]["selector"]["matchLabels"], sts_labels));
    for selector in [
        &m["StatefulSet/tally"]["spec"]["selector"]["matchLabels"],
        &m["Service/tally"]["spec"]["selector"],
        &m["PodDisruptionBudget/tally"]["spec"]["selector"]["matchLabels"],
    ] {
        assert!(
            !selects(selector, labels),
            "{selector} leaves the reconciler's pods alone"
        );
    }
}
