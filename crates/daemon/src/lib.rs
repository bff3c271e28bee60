//! The daemon's pieces that are not `main`: the UAPI protocol, its socket listener,
//! background start and the capability drop. A library so that fuzz targets and tests
//! reach the parsers.

pub mod daemonize;
pub mod listener;
pub mod privileges;
pub mod uapi;
