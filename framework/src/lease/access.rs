//! Reaching etcd securely: TLS (rustls), mutual TLS and etcd users, and naming a
//! refusal as an [`AccessError`].

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use crate::config::Config;
use crate::security::{
    AccessError, AccessStep, Server, TlsFiles, address_of, error_chain, tls_failure,
};

/// The etcd client options `cfg` asks for: connect timeout, TLS (rustls), user
/// (with automatic token refresh). For tools that talk to the same etcd.
///
/// # Errors
/// A CA, certificate or key file that cannot be read.
pub fn connect_options(cfg: &Config) -> Result<ConnectOptions, AccessError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(cfg.etcd_request_timeout)
        .with_auto_token_refresh(true);
    if let Some(tls) = &cfg.etcd_tls {
        options = options.with_tls(tls_options(cfg, tls)?);
    }
    if let (Some(user), Some(password)) = (&cfg.etcd_user, &cfg.etcd_password) {
        options = options.with_user(user.clone(), password.expose());
    }
    Ok(options)
}

fn tls_options(cfg: &Config, tls: &TlsFiles) -> Result<TlsOptions, AccessError> {
    let address = first_address(cfg);
    let mut options = TlsOptions::new();
    options = match &tls.ca_file {
        Some(ca) => options.ca_certificate(Certificate::from_pem(TlsFiles::read(
            Server::Etcd,
            &address,
            ca,
        )?)),
        None => options.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        let cert = TlsFiles::read(Server::Etcd, &address, cert)?;
        let key = TlsFiles::read(Server::Etcd, &address, key)?;
        options = options.identity(Identity::from_pem(cert, key));
    }
    Ok(options)
}

fn first_address(cfg: &Config) -> String {
    cfg.etcd_endpoints
        .first()
        .map(|e| address_of(e))
        .unwrap_or_default()
}

/// The refusal `e` shows (TLS, a refused user or password, a permission), if any.
pub(crate) fn refusal(cfg_endpoints: &[String], e: &etcd_client::Error) -> Option<AccessError> {
    let text = match e {
        etcd_client::Error::GRpcStatus(s) => format!("{} {s:?}", s.message()),
        etcd_client::Error::TransportError(t) => format!("{} {t:?}", error_chain(t)),
        other => format!("{} {other:?}", error_chain(other)),
    };
    let (step, detail) = classify(&text)?;
    Some(AccessError {
        server: Server::Etcd,
        address: cfg_endpoints
            .iter()
            .map(|e| address_of(e))
            .collect::<Vec<_>>()
            .join(","),
        step,
        detail,
    })
}

/// A connection etcd closed during the first requests of a session: Go's TLS
/// server refuses a missing or untrusted client certificate (TLS 1.3) after the
/// client's side of the handshake, and drops a plaintext client, so the client
/// sees only "connection closed" or "broken pipe". Only used while a session is
/// being established, where a closed connection means exactly that.
pub(crate) fn closed_at_connect(cfg: &Config, e: &etcd_client::Error) -> Option<AccessError> {
    let text = match e {
        etcd_client::Error::GRpcStatus(s) => format!("{} {s:?}", s.message()),
        etcd_client::Error::TransportError(t) => format!("{} {t:?}", error_chain(t)),
        _ => return None,
    };
    const CLOSED: [&str; 3] = ["connection closed", "broken pipe", "connection reset"];
    if !CLOSED.iter().any(|m| text.contains(m)) {
        return None;
    }
    let detail = if cfg.etcd_tls.is_some() {
        "the server closed the connection after the handshake: it refused the client certificate (missing, expired or not signed by its CA)"
    } else {
        "the server closed the plaintext connection: it requires TLS (https:// endpoints and TLS settings)"
    };
    Some(AccessError {
        server: Server::Etcd,
        address: cfg
            .etcd_endpoints
            .iter()
            .map(|e| address_of(e))
            .collect::<Vec<_>>()
            .join(","),
        step: AccessStep::Tls,
        detail: detail.into(),
    })
}

fn classify(text: &str) -> Option<(AccessStep, String)> {
    if let Some(plain) = tls_failure(text) {
        return Some((AccessStep::Tls, plain.to_string()));
    }
    if text.contains("authentication failed") || text.contains("invalid auth token") {
        return Some((AccessStep::Authenticate, "invalid user or password".into()));
    }
    if text.contains("user name is empty") || text.contains("user name not found") {
        return Some((
            AccessStep::Authenticate,
            "etcd authentication is on: set a user".into(),
        ));
    }
    if text.contains("permission denied") {
        return Some((
            AccessStep::Authorize,
            "the user's role does not cover this key".into(),
        ));
    }
    // A plaintext client speaking HTTP/2 to a TLS listener: Go answers with an
    // HTTP/1 400 the client cannot parse as a frame.
    const PLAINTEXT: [&str; 3] = ["frame with invalid size", "invalid HTTP version", "HTTP/1"];
    if PLAINTEXT.iter().any(|m| text.contains(m)) {
        return Some((
            AccessStep::Tls,
            "the server speaks TLS: use https:// endpoints and TLS settings".into(),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_named() {
        let (step, detail) = classify("invalid peer certificate: UnknownIssuer")
            .unwrap_or_else(|| (AccessStep::Authorize, String::new()));
        assert_eq!((step, detail.as_str()), (AccessStep::Tls, "unknown CA"));
        assert!(matches!(
            classify("etcdserver: authentication failed, invalid user ID or password"),
            Some((AccessStep::Authenticate, _))
        ));
        assert!(matches!(
            classify("etcdserver: permission denied"),
            Some((AccessStep::Authorize, _))
        ));
        assert!(classify("tcp connect error").is_none());
    }
}
