//! The optional bearer-token check, for both front-ends: a gRPC interceptor in front of
//! every service except health, and the same check ([`BearerAuth::check`]) in front of
//! the HTTP API's endpoints except the probes and metrics, so those need no secret.

use super::metrics::Metrics;
use std::sync::Arc;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Accepts a request when no token is configured, or when its `authorization` metadata is
/// `Bearer <token>`.
#[derive(Clone)]
pub struct BearerAuth {
    token: Option<Arc<[u8]>>,
    metrics: Arc<Metrics>,
}

impl BearerAuth {
    pub fn new(token: Option<&str>, metrics: Arc<Metrics>) -> Self {
        Self {
            token: token.map(|t| Arc::from(t.as_bytes())),
            metrics,
        }
    }
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    Missing,
    Invalid,
}

impl BearerAuth {
    /// Checks a request's `authorization` value (`None`: absent or not text); a refusal is
    /// counted.
    pub fn check(&self, authorization: Option<&str>) -> Result<(), AuthError> {
        let Some(want) = &self.token else {
            return Ok(());
        };
        match authorization.and_then(bearer_credentials) {
            Some(t) if constant_time_eq(t.trim().as_bytes(), want) => Ok(()),
            Some(_) => {
                self.metrics.auth_failure();
                Err(AuthError::Invalid)
            }
            None => {
                self.metrics.auth_failure();
                Err(AuthError::Missing)
            }
        }
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match self.check(given) {
            Ok(()) => Ok(req),
            Err(AuthError::Invalid) => Err(Status::unauthenticated("invalid bearer token")),
            Err(AuthError::Missing) => Err(Status::unauthenticated(
                "missing bearer token: send metadata `authorization: Bearer <token>`",
            )),
        }
    }
}

/// The credentials of an `authorization` value in the `Bearer` scheme, whose name is
/// case-insensitive (RFC 7235).
fn bearer_credentials(v: &str) -> Option<&str> {
    let (scheme, credentials) = v.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(credentials)
}

/// Compares without an early exit, so the time taken does not reveal how much of a guess
/// was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads a token file: its content with surrounding whitespace removed.
pub fn read_token_file(path: &std::path::Path) -> std::io::Result<String> {
    let t = std::fs::read_to_string(path)?.trim().to_string();
    if t.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the token file {} is empty", path.display()),
        ));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(auth: &mut BearerAuth, header: Option<&str>) -> Result<(), tonic::Code> {
        let mut req = Request::new(());
        if let Some(h) = header {
            req.metadata_mut()
                .insert("authorization", h.parse().unwrap());
        }
        auth.call(req).map(|_| ()).map_err(|s| s.code())
    }

    #[test]
    fn token_is_checked_only_when_configured() {
        let metrics = Arc::new(Metrics::new());
        let mut open = BearerAuth::new(None, Arc::clone(&metrics));
        assert_eq!(call(&mut open, None), Ok(()));
        let mut locked = BearerAuth::new(Some("s3cret"), Arc::clone(&metrics));
        assert_eq!(call(&mut locked, Some("Bearer s3cret")), Ok(()));
        assert_eq!(call(&mut locked, Some("BEARER s3cret")), Ok(()));
        assert_eq!(call(&mut locked, Some("bEaReR  s3cret")), Ok(()));
        assert_eq!(
            call(&mut locked, Some("Basic s3cret")),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(
            call(&mut locked, Some("Bearer s3cre")),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(call(&mut locked, None), Err(tonic::Code::Unauthenticated));
        assert_eq!(
            call(&mut locked, Some("s3cret")),
            Err(tonic::Code::Unauthenticated)
        );
        assert!(metrics
            .render(0, 1)
            .contains("inferno_auth_failures_total 4\n"));
    }
}
