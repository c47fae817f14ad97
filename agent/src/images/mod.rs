//! Images (upstream `pkg/kubelet/images` and `pkg/credentialprovider`): registry
//! credentials for pulls through the CRI `ImageService`.

pub mod credentials;
