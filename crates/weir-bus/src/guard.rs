//! The guard against server-side request forgery: a callback URL may only reach the
//! public internet, unless the config allows more.
//!
//! Checked twice: when a subscription is made (scheme, form, and a host written as an
//! IP address), and at every connection, by the DNS resolver the delivery client uses
//! (`GuardedResolver`), which drops every non-public address a name resolves to. A
//! name that resolves to a public address when subscribing and to 127.0.0.1 later
//! (DNS rebinding) is refused then too. Redirects are not followed (see `client.rs`).

use std::error::Error as StdError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

/// What the guard lets through.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub allow_http: bool,
    pub allow_private_networks: bool,
}

/// Checks a callback URL when a subscription is made; the error says why not.
pub fn check_callback(url: &str, policy: Policy) -> Result<Url, String> {
    let parsed = Url::parse(url).map_err(|e| format!("bad callback URL: {e}"))?;
    match parsed.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        "http" => {
            return Err("bad callback URL: must be https (this bus does not allow http)".into())
        }
        other => return Err(format!("bad callback URL: scheme {other:?} is not http(s)")),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("bad callback URL: credentials in the URL are not allowed".into());
    }
    let host = match parsed.host() {
        Some(h) => h,
        None => return Err("bad callback URL: no host".into()),
    };
    if !policy.allow_private_networks {
        let ip = match host {
            url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
            url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
            url::Host::Domain(d)
                if d.eq_ignore_ascii_case("localhost") || d.ends_with(".localhost") =>
            {
                Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
            }
            url::Host::Domain(_) => None,
        };
        if ip.is_some_and(|ip| !is_public(ip)) {
            return Err(
                "bad callback URL: loopback, private and link-local addresses are not allowed (refused by the SSRF guard)"
                    .into(),
            );
        }
    }
    Ok(parsed)
}

/// Whether an address is on the public internet: not loopback, private, link-local,
/// shared (CGNAT), unspecified, broadcast, multicast, documentation or unique-local.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => is_public_v4(v4) && is_public_v6(v6),
            None => is_public_v6(v6),
        },
    }
}

/// The IPv4 address an IPv6 address carries: IPv4-mapped `::ffff:a.b.c.d`,
/// IPv4-compatible `::a.b.c.d`, 6to4 `2002:AABB:CCDD::/48`. Judged by the IPv4 rules
/// too, so that none of them reaches a private network.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0; 6] && (s[6] != 0 || s[7] > 1) {
        return Some(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first & 0xffc0) == 0xfec0
        || first == 0x2001 && ip.segments()[1] == 0x0db8
        // Teredo tunnels to an address it cannot judge.
        || first == 0x2001 && ip.segments()[1] == 0x0000
        || first == 0x0064 && ip.segments()[1] == 0xff9b)
}

/// The delivery client's resolver: the system's, less the addresses the policy
/// refuses.
pub struct GuardedResolver {
    pub allow_private_networks: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private_networks;
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| Box::new(e) as Box<dyn StdError + Send + Sync>)?
                .collect();
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| allow_private || is_public(a.ip()))
                .collect();
            if allowed.is_empty() {
                let msg =
                    format!("{host} resolves to no public address (refused by the SSRF guard)");
                return Err(msg.into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRICT: Policy = Policy {
        allow_http: false,
        allow_private_networks: false,
    };

    #[test]
    fn callbacks_are_checked_by_scheme_and_address() {
        assert!(check_callback("https://hooks.example.com/in", STRICT).is_ok());
        for (url, why) in [
            ("http://hooks.example.com/in", "https"),
            ("ftp://hooks.example.com/in", "scheme"),
            ("https://127.0.0.1/in", "loopback"),
            ("https://localhost:8080/in", "loopback"),
            ("https://10.1.2.3/in", "private"),
            ("https://192.168.0.1/in", "private"),
            ("https://169.254.169.254/latest/meta-data", "link-local"),
            ("https://[::1]/in", "loopback"),
            ("https://[fe80::1]/in", "link-local"),
            ("https://[::ffff:10.0.0.1]/in", "private"),
            ("https://user:pw@hooks.example.com/in", "credentials"),
            ("not a url", "bad callback URL"),
        ] {
            let e = check_callback(url, STRICT).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
        let open = Policy {
            allow_http: true,
            allow_private_networks: true,
        };
        assert!(check_callback("http://127.0.0.1:9/in", open).is_ok());
    }

    #[test]
    fn public_addresses_are_told_from_the_rest() {
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700::1111",
            "2002:808:808::1",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
        for other in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "::10.0.0.1",
            "2002:7f00:1::1",
            "2002:a00:1::",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "fec0::1",
        ] {
            assert!(!is_public(other.parse().unwrap()), "{other}");
        }
    }
}
