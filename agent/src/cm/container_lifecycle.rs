//! The container manager's hooks into container creation (upstream
//! `InternalContainerLifecycle`): the CPU, memory and device managers amend a container's
//! CRI config before `CreateContainer` (cpuset, NUMA memory nodes, devices, mounts, env),
//! learn its runtime id before `StartContainer`, and forget it once it is removed.
//!
//! [`crate::runtime::RuntimeManager`] calls every registered hook, in registration order.

use std::fmt::Debug;

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, Pod};

/// One manager's part in a container's creation. Every method has a no-op default.
pub trait ContainerLifecycleHook: Send + Sync + Debug {
    /// Amends the CRI config of `container` before `CreateContainer` (upstream
    /// `PreCreateContainer`). An error fails the start with `CreateContainerConfigError`.
    ///
    /// # Errors
    /// A message naming what could not be prepared.
    fn pre_create_container(
        &self,
        _pod: &Pod,
        _container: &Container,
        _config: &mut api::ContainerConfig,
    ) -> Result<(), String> {
        Ok(())
    }

    /// The container exists with `container_id` and is about to start (upstream
    /// `PreStartContainer`). An error fails the start with `RunContainerError`.
    ///
    /// # Errors
    /// A message naming what failed.
    fn pre_start_container(&self, _pod: &Pod, _container: &Container, _container_id: &str) -> Result<(), String> {
        Ok(())
    }

    /// The container `container_id` is being removed (upstream `PostStopContainer`).
    fn post_stop_container(&self, _container_id: &str) {}
}
