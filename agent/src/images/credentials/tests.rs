//! Cases follow the semantics of upstream's `keyring_test.go`, `config_test.go` and
//! `secrets_test.go`; the data is our own.

use std::collections::BTreeMap;

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use k8s_openapi::ByteString;

use super::*;

fn b64(s: &str) -> String {
    STANDARD.encode(s)
}

fn secret(ns: &str, name: &str, type_: &str, key: &str, data: &str) -> Secret {
    let mut s = Secret::default();
    s.metadata.namespace = Some(ns.into());
    s.metadata.name = Some(name.into());
    s.type_ = Some(type_.into());
    s.data = Some(BTreeMap::from([(key.to_owned(), ByteString(data.as_bytes().to_vec()))]));
    s
}

/// A `.dockerconfigjson` with one registry and `auth` = base64(user:pass).
fn config_json(registry: &str, user: &str, pass: &str) -> String {
    serde_json::json!({ "auths": { registry: { "auth": b64(&format!("{user}:{pass}")), "email": "ops@example.org" } } })
        .to_string()
}

fn pull_secret(name: &str, registry: &str, user: &str, pass: &str) -> Secret {
    secret("default", name, SECRET_TYPE_DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, &config_json(registry, user, pass))
}

/// A keyring from a legacy `.dockercfg` document.
fn dockercfg_keyring(doc: &serde_json::Value) -> Keyring {
    let mut k = Keyring::new();
    let errors = k.add_document(
        &CredentialSource::File("/test/.dockercfg".into()),
        "",
        ConfigFormat::Dockercfg,
        doc.to_string().as_bytes(),
    );
    assert!(errors.is_empty(), "{errors:?}");
    k
}

/// A keyring with one credential `user`/`pass` under `registry`.
fn one(registry: &str, user: &str) -> Keyring {
    dockercfg_keyring(&serde_json::json!({ registry: { "username": user, "password": "pw", "email": "e@x" } }))
}

fn users(creds: &[&Credential]) -> Vec<String> {
    creds.iter().map(|c| c.username().to_owned()).collect()
}

#[test]
fn urls_match_like_upstream() {
    let cases = [
        // Host globs, no path.
        ("*.example.org", "mirror.example.org", true),
        ("cache.*.org", "cache.example.org", true),
        ("cache.example.*", "cache.example.org", true),
        ("*-eu.example.org", "pull-eu.example.org", true),
        // `?` starts the URL's query in a key, so it never works as a glob (as upstream).
        ("registry-?.example.org", "registry-7.example.org", false),
        ("registry-[0-9].example.org", "registry-7.example.org", true),
        ("registry-[0-9].example.org", "registry-x.example.org", false),
        // `^` is not a valid host character for Go's URL parser: such a key is invalid.
        ("registry-[^0-9].example.org", "registry-x.example.org", false),
        // With paths: the key's path is a prefix of the image's.
        ("*.example.org/team", "mirror.example.org/team", true),
        ("cache.*.org/team", "cache.example.org/team/app", true),
        // A string prefix, not a path-segment prefix (as upstream).
        ("example.org/team", "example.org/teamwork/app", true),
        ("example.org/team/app", "example.org/team", false),
        // With ports.
        ("*.example.org:5000/team", "a.example.org:5000/team", true),
        ("cache.*.org:5000/team", "cache.example.org:5000/team/app", true),
        ("127.0.0.1:5443", "127.0.0.1:5443/busybox", true),
        ("127.0.0.*:5443", "127.0.0.1:5443/busybox", true),
        ("127.0.0.1:5443", "127.0.0.1:5000/busybox", false),
        ("127.0.0.1", "127.0.0.1:5000/busybox", false),
        ("[::1]:5000", "[::1]:5000/app", true),
        ("*.example.org:5001/team", "a.example.org:5000/team", false),
        ("cache.*.org/team", "cache.example.org:5000/team/app", false),
        // A glob label never spans a dot: the label counts must agree.
        ("*.example.org", "example.org", false),
        ("*.*.example.org", "a.example.org", false),
        ("*.*.example.org", "example.org", false),
        ("*.org", "a.example.org", false),
        // Labels that differ.
        ("example.org", "example.net", false),
        ("e*.org", "quay.org", false),
        // Case-sensitive, as Go's filepath.Match.
        ("Example.org", "example.org", false),
        // A malformed glob never matches.
        ("registry-[.example.org", "registry-[.example.org", false),
        ("registry-\\", "registry-", false),
    ];
    for (glob, target, want) in cases {
        assert_eq!(urls_match(glob, target), want, "urls_match({glob:?}, {target:?})");
    }
}

