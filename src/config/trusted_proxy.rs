//! `--trusted-proxy`: the reverse proxies whose `X-Forwarded-For` header
//! `serve` believes, as an address or a network.

use std::net::IpAddr;

use super::ConfigError;

/// A reverse proxy (an address, or a network `ADDR/BITS`) whose
/// `X-Forwarded-For` header `serve` believes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrustedProxy {
    net: IpAddr,
    bits: u8,
}

impl TrustedProxy {
    /// `192.0.2.7`, `::1`, `10.0.0.0/8`, `fd00::/8`.
    pub fn parse(text: &str) -> Result<TrustedProxy, ConfigError> {
        let bad = || ConfigError::BadTrustedProxy(text.to_string());
        let text = text.trim();
        let (addr, bits) = match text.split_once('/') {
            Some((a, b)) => (a, Some(b.parse::<u8>().map_err(|_| bad())?)),
            None => (text, None),
        };
        let net = addr
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .map_err(|_| bad())?
            .to_canonical();
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        if bits > max {
            return Err(bad());
        }
        Ok(TrustedProxy { net, bits })
    }

    /// Whether `ip` is this proxy (or in this network).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let keep = |len: u32| match self.bits {
            0 => 0,
            b => u128::MAX << (len - u32::from(b)),
        };
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = keep(32) as u32;
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = keep(128);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}
