//! The deployment files hold together: the Kubernetes pod can read its token, its memory
//! limit holds the model and the KV budget it is given, every volume it mounts is defined,
//! it serves a Hugging Face reference pulled into a writable shared cache at `HF_HOME` (as
//! does the image, with the cache as a volume), and the launchd and systemd units run
//! unprivileged with a system-call filter.

use inferno::hub::ModelRef;
use inferno::model::synth::SynthSpec;
use inferno::tensor::GgmlType;
use serde_yaml::Value;
use std::path::{Path, PathBuf};

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every YAML document of every file under deploy/kubernetes.
fn kubernetes_documents() -> Vec<Value> {
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(deploy("kubernetes")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = <Value as serde::Deserialize>::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                v["kind"].is_string(),
                "{}: a document without kind",
                path.display()
            );
            docs.push(v);
        }
    }
    docs
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// Kubernetes reads its YAML as YAML 1.1, where `0440` is octal, while serde_yaml follows
/// 1.2 (decimal): take the mode from the file's own text.
fn default_mode_octal(text: &str) -> u32 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("defaultMode:"))
        .expect("the secret volume sets defaultMode");
    let digits = line
        .split(':')
        .nth(1)
        .unwrap()
        .split('#')
        .next()
        .unwrap()
        .trim();
    assert!(digits.starts_with('0'), "write the mode in octal: {line}");
    u32::from_str_radix(digits, 8).unwrap()
}

/// A quantity such as 3Gi or 512Mi, in bytes.
fn quantity_bytes(q: &str) -> u64 {
    let (num, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = num.parse().unwrap();
    n * match unit {
        "Gi" => 1 << 30,
        "Mi" => 1 << 20,
        "G" => 1_000_000_000,
        "M" => 1_000_000,
        "" => 1,
        u => panic!("unit {u}"),
    }
}

fn arg<'a>(args: &'a [Value], name: &str) -> Option<&'a str> {
    args.iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
        .map(|v| v.split_whitespace().next().unwrap_or(v))
}

#[test]
fn the_pod_can_read_its_token() {
    let docs = kubernetes_documents();
    let deployment = of_kind(&docs, "Deployment")[0];
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let uid = container["securityContext"]["runAsUser"]
        .as_u64()
        .or(pod["securityContext"]["runAsUser"].as_u64())
        .expect("runAsUser");
    assert_ne!(uid, 0, "runs as root");
    let fs_group = pod["securityContext"]["fsGroup"].as_u64();
    let volumes = pod["volumes"].as_sequence().unwrap();
    let token = volumes
        .iter()
        .find(|v| v["secret"].is_mapping())
        .expect("a secret volume");
    let mode = default_mode_octal(&read("kubernetes/deployment.yaml"));
    // What the kubelet does with a secret: files owned by root; with an fsGroup, their
    // group becomes it and group read is added (the volume is read-only). The pod's fsGroup
    // is one of its processes' supplementary groups.
    let readable = match fs_group {
        Some(_) => (mode | 0o440) & 0o040 != 0,
        None => mode & 0o004 != 0,
    };
    assert!(
        readable,
        "uid {uid} cannot read the token (mode {mode:o}, fsGroup {fs_group:?})"
    );
    assert_eq!(
        mode & 0o007,
        0,
        "the token is readable by everyone: {mode:o}"
    );
    // The server is told to read the token where the secret is mounted.
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == token["name"])
        .expect("the token volume is mounted");
    let dir = mount["mountPath"].as_str().unwrap();
    let args = container["args"].as_sequence().unwrap();
    let file = arg(args, "auth-token-file").expect("--auth-token-file");
    assert!(file.starts_with(&format!("{dir}/")), "{file} outside {dir}");
}

