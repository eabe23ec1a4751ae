//! The servers an instance's failover watch left lately ([`super::failover::failover_watch`]),
//! which its reconnections skip for a while: the NATS client alone picks a server at
//! random and went back to the one cut off from its peers about one time in three.

use async_nats::{Server, ServerAddr};

/// The servers the failover watch left lately, as their INFO named them (host and
/// port of their `listen`), each until when reconnections skip it. A few, not one:
/// with two servers cut off together, leaving one for the other and back again would
/// never reach the rest.
#[derive(Default)]
pub(crate) struct Left {
    servers: Vec<(String, u16, std::time::Instant)>,
    /// Turns among equal candidates, so instances and attempts do not all pick the same
    /// one (a name that no longer resolves fails without counting as a failure).
    turn: usize,
}

/// At most this many servers are remembered as left.
const LEFT_MAX: usize = 8;

impl Left {
    /// Remembers the server being left until `until`.
    pub(crate) fn add(&mut self, host: String, port: u16, until: std::time::Instant) {
        let now = std::time::Instant::now();
        self.servers
            .retain(|(h, p, u)| *u > now && !(*h == host && *p == port));
        if self.servers.len() >= LEFT_MAX {
            self.servers.remove(0);
        }
        self.servers.push((host, port, until));
    }

    /// Whether `addr` is a server left lately: the same host and port as its INFO
    /// gave. Nothing looser: a server's own port need not be the one the instance dials
    /// (a published container port), and a wrong match could pin the instance to the
    /// server it leaves.
    fn has(&self, addr: &ServerAddr, now: std::time::Instant) -> bool {
        self.servers
            .iter()
            .any(|(h, p, u)| *u > now && *p == addr.port() && h == addr.host())
    }

    /// The server a reconnection tries: of those not left lately, one that failed
    /// the fewest times in a row, in turn. `None` (the client's own random choice)
    /// when no server of the pool is one left lately, or every one is.
    pub(crate) fn choose(&mut self, servers: &[Server]) -> Option<ServerAddr> {
        let now = std::time::Instant::now();
        let others: Vec<&Server> = servers.iter().filter(|s| !self.has(&s.addr, now)).collect();
        if others.is_empty() || others.len() == servers.len() {
            return None;
        }
        let fewest = others.iter().map(|s| s.failed_attempts).min()?;
        let best: Vec<&&Server> = others
            .iter()
            .filter(|s| s.failed_attempts == fewest)
            .collect();
        self.turn = self.turn.wrapping_add(1);
        best.get(self.turn % best.len()).map(|s| s.addr.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    use crate::jetstream::api::Health;
    use crate::jetstream::connect::leaving_choice;

    fn pool(urls: &[(&str, usize)]) -> Vec<Server> {
        urls.iter()
            .map(|(url, failed_attempts)| Server {
                addr: url.parse().unwrap(),
                failed_attempts: *failed_attempts,
                did_connect: true,
                is_discovered: false,
                last_error: None,
            })
            .collect()
    }

    fn left(servers: &[(&str, u16)]) -> Left {
        let mut left = Left::default();
        for (host, port) in servers {
            left.add(
                (*host).to_owned(),
                *port,
                Instant::now() + Duration::from_secs(5),
            );
        }
        left
    }

    fn ports(left: &mut Left, servers: &[Server], tries: usize) -> Vec<Option<u16>> {
        (0..tries)
            .map(|_| left.choose(servers).map(|a| a.port()))
            .collect()
    }

    #[test]
    fn a_reconnection_skips_the_servers_left_and_takes_the_others_in_turn() {
        // Loopback nodes on ports of their own, as scripts/nats-cluster makes them.
        let servers = pool(&[
            ("nats://127.0.0.1:4222", 0),
            ("nats://127.0.0.1:4223", 0),
            ("nats://127.0.0.1:4224", 0),
        ]);
        let mut l = left(&[("127.0.0.1", 4222)]);
        let got = ports(&mut l, &servers, 4);
        assert!(
            got.iter().all(|p| matches!(p, Some(4223) | Some(4224))),
            "{got:?}"
        );
        assert!(got.contains(&Some(4223)), "{got:?}");
        assert!(got.contains(&Some(4224)), "{got:?}");
        // Two left lately: the third, not one of the two in turn.
        let mut l = left(&[("127.0.0.1", 4222), ("127.0.0.1", 4223)]);
        assert_eq!(ports(&mut l, &servers, 3), vec![Some(4224); 3]);
        // The ones that failed the fewest times in a row come first.
        let servers = pool(&[
            ("nats://127.0.0.1:4222", 0),
            ("nats://127.0.0.1:4223", 3),
            ("nats://127.0.0.1:4224", 1),
        ]);
        let mut l = left(&[("127.0.0.1", 4222)]);
        assert_eq!(ports(&mut l, &servers, 2), vec![Some(4224); 2]);
    }

    #[test]
    fn only_an_exact_host_and_port_counts_as_the_server_left() {
        let servers = pool(&[
            ("nats://10.0.0.1:4222", 0),
            ("nats://10.0.0.2:4222", 0),
            ("nats://10.0.0.3:4222", 0),
        ]);
        let mut l = left(&[("10.0.0.2", 4222)]);
        for _ in 0..4 {
            let addr = l.choose(&servers).unwrap();
            assert_ne!(addr.host(), "10.0.0.2");
        }
        // A server listening on every address names no host of its own, and one in
        // a container may name a port the instance does not dial: not told, the client
        // chooses as it would.
        assert!(left(&[("0.0.0.0", 4222)]).choose(&servers).is_none());
        let published = pool(&[("nats://h1:4222", 0), ("nats://h2:4223", 0)]);
        assert!(left(&[("172.17.0.2", 4222)]).choose(&published).is_none());
    }

    #[test]
    fn nothing_is_skipped_once_its_time_is_over_or_when_every_server_was_left() {
        let servers = pool(&[("nats://127.0.0.1:4222", 0), ("nats://127.0.0.1:4223", 0)]);
        let health = Health::default();
        assert!(leaving_choice(&health, &servers).is_none());
        health.left.lock().unwrap().add(
            "127.0.0.1".into(),
            4222,
            Instant::now() + Duration::from_secs(5),
        );
        assert_eq!(
            leaving_choice(&health, &servers).map(|a| a.port()),
            Some(4223)
        );
        // Every one left lately: the client's own choice.
        health.left.lock().unwrap().add(
            "127.0.0.1".into(),
            4223,
            Instant::now() + Duration::from_secs(5),
        );
        assert!(leaving_choice(&health, &servers).is_none());
        // Over: skipped no more.
        let mut l = Left::default();
        l.add("127.0.0.1".into(), 4222, Instant::now());
        assert!(l.choose(&servers).is_none());
        // The list stays small.
        let mut l = Left::default();
        for port in 0..100 {
            l.add(
                "127.0.0.1".into(),
                port,
                Instant::now() + Duration::from_secs(5),
            );
        }
        assert_eq!(l.servers.len(), LEFT_MAX);
    }
}