#[test]
fn keys_with_scheme_api_version_and_globs_match_images() {
    // (key as written in a docker config, the image's registry part)
    let hits = [
        ("https://mirror.example.org", "mirror.example.org"),
        ("http://mirror.example.org", "mirror.example.org"),
        ("https://*.example.org", "cache.example.org"),
        ("https://cache.*.org", "cache.example.org"),
        ("https://cache.example.*", "cache.example.org"),
        ("https://*.example.org/team", "cache.example.org/team"),
        ("https://cache.*.org/team", "cache.example.org/team/sub"),
        ("https://*.example.org:8443", "cache.example.org:8443"),
        ("https://cache.*.org:8443", "cache.example.org:8443"),
        ("https://*.example.org/team:9", "cache.example.org/team:9"),
        // `/v1/` and `/v2/` mean the registry itself.
        ("https://*.example.org/v1/", "cache.example.org/anything:1"),
        ("https://*.example.org/v2/", "cache.example.org/anything:1"),
        ("cache.example.org:8443", "cache.example.org:8443/team"),
        ("*.example.org:8443", "cache.example.org:8443/team"),
        // Userinfo is not part of the host.
        ("https://someone@cache.example.org", "cache.example.org"),
    ];
    for (key, target) in hits {
        let k = one(key, "u");
        let found = k.lookup(&format!("{target}/app/x"));
        assert_eq!(users(&found), ["u"], "key {key:?} should match {target:?}");
        assert_eq!(found[0].password(), "pw");
        assert_eq!(found[0].email(), "e@x");
    }
    let misses = [
        ("https://mirror.example.org", "other.example.net/app"),
        ("https://*.example.com", "cache.example.org"),
        ("https://other.*.org", "cache.example.org"),
        ("https://cache.example.c*", "cache.example.org"),
        ("https://cache.*.org/team:9", "cache.example.org/team/sub:9"),
        ("other.*.org", "cache.example.org"),
    ];
    for (key, target) in misses {
        assert!(one(key, "u").lookup(&format!("{target}/app/x")).is_empty(), "key {key:?} must not match {target:?}");
    }
}

#[test]
fn docker_hub_credentials_apply_to_hub_images_only() {
    let k = one("https://index.docker.io/v1/", "hub");
    assert_eq!(k.creds.keys().collect::<Vec<_>>(), ["index.docker.io"]);
    for image in ["docker.io/library/busybox", "docker.io/someone/app", "someone/app", "busybox"] {
        assert_eq!(users(&k.lookup(image)), ["hub"], "{image}");
    }
    // Direct match, not the fallback: still exactly one.
    assert_eq!(users(&k.lookup("index.docker.io/someone/app")), ["hub"]);
    assert!(k.lookup("registry.example.org/someone/app").is_empty());
    assert!(k.lookup("localhost:5000/app").is_empty());

    // Credentials filed under `docker.io` match normalised names directly.
    let k = one("docker.io", "io");
    assert_eq!(users(&k.lookup("docker.io/library/busybox")), ["io"]);

    // Through the whole path: an image as written in a pod spec.
    let k = one("https://index.docker.io/v1/", "hub");
    let creds = credentials_for_image("busybox:1.36", &[&k]).unwrap();
    assert_eq!(creds.len(), 1);
    assert!(credentials_for_image("quay.io/app:v1", &[&k]).unwrap().is_empty());
}