#[test]
fn the_memory_limit_holds_the_model_and_its_kv_budget() {
    let docs = kubernetes_documents();
    let deployment = of_kind(&docs, "Deployment")[0];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args = container["args"].as_sequence().unwrap();
    assert!(
        arg(args, "model").is_some_and(|m| m.contains("Qwen3-0.6B")),
        "the sizing below is for Qwen3-0.6B"
    );
    let kv_tokens: u64 = arg(args, "kv-cache-tokens")
        .expect("--kv-cache-tokens sized to the memory limit")
        .parse()
        .unwrap();
    let spec = SynthSpec::preset("0.6b", GgmlType::Q8_0).unwrap();
    let per_position = (spec.n_layers * 2 * spec.n_kv_heads * spec.head_dim * 4) as u64;
    assert_eq!(per_position, 224 * 1024, "the figure the header quotes");
    // Q8_0: 34 bytes per 32 weights; loaded twice (the mapped file and the repacked copy),
    // as measured (about 1.3 GB at rest).
    let weights = spec.n_params() as u64 * 34 / 32;
    let need = 2 * weights + kv_tokens * per_position + (256 << 20);
    let limit = quantity_bytes(
        container["resources"]["limits"]["memory"]
            .as_str()
            .expect("a memory limit"),
    );
    assert!(
        need <= limit,
        "{need} bytes needed, limit {limit} (lower --kv-cache-tokens or raise the limit)"
    );
    let request = quantity_bytes(
        container["resources"]["requests"]["memory"]
            .as_str()
            .unwrap(),
    );
    assert_eq!(request, limit, "Guaranteed QoS: requests = limits");
    // Threads = whole CPUs requested.
    let threads = arg(args, "threads").unwrap();
    assert_eq!(
        container["resources"]["limits"]["cpu"].as_str(),
        Some(threads)
    );
}

#[test]
fn images_are_pinned_and_every_claim_is_defined() {
    let docs = kubernetes_documents();
    let deployment = of_kind(&docs, "Deployment")[0];
    let pod = &deployment["spec"]["template"]["spec"];
    for c in pod["containers"].as_sequence().unwrap() {
        let image = c["image"].as_str().unwrap();
        assert!(
            !image.ends_with(":latest") && image.contains(':'),
            "{image}"
        );
        assert!(
            c["imagePullPolicy"].is_string(),
            "{image} without imagePullPolicy"
        );
    }
    let claims: Vec<&str> = of_kind(&docs, "PersistentVolumeClaim")
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    let mut used = 0;
    for v in pod["volumes"].as_sequence().unwrap() {
        if let Some(name) = v["persistentVolumeClaim"]["claimName"].as_str() {
            assert!(claims.contains(&name), "claim {name} is defined nowhere");
            used += 1;
        }
    }
    assert!(used > 0);
    // The header speaks of batching, as the server does.
    let text = read("kubernetes/deployment.yaml");
    assert!(!text.contains("one sequence at a time"));
}

#[test]
fn launchd_and_systemd_run_unprivileged_and_filtered() {
    let plist = read("launchd/dev.inferno.serve.plist");
    let user = plist
        .split("<key>UserName</key>")
        .nth(1)
        .and_then(|rest| rest.split("<string>").nth(1))
        .and_then(|rest| rest.split("</string>").next())
        .expect("the plist sets UserName");
    assert!(!user.is_empty() && user != "root", "{user}");

    let unit = read("systemd/inferno.service");
    let set = |key: &str| {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .collect::<Vec<_>>()
    };
    assert!(set("User").iter().any(|u| *u != "root"));
    assert!(set("SystemCallFilter").contains(&"@system-service"));
    assert!(set("SystemCallFilter").contains(&"~@privileged"));
    assert_eq!(set("CapabilityBoundingSet"), [""]);
    for key in ["NoNewPrivileges", "RestrictNamespaces", "LockPersonality"] {
        assert_eq!(set(key), ["true"], "{key}");
    }
}

#[test]
fn the_image_checks_its_own_health() {
    let dockerfile = read("Dockerfile");
    let check = dockerfile
        .lines()
        .skip_while(|l| !l.starts_with("HEALTHCHECK"))
        .take(2)
        .collect::<String>();
    assert!(check.contains("\"health\""), "{check}");
    assert!(
        dockerfile.contains("libvulkan1"),
        "the gpu backend needs the Vulkan loader"
    );
}

/// The value of environment variable `name` in a container spec.
fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"] == name)
}

