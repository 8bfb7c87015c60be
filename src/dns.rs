//! The DNS resolver `doctor` and the workers' MX rollup share:
//! hickory-resolver on the system's resolvers (`/etc/resolv.conf`) or on
//! one server the user names (`--resolver HOST:PORT`), and the MX
//! question both ask. Imports nothing of the crate.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;

/// What a lookup found: records, none (NXDOMAIN or no data), or an error
/// that says nothing either way (timeout, SERVFAIL).
pub enum Found<T> {
    Records(Vec<T>),
    None,
    Error(String),
}

/// Build a resolver on the system's servers, or on `server` alone; the
/// error is the resolver's own words.
pub fn resolver(server: Option<SocketAddr>) -> Result<TokioResolver, String> {
    let provider = TokioRuntimeProvider::default();
    let builder = match server {
        Some(addr) => {
            let mut udp = ConnectionConfig::udp();
            udp.port = addr.port();
            let mut tcp = ConnectionConfig::tcp();
            tcp.port = addr.port();
            let ns = NameServerConfig::new(addr.ip(), true, vec![udp, tcp]);
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![ns]),
                provider,
            )
        }
        None => TokioResolver::builder(provider).map_err(|e| e.to_string())?,
    };
    builder.build().map_err(|e| e.to_string())
}

/// The MX hosts of `name` by preference (lower case, no trailing dot),
/// and until when the answer may be kept (its TTL).
pub async fn mx(resolver: &TokioResolver, name: &str) -> (Found<String>, Option<Instant>) {
    match resolver.lookup(fqdn(name), RecordType::MX).await {
        Ok(lookup) => {
            let mut hosts: Vec<(u16, String)> = lookup
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::MX(mx) => Some((
                        mx.preference,
                        mx.exchange
                            .to_ascii()
                            .trim_end_matches('.')
                            .to_ascii_lowercase(),
                    )),
                    _ => None,
                })
                .collect();
            hosts.sort();
            let until = lookup.valid_until();
            let found = Found::Records(hosts.into_iter().map(|(_, h)| h).collect());
            (
                found,
                Some(until.max(Instant::now() + Duration::from_secs(1))),
            )
        }
        Err(e) if e.is_no_records_found() || e.is_nx_domain() => (Found::None, None),
        Err(e) => (Found::Error(e.to_string()), None),
    }
}

/// An absolute name: no search domains appended.
pub fn fqdn(name: &str) -> String {
    format!("{}.", name.trim_end_matches('.'))
}
