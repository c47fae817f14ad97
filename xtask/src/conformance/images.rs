//! The images the node conformance suite asks for, built here and pushed to the test bed's
//! plain registry under the paths the suite's image manifest
//! (`k8s.io/kubernetes/test/utils/image/manifest.go`) names, with the suite's registries
//! remapped to it by `KUBE_TEST_REPO_LIST` ([`repo_list`]). Nothing is fetched from
//! outside.
//!
//! - `e2e-test-images/agnhost:2.66.1` (and `:2.55`, the suite's "previous" agnhost): the
//!   agnhost binary built from `k8s.io/kubernetes/test/images/agnhost` (static), in a
//!   busybox root filesystem as upstream's Dockerfile lays it out: `/agnhost` and the
//!   `agnhost-2` link, `/uploads`, the porter certificate and key, and the user and group
//!   `user-defined-in-image` (uid 1000) and `group-defined-in-image` (gid 50000);
//!   entrypoint `/agnhost`, command `pause`. Upstream's image also has curl and bash (the
//!   lifecycle-hook tests run `curl` in it, some probe tests `/bin/bash`); here they are
//!   the host's `/usr/bin/curl` and `/bin/bash` with the libraries `ldd` names, at their
//!   host paths (busybox has only `wget`, and no bash). Likewise OpenBSD's netcat as
//!   `/usr/bin/nc` (Debian's `netcat-openbsd`; the node-to-pod UDP check runs `nc -u`,
//!   which busybox's `nc` lacks), and `/bin/sh` is bash: Debian's static busybox `sh`
//!   runs its own applets ahead of PATH, so it would never run that `nc`.
//! - `e2e-test-images/busybox:1.37.0-2`: the host's static busybox.
//! - `e2e-test-images/nonewprivs:1.4`: busybox with upstream's `nnp` (built from
//!   `k8s.io/kubernetes/test/images/nonewprivs`, static) set-uid root at
//!   `/usr/local/bin/nnp`, command `nnp` (upstream's base is alpine; the tests only run
//!   `nnp`, which prints its effective uid).
//! - `e2e-test-images/nonroot:1.5`: busybox with `USER 1234` (upstream's base is
//!   Debian's; the tests run `id -u`).
//! - `e2e-test-images/glibc-dns-testing:2.1.1`: busybox with the host's glibc `hostname`
//!   and its libraries, and `hosts: files dns` in `/etc/nsswitch.conf` (upstream's is
//!   Debian with dnsutils and coredns; the hostnameOverride specs, its only users in the
//!   node suite, run `hostname` and `hostname -f`).
//! - `e2e-test-images/nginx:1.27.0-2`: **not nginx**, busybox under nginx's name. The one
//!   node spec that runs it ("back-off timer reset on image update") switches a crashing
//!   busybox container to it keeping busybox's command: it needs another image with a
//!   shell, not a web server. A spec that served HTTP from it would fail.
//! - `pause:3.10.2`: the test bed's pause binary.
//!
//! Images the suite names that are not built here (perl, kitten for image volumes, which
//! containerd 1.6 cannot mount anyway, ...)
//! cannot be pulled: the tests that use them fail on both agents alike.
//!
//! Each image carries the label `io.swiftlet.conformance` so that its image id differs
//! from the test bed's own images of the same content (containerd removes an image by id
//! with all its names; see `images::build_registry_copies`).

use std::{fs, path::Path};

use anyhow::{Context as _, Result};

use crate::{
    images::{self, BuiltImage, Layer, RunConfig},
    upstream::Upstream,
};

/// The suite's UDP checks from a host-network pod run `nc -u` in agnhost; busybox's `nc`
/// has no `-u`. Upstream's agnhost has OpenBSD's netcat (alpine's `netcat-openbsd`); so
/// does this one, Debian's (apt package `netcat-openbsd`), at the same path.
const HOST_NETCAT: &str = "/bin/nc.openbsd";
const NETCAT_IN_IMAGE: &str = "/usr/bin/nc";

