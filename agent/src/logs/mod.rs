//! Container logs on the node: rotation of the CRI log files, and reading them for
//! `/containerLogs`.

pub mod reader;
pub mod rotation;