#[test]
fn the_pod_pulls_its_model_by_reference_into_a_shared_cache() {
    let docs = kubernetes_documents();
    let deployment = of_kind(&docs, "Deployment")[0];
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = container["args"].as_sequence().unwrap();
    let model = arg(args, "model").expect("--model");
    assert!(!model.starts_with('/'), "a pre-copied file: {model}");
    let r = ModelRef::parse(model).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.quant.is_some(), "the quantization is pinned: {model}");
    // HF_HOME is a writable mount of a shared claim.
    let home = env_value(container, "HF_HOME")
        .and_then(|e| e["value"].as_str())
        .expect("HF_HOME is set");
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == home)
        .expect("a volume is mounted at HF_HOME");
    assert_ne!(
        mount["readOnly"],
        Value::Bool(true),
        "the cache must be writable"
    );
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert!(!volume["persistentVolumeClaim"]["readOnly"]
        .as_bool()
        .unwrap_or(false));
    let claim_name = volume["persistentVolumeClaim"]["claimName"]
        .as_str()
        .expect("the cache is a PersistentVolumeClaim, kept across restarts");
    let claim = of_kind(&docs, "PersistentVolumeClaim")
        .into_iter()
        .find(|c| c["metadata"]["name"] == claim_name)
        .unwrap();
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1);
    let modes = claim["spec"]["accessModes"].as_sequence().unwrap();
    assert!(
        replicas == 1 || modes.iter().any(|m| m == "ReadWriteMany"),
        "{replicas} replicas share the cache: ReadWriteMany"
    );
    assert!(env_value(container, "HF_HUB_OFFLINE").is_none());
    // A gated repository's token is optional.
    let token = env_value(container, "HF_TOKEN").expect("HF_TOKEN from a Secret");
    assert_eq!(
        token["valueFrom"]["secretKeyRef"]["optional"],
        Value::Bool(true)
    );
    // The first start pulls: the startup probe waits longer than loading alone takes.
    let probe = &container["startupProbe"];
    let secs =
        probe["periodSeconds"].as_u64().unwrap() * probe["failureThreshold"].as_u64().unwrap();
    assert!(secs >= 15 * 60, "{secs} s to pull and load");
}

#[test]
fn the_image_keeps_the_hugging_face_cache_on_a_volume() {
    let dockerfile = read("Dockerfile");
    let home = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ENV HF_HOME="))
        .expect("the image sets HF_HOME");
    assert!(
        dockerfile.contains(&format!("VOLUME [\"{home}\"]")),
        "HF_HOME is a volume"
    );
    // Made writable for the user the image runs as.
    assert!(dockerfile.contains(&format!("-o 10001 -g 10001 {home}")));
    assert!(dockerfile.contains("USER 10001"));
    assert!(dockerfile.contains("serve --model Qwen/Qwen3-0.6B-GGUF:Q8_0"));
}

/// Every YAML document under deploy/kubernetes/inference-gateway.
fn gateway_documents() -> Vec<Value> {
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(deploy("kubernetes/inference-gateway")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = <Value as serde::Deserialize>::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                v["kind"].is_string(),
                "{}: a document without kind",
                path.display()
            );
            docs.push(v);
        }
    }
    docs
}

/// A flag's value in a container's args, as `--name=value` or `--name value`.
fn flag<'a>(args: &'a [Value], name: &str) -> Option<&'a str> {
    let long = format!("--{name}");
    let strs: Vec<&str> = args.iter().filter_map(Value::as_str).collect();
    strs.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            Some(v.split_whitespace().next().unwrap_or(v))
        } else if *a == long {
            strs.get(i + 1).copied()
        } else {
            None
        }
    })
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    of_kind(docs, kind)
        .into_iter()
        .find(|d| d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} named {name}"))
}

