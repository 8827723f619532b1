//! The Kubernetes manifests of `deploy/k8s`: accepted by the API's schemas (checked offline by
//! `kubernetes-validate`, which `scripts/setup` installs) and consistent with how tally runs:
//! the topology they mount validates with the environment they give it, the instance id is the
//! pod name, the probes and the metrics port are tally's, the state dir is the pod's volume.

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn k8s_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s")
}

/// Every manifest, by kind.
fn manifests() -> HashMap<String, Value> {
    let mut by_kind = HashMap::new();
    for entry in std::fs::read_dir(k8s_dir()).expect("deploy/k8s exists") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("readable");
            let doc: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let kind = doc["kind"].as_str().expect("a kind").to_string();
            assert!(by_kind.insert(kind.clone(), doc).is_none(), "one {kind} manifest");
        }
    }
    by_kind
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
    let sts = &m["StatefulSet"];
    let pod = &sts["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let labels = &sts["spec"]["template"]["metadata"]["labels"];

    // The instance id is the pod name: stable across restarts, part of the transactional ids.
    let env: HashMap<&str, &Value> = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().expect("name"), e))
        .collect();
    assert_eq!(
        env["TALLY_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );

    // The topology it mounts validates with the variables the pod sets, and nothing else.
    let topology_text = m["ConfigMap"]["data"]["topology.yaml"].as_str().expect("topology");
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
        assert_eq!(
            from_secret["name"], "tally-kafka",
            "`${{{name}}}` comes from the Secret"
        );
        let key = from_secret["key"].as_str().expect("key");
        assert!(m["Secret"]["stringData"].get(key).is_some(), "the Secret has `{key}`");
    }

    // The state dir is the pod's own volume; the root filesystem is read-only.
    let mounts = c["volumeMounts"].as_array().expect("mounts");
    let state = mounts.iter().find(|v| v["name"] == "state").expect("a state mount");
    assert_eq!(
        Path::new(state["mountPath"].as_str().expect("path")),
        topology.state_dir
    );
    assert_eq!(sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "state");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);

    // HTTP: tally serves the probes and /metrics on the address it is given.
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("text"))
        .collect();
    assert_eq!(args[0], "run");
    let address = args
        .iter()
        .position(|a| *a == "--http-address")
        .map(|i| args[i + 1])
        .expect("an HTTP address");
    let port: u16 = address.rsplit(':').next().expect("port").parse().expect("a port");
    let http = &c["ports"][0];
    assert_eq!(
        (http["name"].as_str(), http["containerPort"].as_u64()),
        (Some("http"), Some(port.into()))
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/health/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/health/live");
    assert_eq!(m["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["port"], "http");
    assert_eq!(m["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["path"], "/metrics");

    // SIGTERM's last commit waits at most 10 s per step (deliveries, offsets, commit, abort).
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("a grace period");
    assert!(grace >= 40, "the grace period covers the last commit: {grace}s");

    // Everything that selects the pods selects these labels.
    for selector in [
        &sts["spec"]["selector"]["matchLabels"],
        &m["Service"]["spec"]["selector"],
        &m["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        &m["PodMonitor"]["spec"]["selector"]["matchLabels"],
    ] {
        for (k, v) in selector.as_object().expect("labels") {
            assert_eq!(&labels[k], v, "selector {k}={v} matches the pods");
        }
    }
    assert_eq!(sts["spec"]["serviceName"], m["Service"]["metadata"]["name"]);
    assert_eq!(m["Service"]["spec"]["clusterIP"], "None", "headless: stable pod names");
}
