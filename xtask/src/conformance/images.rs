//! The images the node conformance suite asks for, built here and pushed to the test bed's
//! plain registry under the paths the suite's image manifest
//! (`k8s.io/kubernetes/test/utils/image/manifest.go`) names, with the suite's registries
//! remapped to it by `KUBE_TEST_REPO_LIST` ([`repo_list`]). Nothing is fetched from
//! outside but busybox's source (see [`super::busybox`]).
//!
//! Every image but pause sits on busybox [`super::busybox::VERSION`] built from upstream's
//! source with every applet linked in `/bin` too (as upstream's busybox image; the suite
//! runs `/bin/sysctl`), not on Debian's patched busybox.
//!
//! - `e2e-test-images/agnhost:2.66.1` (and `:2.55`, the suite's "previous" agnhost): the
//!   agnhost binary built from `k8s.io/kubernetes/test/images/agnhost` (static), laid out
//!   as upstream's Dockerfile does: `/agnhost` and the `agnhost-2` link, `/uploads`, the
//!   porter certificate and key, the user and group `user-defined-in-image` (uid 1000)
//!   and `group-defined-in-image` (gid 50000), and `/var/registry` for its
//!   `fake-registry-server` (the private-registry specs pull `pause:testing` from it:
//!   here the test bed's pause program); entrypoint `/agnhost`, command `pause`.
//!   Upstream's image also has curl and bash (the lifecycle-hook tests run `curl` in it,
//!   some probe tests `/bin/bash`); here they are the host's `/usr/bin/curl` and
//!   `/bin/bash` with the libraries `ldd` names, at their host paths (busybox has only
//!   `wget`, and no bash). Likewise OpenBSD's netcat as `/usr/bin/nc` (Debian's
//!   `netcat-openbsd`; the node-to-pod UDP check runs `nc -u`, which busybox's `nc`
//!   lacks), which `sh` finds on `PATH` as alpine's does in upstream's image.
//! - `e2e-test-images/busybox:1.37.0-2`: busybox alone.
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

use super::busybox;
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
const AGNHOST_LAYOUT: &[u8] = b"agnhost layout 3: /usr/bin/nc, upstream busybox, /var/registry";

/// The host programs agnhost carries (apt packages curl and bash).
const HOST_TOOLS: [&str; 2] = ["/usr/bin/curl", "/bin/bash"];

/// The agnhost release the suite's manifest asks for, and its "previous" one.
pub const AGNHOST_TAGS: [&str; 2] = ["2.66.1", "2.55"];

/// What agnhost's `fake-registry-server` serves (upstream's `fakeregistryserver/images.txt`:
/// registry.k8s.io's `pause:3.10.2` as `pause:testing`; here the test bed's pause program).
/// The private-registry specs pull `localhost:5000/pause:testing` from it.
const FAKE_REGISTRY_IMAGE: (&str, &str) = ("pause", "testing");

