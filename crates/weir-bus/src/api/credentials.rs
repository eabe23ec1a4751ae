//! Who a request is from: HTTP Basic with the root key or a client token as the user,
//! and the checks the handlers make of it. A leaf, so that the router in `mod.rs` and
//! every handler use it without importing each other.

use axum::http::HeaderMap;

use crate::auth::{basic_user, same_secret};
use crate::bus::Bus;
use crate::error::{ApiError, ApiResult};

/// Who a request is from.
pub enum Caller {
    Root,
    Client(String),
}

/// The caller when it is the root key or a client token; 401 otherwise.
pub fn caller(bus: &Bus, headers: &HeaderMap) -> ApiResult<Caller> {
    let user = basic_user(headers).ok_or_else(|| {
        ApiError::unauthorized("credentials required: HTTP Basic with a token as the user")
    })?;
    if let Some(root) = &bus.settings.root_key {
        if same_secret(root, &user) {
            return Ok(Caller::Root);
        }
    }
    if bus.meta().tokens.contains_key(&user) {
        return Ok(Caller::Client(user));
    }
    Err(ApiError::unauthorized("unknown token"))
}

/// The client token of a request; 401 for anything else (the root key included).
pub fn client(bus: &Bus, headers: &HeaderMap) -> ApiResult<String> {
    match caller(bus, headers)? {
        Caller::Client(token) => Ok(token),
        Caller::Root => Err(ApiError::unauthorized(
            "this needs a client token, not the root key",
        )),
    }
}

/// Succeeds for the root key only; 401 otherwise.
pub fn root(bus: &Bus, headers: &HeaderMap) -> ApiResult<()> {
    if bus.settings.root_key.is_none() {
        return Err(ApiError::unauthorized(
            "no root key is configured (bus.root_key or WEIR_BUS_ROOT_KEY)",
        ));
    }
    match caller(bus, headers) {
        Ok(Caller::Root) => Ok(()),
        _ => Err(ApiError::unauthorized("this needs the root key")),
    }
}
