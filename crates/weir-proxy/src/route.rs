//! Routing: the first route whose listener, method, host and path pattern match a
//! request serves it. Patterns: `/exact`, `/prefix/*` (the prefix itself and
//! everything under it), and `:name` for one non-empty segment (`/users/:id`).

use crate::config::RouteSettings;

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
