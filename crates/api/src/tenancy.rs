//! The tenancy endpoints: projects and their quotas, tokens, NBD TLS keys,
//! volume types and the default type. What each principal may do is decided by the
//! volume service (`basalt_volume::tenancy`); these only translate.

use crate::error::ApiError;
use crate::types::{
    CreateNbdKey, CreateProject, CreateToken, CreateVolumeType, CreatedNbdKey, CreatedToken,
    NbdKey, NbdKeyList, Project, ProjectList, QuotaSet, SetDefaultType, Token, TokenList,
    VolumeType, VolumeTypeList,
};
use crate::{blocking, AppState, JsonBody};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use basalt_volume::qos::QosSpec;
use basalt_volume::tenancy::Quotas;
use basalt_volume::tenancy::{NewToken, NewVolumeType, Principal, QuotaChange};

fn created(location: String, body: impl serde::Serialize) -> Response {
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(body),
    )
        .into_response()
}

pub(crate) async fn list_projects(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<Json<ProjectList>, ApiError> {
    let projects = blocking(move || app.service.projects(&who)).await?;
    Ok(Json(ProjectList {
        projects: projects.into_iter().map(Project::from).collect(),
    }))
}

pub(crate) async fn create_project(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    JsonBody(req): JsonBody<CreateProject>,
) -> Result<Response, ApiError> {
    let info = blocking(move || {
        let mut quotas = Quotas::default();
        QuotaChange::from(&req.quotas).apply(&mut quotas);
        app.service
            .create_project(&who, &req.name, req.description, quotas)
    })
    .await?;
    Ok(created(
        format!("/api/v1/projects/{}", info.name),
        Project::from(info),
    ))
}

pub(crate) async fn get_project(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<Project>, ApiError> {
    let info = blocking(move || app.service.project(&who, &name)).await?;
    Ok(Json(info.into()))
}

pub(crate) async fn delete_project(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    blocking(move || app.service.delete_project(&who, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn set_quotas(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<QuotaSet>,
) -> Result<Json<Project>, ApiError> {
    let info = blocking(move || {
        app.service
            .set_quotas(&who, &name, &QuotaChange::from(&req))
    })
    .await?;
    Ok(Json(info.into()))
}

/// `project=NAME` from a query string; absent: `None`.
fn project_param(query: Option<&str>) -> Result<Option<String>, ApiError> {
    let mut project = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("project", name)) if !name.is_empty() => project = Some(name.to_string()),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "invalid query parameter {pair:?}: the only one is project=NAME"
                )))
            }
        }
    }
    Ok(project)
}

pub(crate) async fn list_tokens(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    RawQuery(query): RawQuery,
) -> Result<Json<TokenList>, ApiError> {
    let project = project_param(query.as_deref())?;
    let tokens = blocking(move || app.service.tokens(&who, project.as_deref())).await?;
    Ok(Json(TokenList {
        tokens: tokens.into_iter().map(Token::from).collect(),
    }))
}

pub(crate) async fn create_token(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    JsonBody(req): JsonBody<CreateToken>,
) -> Result<Response, ApiError> {
    let expires_in = req
        .expires_in
        .as_deref()
        .map(|text| {
            humantime::parse_duration(text).map_err(|e| {
                ApiError::bad_request(format!(
                    "invalid expires_in {text:?}: {e} (write a lifetime such as 30d or 12h)"
                ))
            })
        })
        .transpose()?;
    let request = NewToken {
        project: req.project,
        role: req.role,
        expires_in,
        description: req.description,
    };
    let (info, token) = blocking(move || app.service.create_token(&who, &request)).await?;
    Ok(created(
        format!("/api/v1/tokens/{}", info.id),
        CreatedToken {
            token,
            info: info.into(),
        },
    ))
}

pub(crate) async fn revoke_token(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    blocking(move || app.service.revoke_token(&who, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn list_types(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<Json<VolumeTypeList>, ApiError> {
    let types = blocking(move || app.service.volume_types(&who)).await?;
    Ok(Json(VolumeTypeList {
        types: types.into_iter().map(VolumeType::from).collect(),
    }))
}

pub(crate) async fn create_type(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    JsonBody(req): JsonBody<CreateVolumeType>,
) -> Result<Response, ApiError> {
    let request = NewVolumeType {
        name: req.name,
        description: req.description,
        replicas: req.replicas,
        qos: QosSpec(req.qos),
        projects: req.projects,
        encrypted: req.encrypted,
        compression: req.compression,
    };
    let info =
        blocking(move || app.service.create_volume_type(&who, &request, req.default)).await?;
    Ok(created(
        format!("/api/v1/types/{}", info.name),
        VolumeType::from(info),
    ))
}

pub(crate) async fn get_type(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<VolumeType>, ApiError> {
    let info = blocking(move || app.service.volume_type(&who, &name)).await?;
    Ok(Json(info.into()))
}

pub(crate) async fn delete_type(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    blocking(move || app.service.delete_volume_type(&who, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn set_default_type(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    JsonBody(req): JsonBody<SetDefaultType>,
) -> Result<Json<SetDefaultType>, ApiError> {
    let name = req.name.clone();
    blocking(move || {
        app.service
            .set_default_volume_type(&who, req.name.as_deref())
    })
    .await?;
    Ok(Json(SetDefaultType { name }))
}

pub(crate) async fn list_nbd_keys(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<Json<NbdKeyList>, ApiError> {
    let keys = blocking(move || app.service.nbd_keys(&who)).await?;
    Ok(Json(NbdKeyList {
        keys: keys.into_iter().map(NbdKey::from).collect(),
    }))
}

pub(crate) async fn create_nbd_key(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    JsonBody(req): JsonBody<CreateNbdKey>,
) -> Result<Response, ApiError> {
    let (info, psk_line) = blocking(move || {
        app.service
            .create_nbd_key(&who, req.project.as_deref(), req.description)
    })
    .await?;
    Ok(created(
        format!("/api/v1/nbd-keys/{}", info.identity),
        CreatedNbdKey {
            psk_line,
            info: info.into(),
        },
    ))
}

pub(crate) async fn revoke_nbd_key(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(identity): Path<String>,
) -> Result<StatusCode, ApiError> {
    blocking(move || app.service.revoke_nbd_key(&who, &identity)).await?;
    Ok(StatusCode::NO_CONTENT)
}
