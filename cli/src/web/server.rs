//! The connections: plain HTTP/1.1 or HTTPS (rustls), at most
//! `--max-connections` at once (the next one is answered 503 and closed), and
//! a client that has not sent a request's headers (or finished the TLS
//! handshake) within `--header-timeout` is cut off.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt;

/// How connections are bounded.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time to send a request's headers (and to finish the TLS handshake).
    pub header_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
}

/// A TLS acceptor for the certificate chain and key in these PEM files.
///
/// # Errors
/// A file that cannot be read, holds no certificate or key, or a key that
/// does not fit.
pub fn tls_acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let certs = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("cannot read the certificate {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("bad certificate PEM in {}", cert.display()))?;
    if certs.is_empty() {
        return Err(anyhow!("no certificate in {}", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read a private key from {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the certificate and key do not fit together")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections until `shutdown` completes.
pub async fn run(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(client = %peer, "connection refused: --max-connections reached");
            tokio::spawn(refuse(tcp, tls.clone(), limits));
            continue;
        };
        let (tls, router) = (tls.clone(), router.clone());
        tokio::spawn(async move {
            let _slot = slot;
            connection(tcp, peer, tls, router, limits).await;
        });
    }
}

/// One connection, plain or TLS, served until it ends.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    router: Router,
    limits: Limits,
) {
    match tls {
        None => http(tcp, peer, router, limits).await,
        Some(acceptor) => {
            match tokio::time::timeout(limits.header_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => http(stream, peer, router, limits).await,
                Ok(Err(e)) => tracing::debug!(client = %peer, error = %e, "TLS handshake"),
                Err(_) => tracing::debug!(client = %peer, "TLS handshake timed out"),
            }
        }
    }
}

async fn http<S>(stream: S, peer: SocketAddr, router: Router, limits: Limits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        router.clone().oneshot(req.map(axum::body::Body::new))
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(client = %peer, error = %e, "connection");
    }
}

/// Answers 503 on a connection beyond the cap, and closes it.
async fn refuse(tcp: TcpStream, tls: Option<TlsAcceptor>, limits: Limits) {
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 25\r\n\
         Connection: close\r\nRetry-After: 1\r\n{}\r\ntoo many open connections",
        super::guard::SECURITY_HEADERS
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect::<String>()
    );
    let wrote = match tls {
        None => write_all(tcp, answer.as_bytes()).await,
        Some(acceptor) => {
            match tokio::time::timeout(limits.header_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => write_all(s, answer.as_bytes()).await,
                _ => Ok(()),
            }
        }
    };
    if let Err(e) = wrote {
        tracing::debug!(error = %e, "refusing a connection");
    }
}

async fn write_all<S: AsyncWrite + Unpin>(mut s: S, bytes: &[u8]) -> std::io::Result<()> {
    s.write_all(bytes).await?;
    s.shutdown().await
}
