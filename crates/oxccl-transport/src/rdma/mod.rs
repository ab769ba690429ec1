//! RDMA verbs transport (being written).

#[cfg(any())]
pub mod env;
#[cfg(any())]
pub mod ibv;
pub mod soft;
pub mod verbs;
