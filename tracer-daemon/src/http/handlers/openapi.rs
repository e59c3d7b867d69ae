//! `GET /openapi.json`: the API's OpenAPI 3.1 description, made from the
//! route table (see [`crate::http::openapi`]).
use axum::{
    extract::RawQuery,
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};

use crate::http::routes::media;
use crate::http::{ApiError, openapi, params::Params, params::spec};

/// `GET /openapi.json`.
pub async fn document(RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let text = openapi::json().map_err(ApiError::internal)?;
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(media::JSON));
    Ok(response)
}