#[test]
fn the_inference_gateway_reaches_the_http_port_and_reads_metrics_the_server_exports() {
    let gw = gateway_documents();
    let deployment = of_kind(&kubernetes_documents(), "Deployment")[0].clone();
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let args = container["args"].as_sequence().unwrap();

    // The pool selects the server's pods on the port its --http-listen gives.
    let pool = of_kind(&gw, "InferencePool")[0];
    assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
    let labels = pool["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap();
    assert!(!labels.is_empty());
    for (k, v) in labels {
        assert_eq!(&pod["metadata"]["labels"][k], v, "pod label {k:?}");
    }
    let target = pool["spec"]["targetPorts"][0]["number"].as_u64().unwrap();
    let listen = arg(args, "http-listen").expect("--http-listen");
    assert!(
        listen.starts_with("0.0.0.0:"),
        "{listen}: reachable from the gateway"
    );
    assert_eq!(
        listen.rsplit(':').next().unwrap().parse::<u64>().unwrap(),
        target
    );
    let ports = container["ports"].as_sequence().unwrap();
    assert!(ports
        .iter()
        .any(|p| p["containerPort"].as_u64() == Some(target)));
    assert!(
        arg(args, "auth-token-file").is_some(),
        "a pod behind a gateway keeps its token"
    );

    // The picker: its Service, its pool, its configuration.
    let epp_ref = &pool["spec"]["endpointPickerRef"];
    let epp_name = epp_ref["name"].as_str().unwrap();
    let epp_port = epp_ref["port"]["number"].as_u64().unwrap();
    let service = named(&gw, "Service", epp_name);
    assert!(service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|p| p["port"].as_u64() == Some(epp_port)));
    let epp = of_kind(&gw, "Deployment")[0];
    let epp_pod = &epp["spec"]["template"];
    for (k, v) in service["spec"]["selector"].as_mapping().unwrap() {
        assert_eq!(&epp_pod["metadata"]["labels"][k], v);
    }
    let epp_container = &epp_pod["spec"]["containers"][0];
    assert!(epp_container["image"]
        .as_str()
        .unwrap()
        .ends_with("/epp:v1.4.0"));
    let epp_args = epp_container["args"].as_sequence().unwrap();
    assert_eq!(
        flag(epp_args, "pool-name"),
        pool["metadata"]["name"].as_str()
    );
    assert!(epp_container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|p| p["containerPort"].as_u64() == Some(epp_port)));
    let config_path = flag(epp_args, "config-file").expect("--config-file");
    let (dir, file) = config_path.rsplit_once('/').unwrap();
    let mount = epp_container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .expect("the config directory is mounted");
    let volume = epp_pod["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let cm = named(
        &gw,
        "ConfigMap",
        volume["configMap"]["name"].as_str().unwrap(),
    );
    let config: Value = serde_yaml::from_str(cm["data"][file].as_str().unwrap()).unwrap();
    assert_eq!(config["kind"], "EndpointPickerConfig");
    let plugins: Vec<&str> = config["plugins"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().or(p["type"].as_str()).unwrap())
        .collect();
    for profile in config["schedulingProfiles"].as_sequence().unwrap() {
        for r in profile["plugins"].as_sequence().unwrap() {
            let name = r["pluginRef"].as_str().unwrap();
            assert!(plugins.contains(&name), "{name} is defined nowhere");
        }
    }
    // Its RBAC is its service account's.
    let sa = epp_pod["spec"]["serviceAccountName"].as_str().unwrap();
    named(&gw, "ServiceAccount", sa);
    let binding = of_kind(&gw, "RoleBinding")[0];
    assert_eq!(binding["subjects"][0]["name"], sa);
    let role = named(&gw, "Role", binding["roleRef"]["name"].as_str().unwrap());
    let resources: Vec<&str> = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| r["resources"].as_sequence().unwrap())
        .filter_map(Value::as_str)
        .collect();
    assert!(resources.contains(&"pods") && resources.contains(&"inferencepools"));

    // What the picker reads (its defaults unless a flag says otherwise) is what the server
    // exports; the two it cannot have are switched off.
    let exported = inferno::server::metrics::Metrics::new().render(0, 1);
    let has = |name: &str| {
        exported
            .lines()
            .any(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
    };
    for (flag_name, default) in [
        ("total-queued-requests-metric", "vllm:num_requests_waiting"),
        ("total-running-requests-metric", "vllm:num_requests_running"),
        (
            "kv-cache-usage-percentage-metric",
            "vllm:kv_cache_usage_perc",
        ),
    ] {
        let name = flag(epp_args, flag_name).unwrap_or(default);
        assert!(
            has(name),
            "the picker reads {name}, which the server does not export"
        );
    }
    for off in ["lora-info-metric", "cache-info-metric"] {
        assert_eq!(flag(epp_args, off), Some(""), "{off} is switched off");
    }
    // The README's alternative names exist too.
    let readme = read("kubernetes/inference-gateway/README.md");
    for name in [
        "inferno_queue_depth",
        "inferno_running_streams",
        "inferno_kv_cache_usage_ratio",
    ] {
        assert!(readme.contains(name) && has(name), "{name}");
    }

    // The route sends the API to the pool.
    let route = of_kind(&gw, "HTTPRoute")[0];
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["kind"], "InferencePool");
    assert_eq!(backend["group"], "inference.networking.k8s.io");
    assert_eq!(backend["name"], pool["metadata"]["name"]);
}