#[test]
fn default_registry_match() {
    for (image, want) in [
        ("someone/app", true),
        ("docker.io/someone/app", true),
        ("index.docker.io/someone/app", true),
        ("busybox", true),
        ("", false),
        ("registry.example.org/someone/app", false),
        ("registry:5000/someone/app", false),
        ("notdocker.io/someone/app", false),
    ] {
        assert_eq!(is_default_registry_match(image), want, "{image:?}");
    }
}

#[test]
fn lookup_returns_every_match_most_specific_first() {
    let k = dockercfg_keyring(&serde_json::json!({
        "registry.example.org/payments": { "username": "alice", "password": "a" },
        "registry.example.org": { "username": "bob", "password": "b" },
    }));
    for (image, want) in [
        ("registry.example.org", &["bob"][..]),
        ("registry.example.org/payments", &["alice", "bob"]),
        ("registry.example.org/billing", &["bob"]),
        ("registry.example.org/paymentsv2", &["alice", "bob"]),
        ("registry.example.org/payments/api", &["alice", "bob"]),
        ("example.org", &[]),
        ("other.example.org", &[]),
    ] {
        assert_eq!(users(&k.lookup(image)), want, "{image}");
    }
}

#[test]
fn key_with_scheme_and_v1_path_matches_the_whole_host() {
    let k = one("https://quay.example/v1/", "rex");
    for image in ["quay.example", "quay.example/team", "quay.example/team/app"] {
        assert_eq!(users(&k.lookup(image)), ["rex"], "{image}");
    }
    // `/v2/<path>` keeps the path.
    let k = one("https://quay.example/v2/team", "t");
    assert_eq!(k.creds.keys().collect::<Vec<_>>(), ["quay.example/team"]);
    // `/v1` without the slash is a path like any other.
    let k = one("https://quay.example/v1", "t");
    assert_eq!(k.creds.keys().collect::<Vec<_>>(), ["quay.example/v1"]);
}

#[test]
fn same_key_from_several_sources_keeps_their_order() {
    let (k, errors) = Keyring::from_pull_secrets(&[
        pull_secret("first", "https://registry.example.org", "one", "1"),
        pull_secret("second", "registry.example.org", "two", "2"),
    ]);
    assert!(errors.is_empty());
    let found = k.lookup("registry.example.org/app");
    assert_eq!(users(&found), ["one", "two"]);
    assert_eq!(found[0].source(), &CredentialSource::Secret { namespace: "default".into(), name: "first".into() });
    assert_eq!(found[0].registry(), "registry.example.org");
}

#[test]
fn auth_field_decoding() {
    let entry = |v: serde_json::Value| {
        let k = dockercfg_keyring(&serde_json::json!({ "r.example": v }));
        let c = k.lookup("r.example/app")[0].clone();
        (c.username().to_owned(), c.password().to_owned(), c.email().to_owned())
    };
    let s = |a: &str, b: &str, c: &str| (a.to_owned(), b.to_owned(), c.to_owned());
    // Padded and unpadded base64.
    assert_eq!(entry(serde_json::json!({ "auth": STANDARD.encode("user:pw") })), s("user", "pw", ""));
    assert_eq!(entry(serde_json::json!({ "auth": STANDARD_NO_PAD.encode("user:pw") })), s("user", "pw", ""));
    // Only the first ':' separates.
    assert_eq!(entry(serde_json::json!({ "auth": b64("user:p:w:") })), s("user", "p:w:", ""));
    assert_eq!(entry(serde_json::json!({ "auth": b64(":") })), s("", "", ""));
    // `auth` wins over username/password; email stays.
    assert_eq!(
        entry(serde_json::json!({ "username": "x", "password": "y", "email": "e", "auth": b64("user:pw") })),
        s("user", "pw", "e")
    );
    // Without `auth`, username and password as given; empty `auth` is no auth.
    assert_eq!(entry(serde_json::json!({ "username": "x", "password": "y", "auth": "" })), s("x", "y", ""));
    // Field names match case-insensitively, as Go's encoding/json.
    assert_eq!(entry(serde_json::json!({ "Username": "x", "PASSWORD": "y", "Email": "e" })), s("x", "y", "e"));
    assert_eq!(entry(serde_json::json!({ "Auth": b64("user:pw") })), s("user", "pw", ""));
    // Line breaks inside base64 are ignored, as Go's decoder does.
    let wrapped = format!("{}\n{}", &b64("user:password")[..8], &b64("user:password")[8..]);
    assert_eq!(entry(serde_json::json!({ "auth": wrapped })), s("user", "password", ""));
    // Upstream reads neither token; null fields and a null entry are empty.
    assert_eq!(
        entry(serde_json::json!({ "identitytoken": "tok", "registrytoken": "rt", "username": null })),
        s("", "", "")
    );
    assert_eq!(entry(serde_json::Value::Null), s("", "", ""));
    assert!(dockercfg_keyring(&serde_json::json!({ "r.example": null })).lookup("r.example/app")[0].is_empty());
}