/// Part of agnhost's cache key: what [`agnhost_files`] and the build lay out beyond the
/// programs' bytes (change it with the layout).
const AGNHOST_LAYOUT: &[u8] = b"agnhost layout 2: /usr/bin/nc, /bin/sh -> /bin/bash";

/// The host programs agnhost carries (apt packages curl and bash).
const HOST_TOOLS: [&str; 2] = ["/usr/bin/curl", "/bin/bash"];

/// The agnhost release the suite's manifest asks for, and its "previous" one.
pub const AGNHOST_TAGS: [&str; 2] = ["2.66.1", "2.55"];

/// `(registry path:tag, image)` of every image built for the suite.
pub fn build(upstream: &Upstream, workspace: &Path, cache_dir: &Path) -> Result<Vec<(String, BuiltImage)>> {
    fs::create_dir_all(cache_dir).with_context(|| format!("creating {}", cache_dir.display()))?;
    let busybox = images::host_busybox()?;
    let agnhost_path = upstream.e2e_bin("agnhost");
    let agnhost = fs::read(&agnhost_path).with_context(|| format!("reading {}", agnhost_path.display()))?;
    let porter = upstream.e2e_module_dir()?.join("test/images/agnhost/porter");
    let cert = fs::read(porter.join("localhost.crt")).context("reading agnhost's porter certificate")?;
    let key = fs::read(porter.join("localhost.key")).context("reading agnhost's porter key")?;
    let tools = HOST_TOOLS.map(images::HostProgram::read);
    let tools: Vec<images::HostProgram> = tools.into_iter().collect::<Result<_>>()?;
    let netcat = images::HostProgram::read(HOST_NETCAT)?;

    let mut out = Vec::new();
    for tag in AGNHOST_TAGS {
        let name = format!("e2e-test-images/agnhost:{tag}");
        let mut key_inputs: Vec<&[u8]> = vec![&busybox, &agnhost, &cert, &key];
        key_inputs.extend(tools.iter().flat_map(images::HostProgram::key_inputs));
        key_inputs.extend(netcat.key_inputs());
        key_inputs.push(AGNHOST_LAYOUT);
        let image = images::cached(cache_dir, &name, &images::cache_key(&name, &key_inputs), || {
            let mut layer = images::host_busybox_layer(&busybox)?;
            agnhost_files(&mut layer, &agnhost, &cert, &key);
            for tool in &tools {
                tool.add_to(&mut layer);
            }
            netcat.add_to_at(&mut layer, NETCAT_IN_IMAGE);
            // Debian's busybox-static runs its own applets before anything on PATH
            // (`FEATURE_SH_STANDALONE`): its `sh` would run its own `nc`, whatever
            // `/usr/bin/nc` is. bash (upstream's image has it too) looks PATH up, as
            // alpine's `sh` does in upstream's image; called as `sh` it is POSIX.
            layer.symlink("bin/sh", "/bin/bash");
            images::oci_archive(
                &name,
                &layer,
                &run_config(&name, Some(vec!["/agnhost".into()]), Some(vec!["pause".into()])),
            )
        })?;
        out.push((name, image));
    }
    let name = "e2e-test-images/busybox:1.37.0-2".to_owned();
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &[&busybox, b"all-in-bin"]), || {
        let applets = images::host_busybox_applets()?;
        let mut layer = images::busybox_layer(&busybox, &applets);
        all_applets_in_bin(&mut layer, &applets);
        images::oci_archive(&name, &layer, &run_config(&name, None, None))
    })?;
    out.push((name, image));
    let nnp_path = upstream.e2e_bin("nnp");
    let nnp = fs::read(&nnp_path).with_context(|| format!("reading {}", nnp_path.display()))?;
    let name = "e2e-test-images/nonewprivs:1.4".to_owned();
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &[&busybox, &nnp]), || {
        let mut layer = images::host_busybox_layer(&busybox)?;
        nonewprivs_files(&mut layer, &nnp);
        images::oci_archive(&name, &layer, &run_config(&name, None, Some(vec!["nnp".into()])))
    })?;
    out.push((name, image));
    let name = "e2e-test-images/nonroot:1.5".to_owned();
    let user = format!("USER {NON_ROOT_USER}");
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &[&busybox, user.as_bytes()]), || {
        let layer = images::host_busybox_layer(&busybox)?;
        images::oci_archive(&name, &layer, &RunConfig { user: NON_ROOT_USER.into(), ..run_config(&name, None, None) })
    })?;
    out.push((name, image));
    // nginx's name on a busybox image (the label makes its id differ from busybox's).
    let name = "e2e-test-images/nginx:1.27.0-2".to_owned();
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &[&busybox]), || {
        let layer = images::host_busybox_layer(&busybox)?;
        images::oci_archive(&name, &layer, &run_config(&name, None, None))
    })?;
    out.push((name, image));
    let hostname = images::HostProgram::read(HOST_HOSTNAME)?;
    let name = "e2e-test-images/glibc-dns-testing:2.1.1".to_owned();
    let mut key_inputs: Vec<&[u8]> = vec![&busybox, NSSWITCH.as_bytes()];
    key_inputs.extend(hostname.key_inputs());
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &key_inputs), || {
        let mut layer = images::host_busybox_layer(&busybox)?;
        glibc_files(&mut layer, &hostname);
        images::oci_archive(&name, &layer, &run_config(&name, None, None))
    })?;
    out.push((name, image));
    let name = "pause:3.10.2".to_owned();
    let source = fs::read(workspace.join(images::PAUSE_SOURCE)).context("reading the pause source")?;
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &[&source]), || {
        let pause = images::pause_binary(workspace, cache_dir)?;
        images::oci_archive(&name, &images::pause_layer(&pause), &run_config(&name, Some(vec!["/pause".into()]), None))
    })?;
    out.push((name, image));
    Ok(out)
}

