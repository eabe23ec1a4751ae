//! How the command lines' `--server` mode talks to a running weir's HTTP port: the
//! proxy's own HTTP client (`client::http_client`, hyper-util's pooled client with
//! rustls for an `https://` URL), so the proxy crate has one HTTP client stack.
//!
//! Every request carries the admin key as a bearer token; connecting may take
//! `SERVER_CONNECT_TIMEOUT`, and each wait for weir (the answer's head, every piece of
//! its body) at most `SERVER_READ_TIMEOUT`, so a stalled weir fails the command
//! instead of hanging it. An answer that is not 2xx becomes an error carrying the
//! reason weir gave.

use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, Uri};

use crate::body::full;
use crate::client::{error_chain, http_client, HttpClient};

/// Time to connect to weir's HTTP port, and the longest wait for the next bytes.
const SERVER_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const SERVER_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// A client for one command's requests to a running weir.
pub(crate) struct ServerClient {
    client: HttpClient,
    /// `Bearer KEY`, the admin key's header value.
    authorization: HeaderValue,
}

impl ServerClient {
    /// A client that sends `key` as the admin key. Must be called inside a Tokio
    /// runtime (the client's pool runs on it).
    pub(crate) fn new(key: &str) -> anyhow::Result<ServerClient> {
        let tls = crate::tls::client_config(None).map_err(anyhow::Error::msg)?;
        let authorization = HeaderValue::from_str(&format!("Bearer {key}"))
            .context("the admin key cannot be sent in an HTTP header")?;
        Ok(ServerClient {
            client: http_client(SERVER_CONNECT_TIMEOUT, &tls),
            authorization,
        })
    }

    /// `GET url`; the 2xx answer, or an error with weir's reason.
    pub(crate) async fn get(&self, url: &str) -> anyhow::Result<Answer> {
        self.send(Method::GET, url, None).await
    }

    /// `POST url` with `body` of `content_type`; the 2xx answer, or an error with
    /// weir's reason.
    pub(crate) async fn post(
        &self,
        url: &str,
        content_type: &'static str,
        body: Vec<u8>,
    ) -> anyhow::Result<Answer> {
        self.send(Method::POST, url, Some((content_type, body)))
            .await
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> anyhow::Result<Answer> {
        let uri = server_uri(url)?;
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header(AUTHORIZATION, self.authorization.clone());
        let body = match body {
            Some((content_type, bytes)) => {
                request = request.header(CONTENT_TYPE, content_type);
                full(bytes)
            }
            None => full(Bytes::new()),
        };
        let request = request.body(body).context("making the request")?;
        let response = tokio::time::timeout(SERVER_READ_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| anyhow::anyhow!("no answer in {} s", SERVER_READ_TIMEOUT.as_secs()))?
            .map_err(|e| anyhow::anyhow!("{}", error_chain(&e)))?;
        checked(Answer { response }).await
    }
}

/// `url` as a URI with a scheme (`http` or `https`) and a host.
fn server_uri(url: &str) -> anyhow::Result<Uri> {
    let uri: Uri = url
        .parse()
        .with_context(|| format!("--server: {url:?} is not a URL"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(uri),
        _ => bail!("--server: {url:?} is not an http:// or https:// URL with a host"),
    }
}

/// A 2xx answer from weir, its body read as it arrives.
pub(crate) struct Answer {
    response: Response<Incoming>,
}

impl Answer {
    /// The next piece of the body; `None` at its end.
    pub(crate) async fn chunk(&mut self) -> anyhow::Result<Option<Bytes>> {
        loop {
            let frame = tokio::time::timeout(SERVER_READ_TIMEOUT, self.response.frame())
                .await
                .map_err(|_| anyhow::anyhow!("nothing in {} s", SERVER_READ_TIMEOUT.as_secs()))?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => bail!("{}", error_chain(&e)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// The whole body.
    pub(crate) async fn bytes(mut self) -> anyhow::Result<Vec<u8>> {
        let mut all = Vec::new();
        while let Some(chunk) = self.chunk().await? {
            all.extend_from_slice(&chunk);
        }
        Ok(all)
    }

    /// The whole body as text (bytes that are not UTF-8 replaced).
    pub(crate) async fn text(self) -> anyhow::Result<String> {
        Ok(String::from_utf8_lossy(&self.bytes().await?).into_owned())
    }
}

/// An answer that is not 2xx, as an error carrying weir's reason.
async fn checked(answer: Answer) -> anyhow::Result<Answer> {
    let status = answer.response.status();
    if status.is_success() {
        return Ok(answer);
    }
    let text = answer.text().await.unwrap_or_default();
    let reason = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or(text);
    bail!("weir answered {status}: {}", reason.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_need_a_scheme_and_a_host() {
        assert!(server_uri("http://127.0.0.1:22134/captures/q").is_ok());
        assert!(server_uri("https://weir.example/proxy/diffs").is_ok());
        for bad in ["127.0.0.1:22134/x", "ftp://h/x", "/captures/q", "not a url"] {
            assert!(server_uri(bad).is_err(), "{bad}");
        }
    }
}
