//! Routing: the first route whose listener, method, host and path pattern match a
//! request serves it. Patterns: `/exact`, `/prefix/*` (the prefix itself and
//! everything under it), and `:name` for one non-empty segment (`/users/:id`).
//!
//! A route as it runs ([`LiveRoute`]) is its settings with what serving them takes:
//! the compiled pattern, the client to its targets, the balancer, the capture queue
//! and the counters.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::balance::Balancer;
use crate::client::HttpClient;
use crate::config::RouteSettings;
use crate::metrics::RouteCounters;

/// A compiled path pattern.
#[derive(Clone, Debug)]
pub struct Pattern {
    segments: Vec<Segment>,
    /// Ends with `/*`: anything may follow.
    rest: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

impl Pattern {
    pub fn new(pattern: &str) -> Pattern {
        let (body, rest) = match pattern.strip_suffix("/*") {
            Some(b) => (b, true),
            None if pattern == "*" => ("", true),
            None => (pattern, false),
        };
        let segments = body
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| {
                if s.starts_with(':') {
                    Segment::Param
                } else {
                    Segment::Literal(s.to_string())
                }
            })
            .collect();
        Pattern { segments, rest }
    }

    pub fn matches(&self, path: &str) -> bool {
        let mut parts = path.split('/').filter(|s| !s.is_empty());
        for seg in &self.segments {
            match (seg, parts.next()) {
                (Segment::Literal(l), Some(p)) if l == p => {}
                (Segment::Param, Some(_)) => {}
                _ => return false,
            }
        }
        self.rest || parts.next().is_none()
    }
}

/// Whether `route` serves a request to `listener` with this method, host and path.
pub fn matches(
    route: &RouteSettings,
    pattern: &Pattern,
    listener: &str,
    method: &str,
    host: Option<&str>,
    path: &str,
) -> bool {
    if route
        .listen
        .as_ref()
        .is_some_and(|l| !l.iter().any(|n| n == listener))
    {
        return false;
    }
    if route
        .methods
        .as_ref()
        .is_some_and(|m| !m.iter().any(|x| x == method))
    {
        return false;
    }
    if let Some(want) = &route.host {
        let got = host.map(|h| {
            h.rsplit_once(':').map_or(h, |(name, port)| {
                if port.bytes().all(|b| b.is_ascii_digit()) {
                    name
                } else {
                    h
                }
            })
        });
        if !got.is_some_and(|g| g.eq_ignore_ascii_case(want)) {
            return false;
        }
    }
    pattern.matches(path)
}

/// A configured route as it runs: its settings with what serving them takes (the
/// compiled pattern, the client to its targets, the balancer, the capture queue,
/// the counters).
pub struct LiveRoute {
    pub settings: RouteSettings,
    pub pattern: Pattern,
    pub client: HttpClient,
    pub balancer: Balancer,
    /// The capture queue, once it is set up, for a route with shadows or `record`
    /// (see [`LiveRoute::captures`]). On JetStream it is set up in the background when
    /// the cluster cannot be reached at start; until then captures count as
    /// `not_ready`.
    pub capture: Arc<std::sync::OnceLock<weir_backend::Queue>>,
    pub counters: RouteCounters,
}

impl LiveRoute {
    /// Whether the route captures its requests (it has shadows or records).
    pub fn captures(&self) -> bool {
        !self.settings.shadows.is_empty() || self.settings.record
    }

    /// The capture queue of a route that captures: `None` for a route that does not,
    /// and for one whose queue is not set up yet (counted as `not_ready`).
    pub fn capture_queue(&self) -> Option<weir_backend::Queue> {
        match self.capture.get() {
            Some(queue) => Some(queue.clone()),
            None if self.captures() => {
                self.counters.shared.not_ready.fetch_add(1, Relaxed);
                None
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_exact_prefix_and_params() {
        let p = Pattern::new("/api/*");
        assert!(p.matches("/api") && p.matches("/api/") && p.matches("/api/x/y"));
        assert!(!p.matches("/apix") && !p.matches("/"));
        let p = Pattern::new("/users/:id");
        assert!(p.matches("/users/7") && !p.matches("/users") && !p.matches("/users/7/x"));
        let p = Pattern::new("/*");
        assert!(p.matches("/") && p.matches("/anything/at/all"));
        let p = Pattern::new("/exact");
        assert!(p.matches("/exact") && !p.matches("/exact/more"));
    }
}
