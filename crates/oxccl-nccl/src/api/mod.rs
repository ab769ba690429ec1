//! The exported functions, by theme.

pub(crate) mod colls;
pub(crate) mod comms;
pub(crate) mod device;
pub(crate) mod misc;
mod params;