/// Upstream's busybox image has every applet in `/bin` (the suite runs `/bin/sysctl`,
/// which Debian's busybox lists under `/sbin`): a `/bin` link for each applet that has
/// none there, beside the links at the listed paths.
fn all_applets_in_bin(layer: &mut Layer, applets: &str) {
    for applet in applets.lines().filter_map(|l| l.trim().rsplit('/').next()).filter(|n| !n.is_empty()) {
        layer.symlink_if_absent(&format!("bin/{applet}"), "/bin/busybox");
    }
}

/// The glibc `hostname` (Debian's essential package `hostname`): `hostname -f` asks
/// glibc's resolver, as in upstream's Debian-based glibc-dns-testing image.
const HOST_HOSTNAME: &str = "/bin/hostname";

/// Debian's host lookup order: without the file glibc asks DNS first and stops at its
/// "not found", never reading `/etc/hosts`.
const NSSWITCH: &str = "hosts: files dns\n";

/// What the hostnameOverride specs need of upstream's glibc-dns-testing image: glibc's
/// `hostname` (over busybox's applet) and its resolver configuration.
fn glibc_files(layer: &mut Layer, hostname: &images::HostProgram) {
    hostname.add_to(layer);
    layer.file("etc/nsswitch.conf", 0o644, NSSWITCH);
}

/// The user of upstream's nonroot image (`USER 1234`).
const NON_ROOT_USER: &str = "1234";

/// What upstream's nonewprivs Dockerfile adds: `nnp`, set-uid (owned by root).
fn nonewprivs_files(layer: &mut Layer, nnp: &[u8]) {
    layer.file("usr/local/bin/nnp", 0o4755, nnp);
}

