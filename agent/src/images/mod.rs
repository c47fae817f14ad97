pub mod gc;
pub mod puller;
