//! The DNS questions `doctor` asks, through the shared resolver
//! ([`crate::dns`]: the system's or `--resolver`'s server), and a GET over
//! https to the public listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::dns::fqdn;
pub use crate::dns::Found;

use super::DoctorError;

/// How long one https check may take.
const HTTPS_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Dns {
    resolver: TokioResolver,
}

impl Dns {
    /// The system's resolver, or `server` alone.
    pub fn new(server: Option<SocketAddr>) -> Result<Dns, DoctorError> {
        let resolver = crate::dns::resolver(server).map_err(DoctorError::Resolver)?;
        Ok(Dns { resolver })
    }

    /// The TXT records at `name`, each one's strings joined.
    pub async fn txt(&self, name: &str) -> Found<String> {
        match self.resolver.lookup(fqdn(name), RecordType::TXT).await {
            Ok(lookup) => Found::Records(
                lookup
                    .answers()
                    .iter()
                    .filter_map(|r| match &r.data {
                        RData::TXT(txt) => Some(
                            txt.txt_data
                                .iter()
                                .map(|s| String::from_utf8_lossy(s).into_owned())
                                .collect::<String>(),
                        ),
                        _ => None,
                    })
                    .collect(),
            ),
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => Found::None,
            Err(e) => Found::Error(e.to_string()),
        }
    }

    /// The MX hosts of `name`, by preference.
    pub async fn mx(&self, name: &str) -> Found<String> {
        crate::dns::mx(&self.resolver, name).await.0
    }
}

/// GET `<url>/healthz` over https (certificate checked against the Mozilla
/// roots); the HTTP status when it answers at all.
pub async fn https_answers(url: &url::Url) -> Result<u16, String> {
    match tokio::time::timeout(HTTPS_TIMEOUT, get_healthz(url)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {HTTPS_TIMEOUT:?}")),
    }
}

async fn get_healthz(url: &url::Url) -> Result<u16, String> {
    let host = url.host_str().ok_or("no host")?.to_string();
    let port = url.port_or_known_default().unwrap_or(443);
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .map_err(|e| e.to_string())?;
    let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let path = format!("{}/healthz", url.path().trim_end_matches('/'));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: mailsplit-doctor\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut head = vec![0u8; 64];
    let n = tls.read(&mut head).await.map_err(|e| e.to_string())?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "not an HTTP answer".to_string())
}