/// What upstream's agnhost Dockerfile adds to its base image.
fn agnhost_files(layer: &mut Layer, agnhost: &[u8], cert: &[u8], key: &[u8]) {
    layer
        .file("agnhost", 0o755, agnhost)
        .symlink("agnhost-2", "agnhost")
        .dir("uploads", 0o755)
        .file("localhost.crt", 0o644, cert)
        .file("localhost.key", 0o600, key)
        .file(
            "etc/passwd",
            0o644,
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n\
             user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n",
        )
        .file(
            "etc/group",
            0o644,
            "root:x:0:\nnobody:x:65534:\nuser-defined-in-image:x:1000:\n\
             group-defined-in-image:x:50000:user-defined-in-image\n",
        )
        .dir("home/user-defined-in-image", 0o755);
}

fn run_config(name: &str, entrypoint: Option<Vec<String>>, cmd: Option<Vec<String>>) -> RunConfig {
    RunConfig {
        env: vec![images::DEFAULT_PATH.into()],
        cmd: if entrypoint.is_none() && cmd.is_none() { Some(vec!["sh".into()]) } else { cmd },
        entrypoint,
        working_dir: "/".into(),
        labels: [("io.swiftlet.conformance".to_owned(), name.to_owned())].into(),
        user: String::new(),
    }
}

