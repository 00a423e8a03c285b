//! `GET /api/v1/volumes/{name}/diff?from=SNAP&to=SNAP`: the ranges of a
//! volume (or of its snapshot `to`) that may differ from snapshot `from`
//! (of the volume, or `VOL@SNAP` of another, such as a clone's source); no
//! `from`: every range holding data. Both volumes must be visible to the
//! caller, like every volume endpoint.

use crate::error::ApiError;
use crate::types::{DiffExtent, VolumeDiffBody};
use crate::volumes::visible;
use crate::{blocking, AppState};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::Json;
use basalt_volume::split_snapshot_name;
use basalt_volume::tenancy::Principal;

/// `from` and `to` from the query string (`@` may come as `%40`).
fn diff_params(query: Option<&str>) -> Result<(Option<String>, Option<String>), ApiError> {
    let (mut from, mut to) = (None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = value.replace("%40", "@");
        if value.is_empty() || value.contains('%') {
            return Err(ApiError::bad_request(format!(
                "invalid query parameter {pair:?}: give a snapshot name"
            )));
        }
        match key {
            "from" => from = Some(value),
            "to" => to = Some(value),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "invalid query parameter {pair:?}: the parameters are from=SNAPSHOT and to=SNAPSHOT"
                )))
            }
        }
    }
    Ok((from, to))
}

pub(crate) async fn volume_diff(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<VolumeDiffBody>, ApiError> {
    let (from, to) = diff_params(query.as_deref())?;
    visible(&app, &who, &name).await?;
    if let Some((other, _)) = from.as_deref().and_then(split_snapshot_name) {
        visible(&app, &who, other).await?;
    }
    let diff = blocking(move || app.service.diff(&name, from.as_deref(), to.as_deref())).await?;
    Ok(Json(VolumeDiffBody {
        data_bytes: diff.data_bytes(),
        volume: diff.volume,
        from: diff.from,
        to: diff.to,
        size_bytes: diff.size_bytes,
        extents: diff
            .extents
            .into_iter()
            .map(|e| DiffExtent {
                offset: e.offset,
                length: e.len,
                data: e.data,
            })
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_parse_and_bad_ones_are_named() {
        assert_eq!(diff_params(None).unwrap(), (None, None));
        assert_eq!(
            diff_params(Some("from=base%40s1&to=s2")).unwrap(),
            (Some("base@s1".into()), Some("s2".into()))
        );
        let e = diff_params(Some("since=s1")).unwrap_err();
        assert!(format!("{e:?}").contains("since=s1"));
        assert!(diff_params(Some("from=")).is_err());
    }
}
