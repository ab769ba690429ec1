//! The exported functions, by theme.

pub(crate) mod colls;
pub(crate) mod comms;
mod misc;
mod params;
