//! Bearer-token authentication of every request, and the [`Principal`] it
//! makes the request act as (a request extension the handlers read).
//!
//! Two kinds of token are accepted: the server's admin token (the file
//! `api-token`; cluster admin) and tokens created through the API
//! (`bst_…`, checked against their hashed record in the catalog; see
//! `basalt_volume::tenancy`). Comparisons are constant-time; an empty token
//! never matches. A catalog that cannot be read answers 503, not 401.

use crate::error::ApiError;
use crate::{blocking, AppState};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use basalt_volume::tenancy::{constant_time_eq, Principal, TOKEN_PREFIX};

const HOW_TO: &str = "send the header \"Authorization: Bearer <token>\"; the admin token is in the file api-token in the server's data directory (the basalt CLI reads it with --data-dir, or pass --token / BASALT_TOKEN); project tokens come from basalt token create";

/// Middleware: lets the request through, as its principal, only with a
/// valid bearer token.
pub async fn require_token(
    State(app): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(value) = request.headers().get(header::AUTHORIZATION) else {
        return ApiError::unauthorized(format!("authentication required: {HOW_TO}"))
            .into_response();
    };
    let presented = value.to_str().ok().and_then(|v| {
        // HTTP strips trailing spaces, so "Bearer " arrives as "Bearer".
        let (scheme, rest) = v.trim().split_once(' ').unwrap_or((v.trim(), ""));
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| rest.trim().to_string())
    });
    let Some(presented) = presented else {
        return ApiError::unauthorized(format!(
            "malformed Authorization header: expected the Bearer scheme; {HOW_TO}"
        ))
        .into_response();
    };
    let principal = if !presented.is_empty()
        && !app.admin_token.is_empty()
        && constant_time_eq(presented.as_bytes(), app.admin_token.as_bytes())
    {
        Some(Principal::ClusterAdmin)
    } else if presented.starts_with(TOKEN_PREFIX) {
        let service = app.service.clone();
        match blocking(move || service.authenticate(&presented)).await {
            Ok(found) => found,
            Err(e) => return e.into_response(),
        }
    } else {
        None
    };
    match principal {
        Some(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        None => ApiError::unauthorized(format!("invalid token: {HOW_TO}")).into_response(),
    }
}
