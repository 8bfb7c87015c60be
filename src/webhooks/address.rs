//! Which receiver addresses a webhook may not reach without
//! `--allow-local`: this machine (loopback, the unspecified address that
//! connects to it) and its link (link-local, where cloud metadata services
//! answer). Checked at `webhook add` for the host as written (the URL
//! parser has already turned `0x7f000001`, `2130706433` and `127.1` into
//! `127.0.0.1`) and for what its name resolves to, and again at every
//! delivery for the addresses then connected to, so a name that resolves
//! elsewhere later (DNS rebinding) is caught too.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What kind of local address `ip` is, if it is one a webhook may not
/// reach without `--allow-local`.
pub fn local_kind(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.octets()[0] == 0 {
        // 0.0.0.0/8: connecting to it reaches this machine.
        Some("unspecified")
    } else {
        None
    }
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if s[0] & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if s[..6] == [0; 6] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // IPv4-compatible (`::127.0.0.1`) and NAT64 (`64:ff9b::7f00:1`)
        // addresses carry an IPv4 address that may be local.
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        v4_kind(Ipv4Addr::new(a, b, c, d))
    } else {
        None
    }
}

/// Whether `name` is a name for this machine whatever DNS says
/// (`localhost` and `*.localhost`, RFC 6761).
pub fn is_localhost_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_addresses_in_every_form() {
        for (ip, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.200.0.9", "loopback"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::127.0.0.1", "loopback"),
            ("64:ff9b::7f00:1", "loopback"),
            ("169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("::ffff:169.254.0.1", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("::", "unspecified"),
        ] {
            assert_eq!(local_kind(ip.parse().unwrap()), Some(kind), "{ip}");
        }
        for ip in [
            "192.0.2.1",
            "10.0.0.1",
            "2001:db8::1",
            "fec0::1",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(local_kind(ip.parse().unwrap()), None, "{ip}");
        }
        assert!(is_localhost_name("LocalHost."));
        assert!(is_localhost_name("api.localhost"));
        assert!(!is_localhost_name("localhost.example"));
    }
}
