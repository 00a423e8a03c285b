//! Bearer-token authentication of every request. The token is compared in
//! constant time (for tokens of equal length), so response timing does not
//! reveal how much of a guess was right; an empty token never matches.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

const HOW_TO: &str = "send the header \"Authorization: Bearer <token>\"; the admin token is in the file api-token in the server's data directory (the basalt CLI reads it with --data-dir, or pass --token / BASALT_TOKEN)";

/// True if `a` equals `b`, in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Middleware: lets the request through only with the right bearer token.
pub async fn require_token(
    State(token): State<Arc<str>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(value) = request.headers().get(header::AUTHORIZATION) else {
        return ApiError::unauthorized(format!("authentication required: {HOW_TO}"))
            .into_response();
    };
    let presented = value.to_str().ok().and_then(|v| {
        // HTTP strips trailing spaces, so "Bearer " arrives as "Bearer".
        let (scheme, rest) = v.trim().split_once(' ').unwrap_or((v.trim(), ""));
        scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
    });
    match presented {
        None => ApiError::unauthorized(format!(
            "malformed Authorization header: expected the Bearer scheme; {HOW_TO}"
        ))
        .into_response(),
        Some(presented)
            if !presented.is_empty()
                && !token.is_empty()
                && constant_time_eq(presented.as_bytes(), token.as_bytes()) =>
        {
            next.run(request).await
        }
        Some(_) => ApiError::unauthorized(format!("invalid token: {HOW_TO}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_bytes() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"xbc", b"abc"));
    }
}