#[test]
fn pull_secret_types() {
    let json = config_json("r.example", "u", "p");
    let legacy = serde_json::json!({ "r.example": { "auth": b64("legacy:p") } }).to_string();
    let (k, errors) = Keyring::from_pull_secrets(&[
        secret("ns", "json", SECRET_TYPE_DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, &json),
        secret("ns", "cfg", SECRET_TYPE_DOCKERCFG, DOCKERCFG_KEY, &legacy),
        // Ignored: wrong type, wrong key for the type, empty data, no type.
        secret("ns", "opaque", "Opaque", DOCKER_CONFIG_JSON_KEY, &json),
        secret("ns", "mismatch", SECRET_TYPE_DOCKERCFG, DOCKER_CONFIG_JSON_KEY, &json),
        secret("ns", "empty", SECRET_TYPE_DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, ""),
        Secret::default(),
    ]);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(users(&k.lookup("r.example/app")), ["u", "legacy"]);
    assert_eq!(k.len(), 2);

    // A config.json without `auths` (or with null) holds nothing, without error.
    for doc in ["{}", r#"{"auths": null}"#, r#"{"credsStore": "desktop"}"#, "null"] {
        let (k, errors) = Keyring::from_pull_secrets(&[secret(
            "ns",
            "s",
            SECRET_TYPE_DOCKER_CONFIG_JSON,
            DOCKER_CONFIG_JSON_KEY,
            doc,
        )]);
        assert!(k.is_empty() && errors.is_empty(), "{doc}: {errors:?}");
    }
}

