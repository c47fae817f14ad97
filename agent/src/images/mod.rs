//! Images (upstream `pkg/kubelet/images` and `pkg/credentialprovider`): pulls through the
//! CRI `ImageService` as pull policies say ([`puller`]), registry credentials for them
//! ([`credentials`]), and image garbage collection ([`gc`]).

pub mod credentials;
pub mod gc;
pub mod metrics;
pub mod puller;
