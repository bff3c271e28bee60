//! The daemon's pieces that are not `main`: the UAPI protocol, its socket listener,
//! background start and the capability drop. A library so that fuzz targets and tests
//! reach the parsers.

pub mod daemonize;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod places;
pub mod pool;
pub mod privileges;
pub mod supervisor;
pub mod timed;
pub mod uapi;

/// Checks an interface name: 1 to 15 printable characters, no '/', ':' or '%', not `.`
/// or `..` (what the kernel accepts, less what a file name cannot hold).
///
/// '%' is refused too: the kernel reads a name with '%d' in it as a template and makes
/// up the number, so the device would not be called what its UAPI socket is, and each
/// extra TUN queue opened by the same name would make yet another device.
pub fn parse_ifname(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() < 16
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':' && b != b'%');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "'{s}' is not a valid interface name (1-15 printable characters, no '/', ':' or '%')"
        ))
    }
}