/// The `KUBE_TEST_REPO_LIST` file: every registry of the suite's manifest that an image
/// built here lives under, mapped to the plain registry at `endpoint`. The invalid and
/// the private registries keep their defaults (tests expect those pulls to fail).
pub fn repo_list(endpoint: &str) -> String {
    format!(
        "promoterE2eRegistry: {endpoint}/e2e-test-images\ngcRegistry: {endpoint}\ngcEtcdRegistry: {endpoint}\n\
         dockerLibraryRegistry: {endpoint}/library\nbuildImageRegistry: {endpoint}/build-image\n\
         sigStorageRegistry: {endpoint}/sig-storage\ncloudProviderGcpRegistry: {endpoint}/cloud-provider-gcp\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agnhost layer has what the suite's tests look for in the image.
    #[test]
    fn busybox_has_every_applet_in_bin_too() {
        let applets = "/bin/sh\n/sbin/sysctl\n/usr/bin/env\n";
        let mut layer = images::busybox_layer(b"busybox", applets);
        all_applets_in_bin(&mut layer, applets);
        let tar = layer.to_tar().unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let links: std::collections::BTreeSet<String> = archive
            .entries()
            .unwrap()
            .filter_map(|e| {
                let e = e.unwrap();
                e.link_name().unwrap().map(|_| e.path().unwrap().display().to_string())
            })
            .collect();
        for path in ["bin/sh", "bin/sysctl", "bin/env", "sbin/sysctl", "usr/bin/env"] {
            assert!(links.contains(path), "{path}: {links:?}");
        }
    }

    /// Path → (is a link, contents) of every entry of `layer`'s tar.
    fn layer_files(layer: &Layer) -> std::collections::BTreeMap<String, (bool, Vec<u8>)> {
        let tar = layer.to_tar().unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut files = std::collections::BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let is_link = entry.link_name().unwrap().is_some();
            let mut body = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut body).unwrap();
            files.insert(path, (is_link, body));
        }
        files
    }

    /// OpenBSD's netcat is agnhost's `nc` (the UDP checks need `-u`), ahead of busybox's
    /// applet on the image's PATH.
    #[test]
    fn agnhost_nc_is_openbsd_netcat() {
        let mut layer = images::busybox_layer(b"busybox", "/bin/sh\n/bin/nc\n");
        images::HostProgram::read(HOST_NETCAT).unwrap().add_to_at(&mut layer, NETCAT_IN_IMAGE);
        let files = layer_files(&layer);
        assert_eq!(files["usr/bin/nc"].1, std::fs::read(HOST_NETCAT).unwrap());
        assert!(!files.contains_key("bin/nc.openbsd"), "only at the image's path");
        assert!(files.keys().any(|p| p.contains("libbsd.so")), "{:?}", files.keys());
        let path = images::DEFAULT_PATH.trim_start_matches("PATH=");
        let dirs: Vec<&str> = path.split(':').collect();
        let pos = |d: &str| dirs.iter().position(|x| *x == d).unwrap();
        assert!(pos("/usr/bin") < pos("/bin"), "{path}");
    }

    #[test]
    fn agnhost_is_laid_out_as_upstream_builds_it() {
        let mut layer = images::busybox_layer(b"busybox", "/bin/sh\n/bin/ls\n");
        agnhost_files(&mut layer, b"agnhost", b"crt", b"key");
        let tar = layer.to_tar().unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut seen = std::collections::BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string().trim_end_matches('/').to_owned();
            let link = entry.link_name().unwrap().map(|l| l.display().to_string());
            let mut body = String::new();
            std::io::Read::read_to_string(&mut entry, &mut body).unwrap();
            seen.insert(path, link.unwrap_or(body));
        }
        assert_eq!(seen["agnhost"], "agnhost");
        assert_eq!(seen["agnhost-2"], "agnhost");
        assert!(seen.contains_key("uploads"));
        assert_eq!(seen["localhost.crt"], "crt");
        assert!(seen["etc/passwd"].contains("user-defined-in-image:x:1000:"));
        assert!(seen["etc/group"].contains("group-defined-in-image:x:50000:user-defined-in-image"));
        assert_eq!(seen["bin/sh"], "/bin/busybox");
    }

    /// `nnp` must keep its set-uid bit: the suite checks that it runs as root unless
    /// privilege escalation is off.
    #[test]
    fn nnp_is_set_uid_root() {
        let mut layer = images::busybox_layer(b"busybox", "/bin/sh\n");
        nonewprivs_files(&mut layer, b"nnp");
        let tar = layer.to_tar().unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let entry = archive
            .entries()
            .unwrap()
            .map(Result::unwrap)
            .find(|e| e.path().unwrap().display().to_string() == "usr/local/bin/nnp")
            .expect("nnp in the layer");
        let header = entry.header();
        assert_eq!((header.mode().unwrap(), header.uid().unwrap()), (0o4755, 0));
        let config = RunConfig { user: NON_ROOT_USER.into(), ..run_config("x", None, None) };
        assert_eq!(serde_json::to_value(&config).unwrap()["User"], "1234");
        assert!(serde_json::to_value(run_config("x", None, None)).unwrap().get("User").is_none());
    }

    /// glibc's `hostname` replaces busybox's applet, with its loader and libc, and the
    /// resolver reads `/etc/hosts` first.
    #[test]
    fn glibc_dns_testing_has_glibc_hostname_over_busybox() {
        let mut layer = images::busybox_layer(b"busybox", "/bin/sh\n/bin/hostname\n");
        glibc_files(&mut layer, &images::HostProgram::read(HOST_HOSTNAME).unwrap());
        let files = layer_files(&layer);
        let (is_link, body) = &files["bin/hostname"];
        assert!(!is_link && body.starts_with(b"\x7fELF"), "the host's binary, not busybox's link");
        assert!(files.keys().any(|p| p.contains("libc.so")), "{:?}", files.keys());
        assert_eq!(files["etc/nsswitch.conf"].1, b"hosts: files dns\n");
        assert!(files["bin/sh"].0, "busybox's sh stays");
    }

    #[test]
    fn the_suite_registries_point_at_the_test_bed() {
        let list = repo_list("127.0.0.1:5000");
        assert!(list.contains("promoterE2eRegistry: 127.0.0.1:5000/e2e-test-images\n"));
        assert!(list.contains("gcRegistry: 127.0.0.1:5000\n"));
        assert!(!list.contains("invalidRegistry"), "the invalid registry must stay invalid");
        let config = run_config("x", Some(vec!["/agnhost".into()]), Some(vec!["pause".into()]));
        assert_eq!(config.cmd, Some(vec!["pause".to_owned()]));
        assert_eq!(run_config("x", None, None).cmd, Some(vec!["sh".to_owned()]));
    }
}
