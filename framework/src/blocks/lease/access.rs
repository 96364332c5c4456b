//! Reaching etcd securely: TLS (rustls), mutual TLS and etcd users, and naming a
//! refusal as an [`AccessError`].

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use crate::config::Config;
use crate::security::{AccessError, AccessStep, Server, TlsFiles, address_of};

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

/// etcd's refusal of us, as [`error::classify`](super::error::classify) read it
/// (`EtcdFailure::Refused`), named with the server's addresses.
pub(super) fn refusal(cfg_endpoints: &[String], step: AccessStep, detail: String) -> AccessError {
    AccessError {
        server: Server::Etcd,
        address: cfg_endpoints
            .iter()
            .map(|e| address_of(e))
            .collect::<Vec<_>>()
            .join(","),
        step,
        detail,
    }
}

/// A connection etcd closed during the first requests of a session
/// (`EtcdFailure::Closed`): Go's TLS server refuses a missing or untrusted
/// client certificate (TLS 1.3) after the client's side of the handshake, and
/// drops a plaintext client, so the client sees only "connection closed" or
/// "broken pipe". Only used while a session is being established, where a closed
/// connection means exactly that.
pub(super) fn closed_at_connect(cfg: &Config) -> AccessError {
    let detail = if cfg.etcd_tls.is_some() {
        "the server closed the connection after the handshake: it refused the client certificate (missing, expired or not signed by its CA)"
    } else {
        "the server closed the plaintext connection: it requires TLS (https:// endpoints and TLS settings)"
    };
    refusal(&cfg.etcd_endpoints, AccessStep::Tls, detail.into())
}
