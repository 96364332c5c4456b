//! Who may act: read-only without an operator token; with one, a login form
//! (or an `Authorization: Bearer` header on `POST /login`) opens a session
//! (an `HttpOnly`, `SameSite=Strict` cookie), and every action is a POST
//! carrying that session's CSRF token.

use std::sync::Mutex;

use axum::http::HeaderMap;
use rand::RngCore;
use tenure::security::Secret;

/// The session cookie's name.
pub const COOKIE: &str = "tenure_session";

/// Sessions kept at most; the oldest half is dropped beyond this.
const MAX_SESSIONS: usize = 256;

/// Shortest operator token accepted.
pub const MIN_TOKEN_LEN: usize = 12;

/// The operator token and the open sessions (session id -> CSRF token).
#[derive(Debug)]
pub struct Auth {
    token: Secret,
    sessions: Mutex<Vec<(String, String)>>,
}

/// Why an action was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The server runs read-only (no operator token).
    #[error("this server is read-only: start it with --operator-token to allow actions")]
    ReadOnly,
    /// No valid session cookie.
    #[error("log in with the operator token first")]
    NotLoggedIn,
    /// The CSRF token is missing or does not match the session's.
    #[error("missing or wrong CSRF token: reload the page and try again")]
    BadCsrf,
    /// The token given at login is wrong.
    #[error("wrong operator token")]
    WrongToken,
}

/// 32 random bytes as hex.
fn random_hex() -> String {
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

impl Auth {
    pub fn new(token: Secret) -> Self {
        Auth {
            token,
            sessions: Mutex::new(Vec::new()),
        }
    }

    /// Opens a session for `given` if it is the operator token: (session id, CSRF token).
    pub fn login(&self, given: &str) -> Result<(String, String), Refused> {
        if !constant_time_eq(given.as_bytes(), self.token.expose().as_bytes()) {
            return Err(Refused::WrongToken);
        }
        let (id, csrf) = (random_hex(), random_hex());
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if sessions.len() >= MAX_SESSIONS {
            sessions.drain(..MAX_SESSIONS / 2);
        }
        sessions.push((id.clone(), csrf.clone()));
        Ok((id, csrf))
    }

    /// Ends the session of `headers`' cookie.
    pub fn logout(&self, headers: &HeaderMap) {
        if let Some(id) = session_cookie(headers) {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            sessions.retain(|(s, _)| !constant_time_eq(s.as_bytes(), id.as_bytes()));
        }
    }

    /// The CSRF token of `headers`' session, if it is one.
    pub fn csrf_of(&self, headers: &HeaderMap) -> Option<String> {
        let id = session_cookie(headers)?;
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions
            .iter()
            .find(|(s, _)| constant_time_eq(s.as_bytes(), id.as_bytes()))
            .map(|(_, csrf)| csrf.clone())
    }

    /// Allows an action: a live session and its CSRF token.
    pub fn allow(&self, headers: &HeaderMap, csrf: Option<&str>) -> Result<(), Refused> {
        let expected = self.csrf_of(headers).ok_or(Refused::NotLoggedIn)?;
        match csrf {
            Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(()),
            _ => Err(Refused::BadCsrf),
        }
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

    #[test]
    fn actions_need_a_session_and_its_csrf_token() {
        let auth = Auth::new(Secret::new("correct horse battery"));
        assert_eq!(auth.login("wrong"), Err(Refused::WrongToken));
        let Ok((id, csrf)) = auth.login("correct horse battery") else {
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
    }
}
