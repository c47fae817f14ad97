//! Container logs on the node: rotation of the CRI log files.

pub mod rotation;