#[test]
fn malformed_secrets_are_reported_and_skipped_without_breaking_others() {
    let good = pull_secret("good", "r.example", "good-user", "good-pass");
    let bad_auth = |name: &str, auth: &str| {
        let doc = serde_json::json!({ "auths": { "r.example": { "auth": auth } } }).to_string();
        secret("team", name, SECRET_TYPE_DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, &doc)
    };
    let cases: Vec<(Secret, &str, Problem)> = vec![
        (bad_auth("b64", "not*base64!"), r#".dockerconfigjson auths["r.example"].auth"#, Problem::AuthBase64),
        (
            bad_auth("colon", &b64("nocolon-s3cr3t")),
            r#".dockerconfigjson auths["r.example"].auth"#,
            Problem::AuthNoColon,
        ),
        (
            bad_auth("utf8", &STANDARD.encode([0xff, 0xfe, b':', b'x'])),
            r#".dockerconfigjson auths["r.example"].auth"#,
            Problem::AuthNotUtf8,
        ),
        (
            secret(
                "team",
                "json",
                SECRET_TYPE_DOCKER_CONFIG_JSON,
                DOCKER_CONFIG_JSON_KEY,
                r#"{"auths": {"r.example": "#,
            ),
            ".dockerconfigjson",
            Problem::Json { category: "unexpected end of input", line: 1, column: 24 },
        ),
        (
            secret("team", "array", SECRET_TYPE_DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, "[]"),
            ".dockerconfigjson",
            Problem::NotObject,
        ),
        (
            secret("team", "auths", SECRET_TYPE_DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, r#"{"auths": ["x"]}"#),
            ".dockerconfigjson auths",
            Problem::NotObject,
        ),
        (
            secret(
                "team",
                "entry",
                SECRET_TYPE_DOCKER_CONFIG_JSON,
                DOCKER_CONFIG_JSON_KEY,
                r#"{"auths": {"r.example": 1}}"#,
            ),
            r#".dockerconfigjson auths["r.example"]"#,
            Problem::NotObject,
        ),
        (
            secret(
                "team",
                "type",
                SECRET_TYPE_DOCKER_CONFIG_JSON,
                DOCKER_CONFIG_JSON_KEY,
                r#"{"auths": {"r.example": {"password": 12345}}}"#,
            ),
            r#".dockerconfigjson auths["r.example"].password"#,
            Problem::NotString,
        ),
        (
            secret("team", "legacy", SECRET_TYPE_DOCKERCFG, DOCKERCFG_KEY, r#"{"r.example": {"auth": "%%%"}}"#),
            r#".dockercfg ["r.example"].auth"#,
            Problem::AuthBase64,
        ),
    ];
    for (bad, field, problem) in cases {
        let name = bad.metadata.name.clone().unwrap();
        // The bad secret comes first: it must not hide the good one.
        let (k, errors) = Keyring::from_pull_secrets(&[bad, good.clone()]);
        assert_eq!(users(&k.lookup("r.example/app")), ["good-user"], "{name}");
        assert_eq!(
            errors,
            [CredentialError {
                origin: CredentialSource::Secret { namespace: "team".into(), name: name.clone() },
                field: field.into(),
                problem,
            }],
            "{name}"
        );
        assert!(errors[0].skips_source());
        let msg = errors[0].to_string();
        assert!(msg.starts_with(&format!("imagePullSecret team/{name}: {field} ")), "{msg}");
        assert!(msg.ends_with("(skipped)"), "{msg}");
        assert!(!msg.contains("s3cr3t") && !msg.contains("12345"), "{msg}");
    }
}

#[test]
fn a_whole_secret_is_skipped_when_one_entry_is_bad() {
    let doc = serde_json::json!({ "auths": {
        "a.example": { "auth": b64("fine:pw") },
        "b.example": { "auth": "!!" },
    } })
    .to_string();
    let (k, errors) = Keyring::from_pull_secrets(&[secret(
        "ns",
        "mixed",
        SECRET_TYPE_DOCKER_CONFIG_JSON,
        DOCKER_CONFIG_JSON_KEY,
        &doc,
    )]);
    assert!(k.is_empty());
    assert_eq!(errors.len(), 1);
}

#[test]
fn an_invalid_registry_key_drops_only_its_entry() {
    let doc = serde_json::json!({ "auths": {
        "bad host.example": { "auth": b64("x:y") },
        "r.example:port": { "auth": b64("x:y") },
        "r.example": { "auth": b64("fine:pw") },
    } })
    .to_string();
    let (k, errors) =
        Keyring::from_pull_secrets(&[secret("ns", "s", SECRET_TYPE_DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, &doc)]);
    assert_eq!(users(&k.lookup("r.example/app")), ["fine"]);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().all(|e| !e.skips_source() && matches!(e.problem, Problem::InvalidRegistry(_))));
    assert_eq!(errors[0].field, r#".dockerconfigjson auths["bad host.example"]"#);
    assert!(errors[0].to_string().contains("invalid character ' ' in host name"), "{}", errors[0]);
    assert!(errors[1].to_string().contains(r#"invalid port ":port" after host"#), "{}", errors[1]);
}

#[test]
fn credentials_never_show_in_debug_or_display() {
    let (k, _) = Keyring::from_pull_secrets(&[pull_secret("s", "r.example", "the-user", "hunter2")]);
    let c = k.lookup("r.example/app")[0].clone();
    assert_eq!((c.username(), c.password()), ("the-user", "hunter2"));
    for text in
        [format!("{c:?}"), format!("{c:#?}"), c.to_string(), format!("{k:?}"), format!("{:?}", k.lookup("r.example"))]
    {
        assert!(!text.contains("hunter2") && !text.contains("the-user"), "{text}");
        assert!(!text.contains(&b64("the-user:hunter2")), "{text}");
    }
    assert_eq!(c.to_string(), "credentials for r.example from imagePullSecret default/s");
    assert!(format!("{c:?}").contains(r#"registry: "r.example""#));
    assert!(format!("{c:?}").contains("password: <redacted>"));
    let empty = one("r.example", "");
    assert!(format!("{:?}", empty.lookup("r.example")[0]).contains("username: <empty>"));
}

#[test]
fn converts_to_cri_auth_config_as_upstream() {
    let (k, _) = Keyring::from_pull_secrets(&[pull_secret("s", "r.example", "u", "p")]);
    let c = k.lookup("r.example/app")[0];
    let auth = AuthConfig::from(c);
    assert_eq!(auth, AuthConfig { username: "u".into(), password: "p".into(), ..AuthConfig::default() });
    assert_eq!(c.auth_config(), auth);
}

#[test]
fn union_puts_pull_secrets_before_node_credentials() {
    let (secrets, _) = Keyring::from_pull_secrets(&[
        pull_secret("host", "r.example:5443", "from-secret-host", "p"),
        pull_secret("path", "r.example:5443/team", "from-secret-path", "p"),
    ]);
    let node = one("r.example:5443", "from-node");
    let creds = credentials_for_image("r.example:5443/team/app:v1", &[&secrets, &node]).unwrap();
    assert_eq!(
        creds.iter().map(Credential::username).collect::<Vec<_>>(),
        ["from-secret-path", "from-secret-host", "from-node"]
    );
    assert!(credentials_for_image("r.example:5000/team/app", &[&secrets, &node]).unwrap().is_empty());
    assert_eq!(
        credentials_for_image("Bad/Name", &[&secrets]).unwrap_err().to_string(),
        r#"couldn't parse image name "Bad/Name": invalid reference format: repository name (Name) must be lowercase"#
    );
}

#[test]
fn credentials_are_looked_up_by_the_normalized_repository() {
    let mut ring = Keyring::new();
    let doc = br#"{"auths": {"docker.io/library": {"auth": "dTpw"}, "[::1]:5000": {"auth": "dTpw"}}}"#;
    assert!(ring.add_document(&CredentialSource::File("c".into()), "", ConfigFormat::ConfigJson, doc).is_empty());
    for image in
        ["busybox", "busybox:1.36", "docker.io/busybox", "index.docker.io/library/busybox:v1", "[::1]:5000/app"]
    {
        assert_eq!(credentials_for_image(image, &[&ring]).unwrap().len(), 1, "{image}");
    }
    assert!(credentials_for_image("someone/app", &[&ring]).unwrap().is_empty());
}

#[test]
fn node_search_paths_follow_upstream_order() {
    let paths = NodeCredentials::search_paths(Path::new("/var/lib/kubelet"), Some(Path::new("/root")));
    let shown: Vec<(String, ConfigFormat)> = paths.iter().map(|(p, f)| (p.display().to_string(), *f)).collect();
    assert_eq!(
        shown,
        [
            ("/var/lib/kubelet/config.json".to_owned(), ConfigFormat::ConfigJson),
            ("/root/.docker/config.json".to_owned(), ConfigFormat::ConfigJson),
            ("/.docker/config.json".to_owned(), ConfigFormat::ConfigJson),
            ("/var/lib/kubelet/.dockercfg".to_owned(), ConfigFormat::Dockercfg),
            ("/root/.dockercfg".to_owned(), ConfigFormat::Dockercfg),
            ("/.dockercfg".to_owned(), ConfigFormat::Dockercfg),
        ]
    );
    // No HOME, and a root dir of `/`: no duplicates.
    let paths = NodeCredentials::search_paths(Path::new("/"), None);
    assert_eq!(paths.len(), 3, "{paths:?}");
}

#[test]
fn node_credentials_first_valid_file_wins() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".docker")).unwrap();
    std::fs::create_dir_all(&root).unwrap();
    let search = NodeCredentials::search_paths(&root, Some(&home));

    // Nothing there.
    let (k, found, errors) = NodeCredentials::load(&search);
    assert!(k.is_empty() && found.is_none() && errors.is_empty());

    // Only the legacy file in HOME.
    let legacy = home.join(".dockercfg");
    std::fs::write(&legacy, serde_json::json!({ "r.example": { "auth": b64("legacy:p") } }).to_string()).unwrap();
    let (k, found, _) = NodeCredentials::load(&search);
    assert_eq!(found.as_deref(), Some(legacy.as_path()));
    assert_eq!(users(&k.lookup("r.example/app")), ["legacy"]);
    assert_eq!(k.lookup("r.example/app")[0].source(), &CredentialSource::File(legacy.clone()));

    // A config.json in HOME comes before any .dockercfg.
    let home_json = home.join(".docker/config.json");
    std::fs::write(&home_json, config_json("r.example", "home", "p")).unwrap();
    let (k, found, _) = NodeCredentials::load(&search);
    assert_eq!(found.as_deref(), Some(home_json.as_path()));
    assert_eq!(users(&k.lookup("r.example/app")), ["home"]);

    // The root dir's config.json comes first, but a broken one is passed over.
    let root_json = root.join("config.json");
    std::fs::write(&root_json, "{not json").unwrap();
    let (k, found, errors) = NodeCredentials::load(&search);
    assert_eq!(found.as_deref(), Some(home_json.as_path()));
    assert_eq!(users(&k.lookup("r.example/app")), ["home"]);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].origin, CredentialSource::File(root_json.clone()));
    assert!(errors[0].to_string().contains("document is not valid JSON"), "{}", errors[0]);

    std::fs::write(&root_json, config_json("r.example", "root", "p")).unwrap();
    let (k, found, errors) = NodeCredentials::load(&search);
    assert_eq!(found.as_deref(), Some(root_json.as_path()));
    assert_eq!(users(&k.lookup("r.example/app")), ["root"]);
    assert!(errors.is_empty());
}

#[test]
fn node_credentials_are_cached_for_their_lifetime() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    std::fs::write(&file, config_json("r.example", "v1", "p")).unwrap();
    let node = NodeCredentials::with_search(vec![(file.clone(), ConfigFormat::ConfigJson)], Duration::from_mins(5));
    let t0 = Instant::now();
    assert_eq!(users(&node.keyring_at(t0).lookup("r.example/app")), ["v1"]);

    std::fs::write(&file, config_json("r.example", "v2", "p")).unwrap();
    assert_eq!(users(&node.keyring_at(t0 + Duration::from_mins(4)).lookup("r.example/app")), ["v1"]);
    assert_eq!(users(&node.keyring_at(t0 + Duration::from_mins(5)).lookup("r.example/app")), ["v2"]);

    std::fs::remove_file(&file).unwrap();
    assert!(node.keyring_at(t0 + Duration::from_mins(11)).is_empty());
}

#[test]
fn host_and_port_split_like_go() {
    for (host, want) in [
        ("r.example:5000", ("r.example", "5000")),
        ("r.example", ("r.example", "")),
        ("r.example:", ("r.example", "")),
        ("[::1]:5000", ("::1", "5000")),
        // Go's SplitHostPort fails on these; upstream then uses the whole host, no port.
        ("[::1]", ("[::1]", "")),
        ("a:b:c", ("a:b:c", "")),
        ("[::1]x:5000", ("[::1]x:5000", "")),
    ] {
        assert_eq!(split_host_port(host), want, "{host}");
    }
}
