//! The daemon's pieces that are not `main`: the UAPI protocol, its socket listener and
//! background start. A library so that fuzz targets and tests reach the parsers.

pub mod daemonize;
pub mod listener;
pub mod uapi;
