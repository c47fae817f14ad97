//! Leaf module: the small types and pure functions that many subsystems share.
//!
//! A leaf uses nothing of the crate but other leaves (`cargo xtask layering` checks it in
//! CI; `ARCHITECTURE.md` lists the leaves), so any module may use it without making a
//! cycle, and it can be read and tested alone. What belongs here is plain data and pure
//! functions with one meaning everywhere; what needs a client, a lock or a task does not.
//!
//! | module | what | upstream counterpart |
//! |---|---|---|
//! | [`quantity`] | resource quantities: exact parsing, Go's printing, config-file text | `k8s.io/apimachinery/pkg/api/resource` |
//! | [`pod`] | pod UIDs and full names, config-source annotations, static/mirror/critical pod tests | `pkg/kubelet/types` (`pod_update.go`), `pkg/kubelet/container` (`GetPodFullName`) |
//! | [`pod_resources`] | a pod's effective requests and limits (init, sidecar and app containers, overhead, pod-level resources) | `component-helpers/resource` (`PodRequests`, `PodLimits`) |
//! | [`qos`] | a pod's `QoS` class | `pkg/apis/core/v1/helper/qos` (`GetPodQOS`) |
//! | [`prom_text`] | the Prometheus text format as the Go client writes it: floats, integers, escaping | `prometheus/common/expfmt` |
//! | [`resource_names`] | resource names: `cpu`, `memory`, huge pages, extended resources | `pkg/apis/core/helper` (`IsExtendedResourceName`) |
//! | [`expansion`] | `$(VAR)` expansion in commands, arguments, env values and `subPathExpr` | `third_party/forked/golang/expansion` |
//! | [`io`] | `PathIoError`: a file system call that failed on a path | swiftlet only |
//! | [`clock`] | the monotonic clock the kernel's eBPF timestamps use | swiftlet only |
//! | [`cri_log`] | the CRI log line format and finding a log's last lines | `pkg/kubelet/kuberuntime/logs` (`parseCRILog`, `findTailLineStartIndex`) |
//! | [`duration`] | Go durations (`metav1.Duration`): parsing and printing as Go does | Go's `time.ParseDuration`, `Duration.String` |
//! | [`cpuset`] | sets of CPU ids in the Linux list syntax (`0-3,5`) | `k8s.io/utils/cpuset` |
//! | [`eviction`] | eviction signals, threshold values, the grammar of one eviction setting | `pkg/kubelet/eviction/api`, the statement parsing of `pkg/kubelet/eviction/helpers.go` |
//! | [`collector_endpoint`] | the OTLP collector endpoint (`tracing.endpoint`) and its parsing | component-base `tracing/api/v1` (`validateEndpoint`) |
//! | [`tls`] | TLS cipher suites by their Go names, with IANA code points | component-base `cli/flag` (`ciphersuites_flag.go`) |
//! | [`authorization`] | the values of `authorization.mode` | `kubelet.config.k8s.io` (`KubeletAuthorizationMode*`) |
//!
//! The last six are values of the `KubeletConfiguration` that both the configuration's
//! validation and a subsystem read: here, `config` can check them without using the
//! subsystem.

pub mod authorization;
pub mod clock;
pub mod collector_endpoint;
pub mod cpuset;
pub mod cri_log;
pub mod duration;
pub mod eviction;
pub mod expansion;
pub mod io;
pub mod pod;
pub mod pod_resources;
pub mod prom_text;
pub mod qos;
pub mod quantity;
pub mod resource_names;
pub mod tls;
