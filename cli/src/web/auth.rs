//! Who may read and who may act.
//!
//! Without tokens the view is open to read and refuses actions. With an
//! operator token (and optionally a read token), a login form (or an
//! `Authorization: Bearer` header on `POST /login`) opens a session: an
//! `HttpOnly`, `SameSite=Strict` cookie (`Secure` under TLS) that expires
//! after the session TTL, checked on every use. Actions are POSTs of an
//! operator's session carrying its CSRF token. Wrong tokens are counted per
//! client address: after [`FREE_FAILURES`] the address is locked out for a
//! delay that doubles with each further failure.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use rand::RngCore;
use tenure::security::Secret;

/// The session cookie's name.
pub const COOKIE: &str = "tenure_session";

/// Sessions kept at most; the oldest half is dropped beyond this.
const MAX_SESSIONS: usize = 256;

/// Client addresses whose failures are remembered at most.
const MAX_TRACKED: usize = 4096;

/// Shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 12;

/// Wrong logins from one address before it is locked out.
pub const FREE_FAILURES: u32 = 5;

/// The first lockout; each further failure doubles it, up to [`MAX_LOCKOUT`].
const FIRST_LOCKOUT: Duration = Duration::from_secs(30);
const MAX_LOCKOUT: Duration = Duration::from_secs(900);

/// What a session may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Logged in with the read token: pages only.
    Reader,
    /// Logged in with the operator token: pages and actions.
    Operator,
}

#[derive(Debug)]
struct Session {
    id: String,
    csrf: String,
    role: Role,
    expires: Instant,
    /// What the last action did, shown once by the page it redirected to.
    flash: Option<String>,
}

#[derive(Debug, Default)]
struct Failures {
    count: u32,
    locked_until: Option<Instant>,
}

/// The tokens, the open sessions and the failed logins per address.
#[derive(Debug)]
pub struct Auth {
    operator: Option<Secret>,
    reader: Option<Secret>,
    ttl: Duration,
    sessions: Mutex<Vec<Session>>,
    failures: Mutex<HashMap<IpAddr, Failures>>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The server runs read-only (no operator token).
    #[error(
        "this server is read-only: start it with --operator-token-file or TENURE_OPERATOR_TOKEN to allow actions"
    )]
    ReadOnly,
    /// No valid session cookie (none, unknown or expired).
    #[error("log in with the operator token first")]
    NotLoggedIn,
    /// A reader's session asked for an action.
    #[error("this session may only read: log in with the operator token to act")]
    ReaderOnly,
    /// The CSRF token is missing or does not match the session's.
    #[error("missing or wrong CSRF token: reload the page and try again")]
    BadCsrf,
    /// The token given at login is wrong.
    #[error("wrong token")]
    WrongToken,
    /// Too many wrong logins from this address: try again after this long.
    #[error("too many failed logins from this address: try again in {} s", .0.as_secs().max(1))]
    LockedOut(Duration),
}

/// 32 random bytes as hex.
pub fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equality whose time does not depend on where the inputs first differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn matches(token: Option<&Secret>, given: &str) -> bool {
    token.is_some_and(|t| constant_time_eq(given.as_bytes(), t.expose().as_bytes()))
}

