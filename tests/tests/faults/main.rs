//! The fault matrix (README "The fault matrix"): faults inflicted on a running node and
//! what must hold through them. One test binary, one module per fault; every test takes
//! the test bed lock, as all end-to-end tests do.

mod churn;
mod containerd_restart;
mod ring_buffer;
