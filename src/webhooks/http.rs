//! One POST to a receiver: a fresh HTTP/1.1 connection (TLS by rustls with
//! the Mozilla roots for https), bounded as a whole by a timeout. A batch
//! of up to [`super::BATCH`] events per connection makes pooling not worth
//! its state.

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HOST, USER_AGENT};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Why a POST did not reach a 2xx answer: each is worth another try.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with {host} failed: {source}")]
    Tls {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("bad TLS server name {0:?}")]
    ServerName(String),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("cannot build the request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("the receiver answered HTTP {0}")]
    Status(u16),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} resolves to {addr}, a {kind} address (this machine or its link): not delivered; if the receiver runs here on purpose, add the webhook again with --allow-local")]
    Local {
        host: String,
        addr: std::net::IpAddr,
        kind: &'static str,
    },
}

/// rustls with the Mozilla root certificates, built once.
static TLS: LazyLock<Option<Arc<rustls::ClientConfig>>> = LazyLock::new(|| {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Some(Arc::new(config))
});

/// POST `body` (JSON) to `url` with the signature header; Ok on 2xx.
/// Unless `allow_local`, a host that resolves to a local address (see
/// [`super::address`]) is refused before any connection.
pub async fn post(
    url: &url::Url,
    signature: &str,
    body: Bytes,
    timeout: Duration,
    allow_local: bool,
) -> Result<(), PostError> {
    let sent = post_now(url, signature, body, allow_local);
    match tokio::time::timeout(timeout, sent).await {
        Ok(result) => result,
        Err(_) => Err(PostError::Timeout(timeout)),
    }
}

/// The addresses `host` resolves to now, every one of them checked: the
/// connection goes to these, never to a second lookup's answer.
async fn resolve(host: &str, port: u16, allow_local: bool) -> Result<Vec<SocketAddr>, PostError> {
    let name = host.trim_matches(['[', ']']);
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
        .await
        .map_err(|source| PostError::Resolve {
            host: host.to_string(),
            source,
        })?
        .collect();
    if !allow_local {
        let local = addrs
            .iter()
            .find_map(|a| super::address::local_kind(a.ip()).map(|kind| (a.ip(), kind)));
        if let Some((addr, kind)) = local {
            return Err(PostError::Local {
                host: host.to_string(),
                addr,
                kind,
            });
        }
    }
    Ok(addrs)
}

async fn post_now(
    url: &url::Url,
    signature: &str,
    body: Bytes,
    allow_local: bool,
) -> Result<(), PostError> {
    let host = url.host_str().unwrap_or_default().to_string();
    let port = url.port_or_known_default().unwrap_or(80);
    let addrs = resolve(&host, port, allow_local).await?;
    let tcp = TcpStream::connect(&addrs[..])
        .await
        .map_err(|source| PostError::Connect {
            addr: format!("{host}:{port}"),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    let host_header = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.clone(),
    };
    let target = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let request = Request::post(target)
        .header(HOST, host_header)
        .header(CONTENT_TYPE, "application/json")
        .header(USER_AGENT, concat!("mailsplit/", env!("CARGO_PKG_VERSION")))
        .header(super::SIGNATURE_HEADER, signature)
        .body(Full::new(body))?;
    let status = if url.scheme() == "https" {
        let config = TLS
            .clone()
            .ok_or_else(|| PostError::ServerName(host.clone()))?;
        let name =
            rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                .map_err(|_| PostError::ServerName(host.clone()))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|source| PostError::Tls { host, source })?;
        exchange(tls, request).await?
    } else {
        exchange(tcp, request).await?
    };
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(PostError::Status(status))
    }
}

/// Send one request on a new connection and read the whole answer; its
/// status code.
async fn exchange<S>(stream: S, request: Request<Full<Bytes>>) -> Result<u16, PostError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(conn);
    let result = async {
        let response = sender.send_request(request).await?;
        // The answer's body is not read: the connection closes here.
        Ok::<_, PostError>(response.status().as_u16())
    }
    .await;
    driver.abort();
    result
}
