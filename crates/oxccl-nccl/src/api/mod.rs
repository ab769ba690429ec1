//! The exported functions, by theme.

mod colls;
mod comms;
mod misc;
mod params;
