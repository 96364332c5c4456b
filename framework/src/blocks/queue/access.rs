//! Reaching NATS securely: TLS (rustls), mutual TLS, and user/password, token,
//! `.creds` file or nkey; naming a refusal as an [`AccessError`].

use async_nats::{ConnectError, ConnectErrorKind, ConnectOptions};

use crate::config::Config;
use crate::security::{
    AccessError, AccessStep, NatsAuth, Server, TlsFiles, address_of, error_chain, tls_failure,
};

/// `options` with the TLS and credentials `cfg` asks for.
///
/// # Errors
/// A `.creds` file that cannot be read or parsed.
pub(crate) async fn secure(
    cfg: &Config,
    mut options: ConnectOptions,
) -> Result<ConnectOptions, AccessError> {
    if let Some(tls) = &cfg.nats_tls {
        options = with_tls(options, tls);
    }
    Ok(match &cfg.nats_auth {
        NatsAuth::None => options,
        NatsAuth::UserPassword { user, password } => {
            options.user_and_password(user.clone(), password.expose().to_string())
        }
        NatsAuth::Token(token) => options.token(token.expose().to_string()),
        NatsAuth::NKey(seed) => options.nkey(seed.expose().to_string()),
        NatsAuth::CredsFile(path) => {
            options
                .credentials_file(path)
                .await
                .map_err(|e| AccessError {
                    server: Server::Nats,
                    address: address_of(&cfg.nats_url),
                    step: AccessStep::ReadCredentials,
                    detail: format!("{}: {e}", path.display()),
                })?
        }
    })
}

fn with_tls(mut options: ConnectOptions, tls: &TlsFiles) -> ConnectOptions {
    options = options.require_tls(true);
    if let Some(ca) = &tls.ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    options
}

/// The refusal `e` shows (TLS, credentials), if any.
pub(crate) fn refusal(cfg: &Config, e: &ConnectError) -> Option<AccessError> {
    let text = format!("{} {e:?}", error_chain(e));
    let (step, detail) = match e.kind() {
        ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => (
            AccessStep::Authenticate,
            "credentials refused (authorization violation)".to_string(),
        ),
        ConnectErrorKind::Tls => (
            AccessStep::Tls,
            tls_failure(&text).map_or_else(|| error_chain(e), str::to_string),
        ),
        _ => (AccessStep::Tls, tls_failure(&text)?.to_string()),
    };
    let detail = match (step, &cfg.nats_tls) {
        (AccessStep::Tls, None) => {
            format!("the server requires TLS and no NATS TLS settings are given ({detail})")
        }
        _ => detail,
    };
    Some(AccessError {
        server: Server::Nats,
        address: address_of(&cfg.nats_url),
        step,
        detail,
    })
}