impl Auth {
    /// The tokens (each optional) and how long a session lives.
    pub fn new(operator: Option<Secret>, reader: Option<Secret>, ttl: Duration) -> Self {
        Auth {
            operator,
            reader,
            ttl,
            sessions: Mutex::new(Vec::new()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Actions are possible (an operator token is set).
    pub fn operator_mode(&self) -> bool {
        self.operator.is_some()
    }

    /// Reading needs a token or a session (a read token is set).
    pub fn reads_need_token(&self) -> bool {
        self.reader.is_some()
    }

    /// A session's lifetime.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The role `given` opens, if it is one of the tokens.
    fn role_of(&self, given: &str) -> Option<Role> {
        // Both compared, so the time does not tell which one matched.
        let operator = matches(self.operator.as_ref(), given);
        let reader = matches(self.reader.as_ref(), given);
        if operator {
            Some(Role::Operator)
        } else if reader {
            Some(Role::Reader)
        } else {
            None
        }
    }

    /// Opens a session for `given` from `client`: (session id, CSRF token).
    /// A locked-out address is refused before the token is looked at.
    pub fn login(&self, client: IpAddr, given: &str) -> Result<(String, String), Refused> {
        let now = Instant::now();
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(until) = failures.get(&client).and_then(|f| f.locked_until)
            && until > now
        {
            return Err(Refused::LockedOut(until - now));
        }
        let Some(role) = self.role_of(given) else {
            if failures.len() >= MAX_TRACKED && !failures.contains_key(&client) {
                failures.retain(|_, f| f.locked_until.is_some_and(|u| u > now));
            }
            let f = failures.entry(client).or_default();
            f.count = f.count.saturating_add(1);
            if f.count >= FREE_FAILURES {
                let doublings = (f.count - FREE_FAILURES).min(5);
                let delay = (FIRST_LOCKOUT * 2u32.pow(doublings)).min(MAX_LOCKOUT);
                f.locked_until = Some(now + delay);
            }
            tracing::warn!(client = %client, failures = f.count, "failed login");
            return Err(Refused::WrongToken);
        };
        failures.remove(&client);
        drop(failures);
        let (id, csrf) = (random_hex(), random_hex());
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS {
            sessions.drain(..MAX_SESSIONS / 2);
        }
        sessions.push(Session {
            id: id.clone(),
            csrf: csrf.clone(),
            role,
            expires: now + self.ttl,
            flash: None,
        });
        tracing::info!(client = %client, ?role, "login");
        Ok((id, csrf))
    }

    /// Runs `f` on the live session of `headers`' cookie; an expired one is dropped.
    fn with_session<T>(&self, headers: &HeaderMap, f: impl FnOnce(&mut Session) -> T) -> Option<T> {
        let id = session_cookie(headers)?;
        let now = Instant::now();
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|s| s.expires > now);
        sessions
            .iter_mut()
            .find(|s| constant_time_eq(s.id.as_bytes(), id.as_bytes()))
            .map(f)
    }

    /// Ends the session of `headers`' cookie.
    pub fn logout(&self, headers: &HeaderMap) {
        if let Some(id) = session_cookie(headers) {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            sessions.retain(|s| !constant_time_eq(s.id.as_bytes(), id.as_bytes()));
        }
    }

    /// The role of `headers`' live session, if any.
    pub fn role_of_session(&self, headers: &HeaderMap) -> Option<Role> {
        self.with_session(headers, |s| s.role)
    }

    /// May read: no read token is set, or a live session, or a bearer token.
    pub fn may_read(&self, headers: &HeaderMap) -> bool {
        !self.reads_need_token()
            || self.role_of_session(headers).is_some()
            || bearer(headers).is_some_and(|t| self.role_of(&t).is_some())
    }

    /// The CSRF token of `headers`' operator session, if it is one.
    pub fn csrf_of(&self, headers: &HeaderMap) -> Option<String> {
        self.with_session(headers, |s| {
            (s.role == Role::Operator).then(|| s.csrf.clone())
        })
        .flatten()
    }

    /// Allows an action: operator mode, a live operator session and its CSRF token.
    pub fn allow(&self, headers: &HeaderMap, csrf: Option<&str>) -> Result<(), Refused> {
        if !self.operator_mode() {
            return Err(Refused::ReadOnly);
        }
        let (role, expected) = self
            .with_session(headers, |s| (s.role, s.csrf.clone()))
            .ok_or(Refused::NotLoggedIn)?;
        if role != Role::Operator {
            return Err(Refused::ReaderOnly);
        }
        match csrf {
            Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(()),
            _ => Err(Refused::BadCsrf),
        }
    }

    /// Keeps `note` in `headers`' session, for the next page it loads.
    pub fn set_flash(&self, headers: &HeaderMap, note: String) {
        self.with_session(headers, |s| s.flash = Some(note));
    }

    /// The session's flash message, once.
    pub fn take_flash(&self, headers: &HeaderMap) -> Option<String> {
        self.with_session(headers, |s| s.flash.take()).flatten()
    }
}

/// The session id in the `Cookie` header.
fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::COOKIE,
            format!("a=b; {COOKIE}={id}")
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        h
    }

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn auth() -> Auth {
        Auth::new(
            Some(Secret::new("correct horse battery")),
            Some(Secret::new("reader reader reader")),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn actions_need_an_operator_session_and_its_csrf_token() {
        let auth = auth();
        assert_eq!(auth.login(HERE, "wrong"), Err(Refused::WrongToken));
        let Ok((id, csrf)) = auth.login(HERE, "correct horse battery") else {
            unreachable!()
        };
        assert_eq!(
            auth.allow(&HeaderMap::new(), Some(&csrf)),
            Err(Refused::NotLoggedIn)
        );
        assert_eq!(auth.allow(&with_cookie(&id), None), Err(Refused::BadCsrf));
        assert_eq!(
            auth.allow(&with_cookie(&id), Some("x")),
            Err(Refused::BadCsrf)
        );
        assert_eq!(auth.allow(&with_cookie(&id), Some(&csrf)), Ok(()));
        auth.logout(&with_cookie(&id));
        assert_eq!(
            auth.allow(&with_cookie(&id), Some(&csrf)),
            Err(Refused::NotLoggedIn)
        );
        let Ok((id, csrf)) = auth.login(HERE, "reader reader reader") else {
            unreachable!()
        };
        assert!(auth.may_read(&with_cookie(&id)));
        assert_eq!(
            auth.allow(&with_cookie(&id), Some(&csrf)),
            Err(Refused::ReaderOnly)
        );
    }

    #[test]
    fn repeated_failures_lock_the_address_out() {
        let auth = auth();
        for _ in 0..FREE_FAILURES {
            assert_eq!(auth.login(HERE, "wrong"), Err(Refused::WrongToken));
        }
        assert!(matches!(
            auth.login(HERE, "correct horse battery"),
            Err(Refused::LockedOut(_))
        ));
        let elsewhere = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
        assert!(auth.login(elsewhere, "correct horse battery").is_ok());
    }
}