/// `(registry path:tag, image)` of every image built for the suite.
pub fn build(upstream: &Upstream, workspace: &Path, cache_dir: &Path) -> Result<Vec<(String, BuiltImage)>> {
    fs::create_dir_all(cache_dir).with_context(|| format!("creating {}", cache_dir.display()))?;
    let busybox = busybox::build(cache_dir)?;
    let base = || {
        let mut layer = images::busybox_layer(&busybox.binary, &busybox.applets);
        all_applets_in_bin(&mut layer, &busybox.applets);
        layer
    };
    let agnhost_path = upstream.e2e_bin("agnhost");
    let agnhost = fs::read(&agnhost_path).with_context(|| format!("reading {}", agnhost_path.display()))?;
    let porter = upstream.e2e_module_dir()?.join("test/images/agnhost/porter");
    let cert = fs::read(porter.join("localhost.crt")).context("reading agnhost's porter certificate")?;
    let key = fs::read(porter.join("localhost.key")).context("reading agnhost's porter key")?;
    let tools = HOST_TOOLS.map(images::HostProgram::read);
    let tools: Vec<images::HostProgram> = tools.into_iter().collect::<Result<_>>()?;
    let netcat = images::HostProgram::read(HOST_NETCAT)?;
    let pause_source = fs::read(workspace.join(images::PAUSE_SOURCE)).context("reading the pause source")?;
    // Compiled only when an image that holds it is built (not cached).
    let pause_binary = || images::pause_binary(workspace, cache_dir);

    let mut out = Vec::new();
    for tag in AGNHOST_TAGS {
        let name = format!("e2e-test-images/agnhost:{tag}");
        let mut key_inputs: Vec<&[u8]> = vec![&busybox.binary, &agnhost, &cert, &key, &pause_source];
        key_inputs.extend(tools.iter().flat_map(images::HostProgram::key_inputs));
        key_inputs.extend(netcat.key_inputs());
        key_inputs.push(AGNHOST_LAYOUT);
        let image = images::cached(cache_dir, &name, &images::cache_key(&name, &key_inputs), || {
            let mut layer = base();
            agnhost_files(&mut layer, &agnhost, &cert, &key);
            for tool in &tools {
                tool.add_to(&mut layer);
            }
            netcat.add_to_at(&mut layer, NETCAT_IN_IMAGE);
            let (image, tag) = FAKE_REGISTRY_IMAGE;
            let served = pause_image(&format!("localhost:5000/{image}:{tag}"), &pause_binary()?);
            fake_registry_files(&mut layer, image, tag, &served?);
            images::oci_archive(
                &name,
                &layer,
                &run_config(&name, Some(vec!["/agnhost".into()]), Some(vec!["pause".into()])),
            )
        })?;
        out.push((name, image));
    }
    let name = "e2e-test-images/busybox:1.37.0-2".to_owned();
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &[&busybox.binary, b"all-in-bin"]), || {
        images::oci_archive(&name, &base(), &run_config(&name, None, None))
    })?;
    out.push((name, image));
    let nnp_path = upstream.e2e_bin("nnp");
    let nnp = fs::read(&nnp_path).with_context(|| format!("reading {}", nnp_path.display()))?;
    let name = "e2e-test-images/nonewprivs:1.4".to_owned();
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &[&busybox.binary, &nnp]), || {
        let mut layer = base();
        nonewprivs_files(&mut layer, &nnp);
        images::oci_archive(&name, &layer, &run_config(&name, None, Some(vec!["nnp".into()])))
    })?;
    out.push((name, image));
    let name = "e2e-test-images/nonroot:1.5".to_owned();
    let user = format!("USER {NON_ROOT_USER}");
    let image =
        images::cached(cache_dir, &name, &images::cache_key(&name, &[&busybox.binary, user.as_bytes()]), || {
            images::oci_archive(
                &name,
                &base(),
                &RunConfig { user: NON_ROOT_USER.into(), ..run_config(&name, None, None) },
            )
        })?;
    out.push((name, image));
    // nginx's name on a busybox image (the label makes its id differ from busybox's).
    let name = "e2e-test-images/nginx:1.27.0-2".to_owned();
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &[&busybox.binary]), || {
        images::oci_archive(&name, &base(), &run_config(&name, None, None))
    })?;
    out.push((name, image));
    let hostname = images::HostProgram::read(HOST_HOSTNAME)?;
    let name = "e2e-test-images/glibc-dns-testing:2.1.1".to_owned();
    let mut key_inputs: Vec<&[u8]> = vec![&busybox.binary, NSSWITCH.as_bytes()];
    key_inputs.extend(hostname.key_inputs());
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &key_inputs), || {
        let mut layer = base();
        glibc_files(&mut layer, &hostname);
        images::oci_archive(&name, &layer, &run_config(&name, None, None))
    })?;
    out.push((name, image));
    let name = "pause:3.10.2".to_owned();
    let image = images::cached(cache_dir, &name, &images::cache_key(&name, &[&pause_source]), || {
        images::oci_archive(
            &name,
            &images::pause_layer(&pause_binary()?),
            &run_config(&name, Some(vec!["/pause".into()]), None),
        )
    })?;
    out.push((name, image));
    Ok(out)
}

/// The pause image agnhost's fake registry serves.
fn pause_image(name: &str, pause: &[u8]) -> Result<images::OciBlobs> {
    images::oci_blobs(name, &images::pause_layer(pause), &run_config(name, Some(vec!["/pause".into()]), None))
}

/// Where agnhost's `fake-registry-server` reads images (upstream's Dockerfile copies
/// them there).
const FAKE_REGISTRY_DIR: &str = "var/registry";

