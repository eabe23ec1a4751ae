//! `/api_tokens`: the root key creates, lists and deletes client tokens. A token is
//! a credential (the user of HTTP Basic); its owner name is what is shown elsewhere.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use rand::RngCore;

use super::body::{json_body, json_object, read_body, REQUEST_BYTES_MAX};
use super::credentials::root;
use crate::auth::same_secret;
use crate::bus::Bus;
use crate::error::{ApiError, ApiResult};
use crate::names::{is_token, NAME_BYTES_MAX};

/// Random hex digits after `--` in a generated token.
const TOKEN_RANDOM_HEX: usize = 32;

/// `GET /api_tokens`: `[{"name","token"}]`, or 204 when there is none.
pub async fn list(State(bus): State<Arc<Bus>>, headers: HeaderMap) -> ApiResult<Response> {
    root(&bus, &headers)?;
    let meta = bus.meta();
    if meta.tokens.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let list: Vec<serde_json::Value> = meta
        .tokens
        .iter()
        .map(|(token, name)| serde_json::json!({ "name": name, "token": token }))
        .collect();
    Ok(json_body(serde_json::Value::Array(list).to_string()).into_response())
}

/// `POST /api_tokens {"name": NAME, "token": TOKEN?}` (`owner` is taken for `name`):
/// 201 `{"name","token"}`. Without `token`, one is made from the name and 128 random bits.
pub async fn create(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    root(&bus, &headers)?;
    let body = read_body(&bus, body, REQUEST_BYTES_MAX).await?;
    let data = json_object(&body)?;
    let name = data
        .get("name")
        .or_else(|| data.get("owner"))
        .and_then(|v| v.as_str())
        .ok_or_else(|| ApiError::bad_request("a `name` (string) is required"))?
        .to_string();
    if name.is_empty() || name.len() > NAME_BYTES_MAX || name.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "bad name: 1 to {NAME_BYTES_MAX} bytes, no control characters"
        )));
    }
    let token = match data.get("token") {
        None | Some(serde_json::Value::Null) => generated_token(&name),
        // The root key as a client token would make a client of whoever holds the
        // key, and the token could never authenticate as itself.
        Some(serde_json::Value::String(t))
            if bus
                .settings
                .root_key
                .as_deref()
                .is_some_and(|root| same_secret(root, t)) =>
        {
            return Err(ApiError::bad_request(
                "bad token: the root key cannot be a client token",
            ))
        }
        Some(serde_json::Value::String(t)) if is_token(t) => t.clone(),
        Some(_) => {
            return Err(ApiError::bad_request(
                "bad token: 1 to 64 of a-z, 0-9, `:`, `_` and `-`",
            ))
        }
    };
    let tokens_max = bus.settings.tokens_max;
    let (token_out, name_out) = (token.clone(), name.clone());
    bus.change(move |meta| {
        if !meta.tokens.contains_key(&token) && meta.tokens.len() >= tokens_max {
            return Err(ApiError::forbidden(format!(
                "limit reached: at most {tokens_max} tokens (bus.tokens_max)"
            )));
        }
        meta.tokens.insert(token, name);
        Ok(())
    })
    .await?;
    let body = serde_json::json!({ "name": name_out, "token": token_out }).to_string();
    Ok((StatusCode::CREATED, json_body(body)).into_response())
}

/// `DELETE /api_tokens/:token`: 204; the token's subscription goes with it, and
/// the topics it claimed become unclaimed (the next publisher claims them).
pub async fn remove(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> ApiResult<StatusCode> {
    root(&bus, &headers)?;
    if bus.meta().tokens.contains_key(&token) {
        bus.change(|meta| {
            meta.tokens.remove(&token);
            meta.subscribers.remove(&token);
            for t in meta.topics.values_mut() {
                if t.publisher.as_deref() == Some(token.as_str()) {
                    t.publisher = None;
                }
            }
            Ok(())
        })
        .await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `NAME--HEX`: the name reduced to token characters (at most 30 of them), and
/// random hex digits.
fn generated_token(name: &str) -> String {
    let prefix_max = NAME_BYTES_MAX - 2 - TOKEN_RANDOM_HEX;
    let prefix: String = name
        .to_lowercase()
        .chars()
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == '-')
        .take(prefix_max)
        .collect();
    let mut random = [0u8; TOKEN_RANDOM_HEX / 2];
    rand::thread_rng().fill_bytes(&mut random);
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}--{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_valid_tokens() {
        for name in ["Bob Smith", "", "ÉÉÉ", &"x".repeat(64), "svc:a_b-c"] {
            let t = generated_token(name);
            assert!(is_token(&t), "{t}");
            assert!(t.ends_with(&t[t.len() - TOKEN_RANDOM_HEX..]));
        }
        assert!(generated_token("Bob Smith").starts_with("bobsmith--"));
        assert_ne!(generated_token("a"), generated_token("a"));
    }
}
