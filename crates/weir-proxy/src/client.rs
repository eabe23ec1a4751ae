//! The HTTP client every outgoing request of the proxy goes through: to targets,
//! shadows, a diff's reference, health checks and probes, `weir replay`, and the
//! command lines' `--server` mode. Pooled keep-alive connections on hyper-util's
//! client, in the clear or over TLS (rustls, configured by `tls.rs`). Also how its
//! errors are said in one line ([`error_chain`]).

use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::body::ProxyBody;

pub type HttpClient = Client<HttpsConnector<HttpConnector>, ProxyBody>;

/// A client for targets: pooled keep-alive connections, `connect_timeout`,
/// `http://` in the clear and `https://` over TLS with `tls`.
pub fn http_client(connect_timeout: Duration, tls: &Arc<rustls::ClientConfig>) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    connector.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((**tls).clone())
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector)
}

/// An error and its sources, one after the other on one line (a client's error
/// says little without its sources: "client error (Connect)").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text.replace(['\r', '\n'], " ")
}
