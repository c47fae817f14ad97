//! swiftlet's eBPF sensors: C CO-RE programs (in `bpf/`, compiled by a build script)
//! and their typed Rust side (load, attach, decode events, read maps). The crate knows
//! cgroups and processes, not pods.
//!
//! The programs and loader arrive with the evented PLEG; until then the agent runs the
//! relisting PLEG only. This crate exists now so the workspace has its final shape.
