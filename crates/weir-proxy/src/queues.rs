//! The names of the proxy's queues: a route's capture queue `proxy:capture:ROUTE`
//! and a shadow's dead letters `proxy:capture:ROUTE:dead:SHADOW`. The config checks
//! them (a name too long is refused at start), the request path appends to the
//! first, `dead.rs` to the second.

/// The capture queue of a route.
pub fn capture_queue(route: &str) -> String {
    format!("{}{route}", weir_backend::PROXY_CAPTURE_PREFIX)
}

/// The dead-letter queue of a shadow.
pub fn dead_queue(route: &str, shadow: &str) -> String {
    format!("{}:dead:{shadow}", capture_queue(route))
}
