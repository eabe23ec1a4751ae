//! The HTTP client deliveries go out through: connection pooling, the configured
//! connect and request timeouts, no redirects followed (a redirect would let a public
//! callback send the bus to a private address), no proxy from the environment, and
//! the SSRF guard as its DNS resolver.

use std::sync::Arc;

use crate::config::BusSettings;
use crate::guard::GuardedResolver;

/// Idle connections kept per callback host.
const POOL_IDLE_PER_HOST: usize = 8;

pub fn build(settings: &BusSettings) -> anyhow::Result<reqwest::Client> {
    let client = reqwest::Client::builder()
        .connect_timeout(settings.connect_timeout)
        .timeout(settings.delivery_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_max_idle_per_host(POOL_IDLE_PER_HOST)
        .user_agent(concat!("weir-bus/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(Arc::new(GuardedResolver {
            allow_private_networks: settings.allow_private_networks,
        }))
        .build()?;
    Ok(client)
}