/// `image:tag` laid out as `fake-registry-server` reads it (upstream's
/// `prepare_registry.sh`): `<image>/manifests/<tag>` holds the index's digest, the index
/// and manifest are `<image>/manifests/sha256/<2 hex>/<hex>/data`, the config and layer
/// `<image>/blobs/...` alike. Readable by anyone: the registry runs as uid 5123.
fn fake_registry_files(layer: &mut Layer, image: &str, tag: &str, blobs: &images::OciBlobs) {
    let root = format!("{FAKE_REGISTRY_DIR}/{image}");
    let at = |kind: &str, blob: &[u8]| {
        let digest = images::digest(blob);
        let hex = &digest["sha256:".len()..];
        format!("{root}/{kind}/sha256/{}/{hex}/data", &hex[..2])
    };
    layer.file(&format!("{root}/manifests/{tag}"), 0o644, images::digest(&blobs.index));
    for (kind, blob) in
        [("manifests", &blobs.index), ("manifests", &blobs.manifest), ("blobs", &blobs.config), ("blobs", &blobs.layer)]
    {
        layer.file(&at(kind, blob), 0o644, blob.clone());
    }
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
        assert_eq!(seen["bin/sh"], "/bin/busybox", "busybox's sh, which looks PATH up");
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

    /// What `fake-registry-server` does for a pull of `pause:testing`: the tag file names
    /// the index, the index's manifest names the config and the layer, each at the path
    /// the server derives from its digest (`<dir>/sha256/<2 hex>/<hex>/data`).
    #[test]
    fn the_fake_registry_serves_pause_testing_as_agnhost_reads_it() {
        let served = pause_image("localhost:5000/pause:testing", b"pause").unwrap();
        let mut layer = Layer::default();
        fake_registry_files(&mut layer, "pause", "testing", &served);
        let files = layer_files(&layer);
        let read = |kind: &str, digest: &str| {
            let hex = digest.strip_prefix("sha256:").expect(digest);
            let path = format!("var/registry/pause/{kind}/sha256/{}/{hex}/data", &hex[..2]);
            let (is_link, body) = files.get(&path).unwrap_or_else(|| panic!("{path}: {:?}", files.keys()));
            assert!(!is_link);
            assert_eq!(images::digest(body), digest, "{path}");
            body.clone()
        };
        let tag = String::from_utf8(files["var/registry/pause/manifests/testing"].1.clone()).unwrap();
        let index: serde_json::Value = serde_json::from_slice(&read("manifests", tag.trim())).unwrap();
        assert_eq!(index["mediaType"], "application/vnd.oci.image.index.v1+json", "the server's Content-Type");
        assert_eq!(index["manifests"][0]["platform"]["os"], "linux");
        let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap();
        let manifest: serde_json::Value = serde_json::from_slice(&read("manifests", manifest_digest)).unwrap();
        assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
        read("blobs", manifest["config"]["digest"].as_str().unwrap());
        let layer_tar = read("blobs", manifest["layers"][0]["digest"].as_str().unwrap());
        let mut archive = tar::Archive::new(layer_tar.as_slice());
        let paths: Vec<String> =
            archive.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
        assert_eq!(paths, ["pause"]);
        // The registry runs as uid 5123: everything readable by others.
        let tar = layer.to_tar().unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let mode = entry.header().mode().unwrap();
            assert_eq!(mode & 0o004, 0o004, "{}: {mode:o}", entry.path().unwrap().display());
        }
    }

    #[test]
    fn the_suite_registries_point_at_the_test_bed() {
        let list = repo_list("127.0.0.1:5001");
        assert!(list.contains("promoterE2eRegistry: 127.0.0.1:5001/e2e-test-images\n"));
        assert!(list.contains("gcRegistry: 127.0.0.1:5001\n"));
        assert!(!list.contains("invalidRegistry"), "the invalid registry must stay invalid");
        let config = run_config("x", Some(vec!["/agnhost".into()]), Some(vec!["pause".into()]));
        assert_eq!(config.cmd, Some(vec!["pause".to_owned()]));
        assert_eq!(run_config("x", None, None).cmd, Some(vec!["sh".to_owned()]));
    }
}
