//! `weir-bench proxy`: rocky's benchmark suites against weir's proxy, nginx with
//! `mirror` to the same targets (started by the benchmark when `nginx` is found),
//! and the primary hit directly, in the same run. The primary answers `Hello
//! world!` without reading the body; the shadows never answer. Load is open-loop
//! at a constant rate (latency from the scheduled time, HDR histograms), except the
//! throughput step (64 connections, closed loop). Then weir's RSS over a long run
//! at 100 req/s with the shadows never answering; last, on a fresh weir, its RSS
//! under many concurrent slow uploads (`proxy_upload.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use indicatif::ProgressBar;

use crate::proxy_http::{closed_loop, open_loop, Load};
use crate::report::{f, mib, Report, Row};
use crate::sys::{free_addr, helper, wait_listening, Proc};
use crate::target::{Binaries, Kind, Target};

pub struct ProxyParams {
    pub seconds: f64,
    pub throughput_seconds: f64,
    pub throughput_connections: usize,
    pub soak_seconds: f64,
    /// Rounds of the replay-cost step.
    pub rounds: usize,
    pub nginx: Option<PathBuf>,
    pub uploads: crate::proxy_upload::UploadParams,
    /// Only the upload step.
    pub uploads_only: bool,
}

/// Everything under test: the targets, weir's two listeners, nginx's two servers.
struct Bench {
    primary: SocketAddr,
    weir: Target,
    weir_plain: SocketAddr,
    weir_mirror: SocketAddr,
    nginx: Option<(Proc, SocketAddr, SocketAddr, tempfile::TempDir)>,
    _procs: Vec<Proc>,
    _config: tempfile::NamedTempFile,
}

fn weir_config(
    primary: SocketAddr,
    shadows: [SocketAddr; 2],
    plain: SocketAddr,
    mirror: SocketAddr,
) -> String {
    format!(
        "[[proxy.listen]]\nname = \"plain\"\naddr = \"{plain}\"\n[[proxy.listen]]\nname = \"mirror\"\naddr = \"{mirror}\"\n\
         [[proxy.routes]]\nname = \"plain\"\nlisten = [\"plain\"]\ntargets = [\"http://{primary}\"]\n\
         [[proxy.routes]]\nname = \"mirror\"\nlisten = [\"mirror\"]\ntargets = [\"http://{primary}\"]\n\
         [[proxy.routes.shadows]]\nname = \"one\"\nurl = \"http://{}\"\ntimeout_ms = 10000\n\
         [[proxy.routes.shadows]]\nname = \"two\"\nurl = \"http://{}\"\ntimeout_ms = 10000\n",
        shadows[0], shadows[1]
    )
}

/// nginx's configuration: `@D@` its directory, `@PRIMARY@`, `@S1@`, `@S2@`,
/// `@PLAIN@` and `@MIRROR@` the addresses. The mirror server sends each request to
/// both shadows (`mirror`, with the body) and to the primary.
const NGINX_CONF: &str = r#"daemon off;
worker_processes auto;
pid @D@/nginx.pid;
error_log @D@/error.log;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path @D@/body;
    proxy_temp_path @D@/proxy;
    fastcgi_temp_path @D@/fcgi;
    uwsgi_temp_path @D@/uwsgi;
    scgi_temp_path @D@/scgi;
    client_max_body_size 10m;
    upstream primary { server @PRIMARY@; keepalive 128; }
    server {
        listen @PLAIN@;
        location / { proxy_pass http://primary; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
    server {
        listen @MIRROR@;
        location / {
            mirror /mirror1;
            mirror /mirror2;
            mirror_request_body on;
            proxy_pass http://primary; proxy_http_version 1.1; proxy_set_header Connection "";
        }
        location = /mirror1 { internal; proxy_pass http://@S1@$request_uri; proxy_connect_timeout 2s; proxy_read_timeout 10s; proxy_send_timeout 10s; }
        location = /mirror2 { internal; proxy_pass http://@S2@$request_uri; proxy_connect_timeout 2s; proxy_read_timeout 10s; proxy_send_timeout 10s; }
    }
}
"#;

fn nginx_config(
    dir: &std::path::Path,
    primary: SocketAddr,
    shadows: [SocketAddr; 2],
    plain: SocketAddr,
    mirror: SocketAddr,
) -> String {
    NGINX_CONF
        .replace("@D@", &dir.display().to_string())
        .replace("@PRIMARY@", &primary.to_string())
        .replace("@S1@", &shadows[0].to_string())
        .replace("@S2@", &shadows[1].to_string())
        .replace("@PLAIN@", &plain.to_string())
        .replace("@MIRROR@", &mirror.to_string())
}

fn start(bins: &Binaries, nginx: Option<&PathBuf>) -> Result<Bench> {
    let (p1, primary) = helper("hello-http")?;
    let (p2, s1) = helper("silent-http")?;
    let (p3, s2) = helper("silent-http")?;
    let (weir_plain, weir_mirror) = (free_addr()?, free_addr()?);
    let config = tempfile::Builder::new()
        .prefix("weir-bench-proxy-")
        .suffix(".toml")
        .tempfile()?;
    std::fs::write(
        config.path(),
        weir_config(primary, [s1, s2], weir_plain, weir_mirror),
    )?;
    let mut bins = bins.clone();
    bins.weir_args
        .extend(["--config".to_string(), config.path().display().to_string()]);
    let weir = Target::spawn(Kind::Weir, &bins)?;
    wait_listening(weir_mirror, "weir's proxy")?;
    let nginx = match nginx {
        Some(bin) => {
            let dir = tempfile::Builder::new()
                .prefix("weir-bench-nginx-")
                .tempdir()?;
            let (plain, mirror) = (free_addr()?, free_addr()?);
            let conf = dir.path().join("nginx.conf");
            std::fs::write(
                &conf,
                nginx_config(dir.path(), primary, [s1, s2], plain, mirror),
            )?;
            let child = Command::new(bin)
                .args([
                    "-c",
                    &conf.display().to_string(),
                    "-p",
                    &dir.path().display().to_string(),
                ])
                .stdin(Stdio::null())
                .spawn()
                .context("starting nginx")?;
            let proc = Proc(child);
            wait_listening(mirror, "nginx")?;
            Some((proc, plain, mirror, dir))
        }
        None => None,
    };
    Ok(Bench {
        primary,
        weir,
        weir_plain,
        weir_mirror,
        nginx,
        _procs: vec![p1, p2, p3],
        _config: config,
    })
}

fn row(suite: &str, target: &str, l: &Load) -> Row {
    Row::new()
        .with("suite", suite.to_string())
        .with("target", target.to_string())
        .with("sent", l.sent)
        .with("ok", l.ok)
        .with(
            "success_%",
            f(100.0 * l.ok as f64 / l.sent.max(1) as f64, 1),
        )
        .with("p50_ms", f(l.ms(0.5), 3))
        .with("p90_ms", f(l.ms(0.9), 3))
        .with("p99_ms", f(l.ms(0.99), 3))
        .with("max_ms", f(l.latency_us.max() as f64 / 1000.0, 3))
}

pub async fn run(p: &ProxyParams, bins: &Binaries, steps: &ProgressBar) -> Result<Vec<Report>> {
    if p.uploads_only {
        steps.set_length(1);
        steps.set_message("concurrent slow uploads".to_string());
        return Ok(vec![crate::proxy_upload::run(bins, &p.uploads).await?]);
    }
    steps.set_length(8);
    let b = start(bins, p.nginx.as_ref())?;
    let mut latency = Report::new(
        "proxy-latency",
        "proxy: open-loop latency (ms, from the scheduled time)",
    );
    let url = |a: SocketAddr, path: &str| format!("http://{a}{path}");
    let small = Bytes::from(vec![b'a'; 1_723]);
    let large = Bytes::from(vec![b'b'; 234_183]);
    let suites: [(&str, &str, Bytes, f64, bool); 4] = [
        ("forward GET 100/s", "GET", Bytes::new(), 100.0, false),
        ("forward+replay GET 100/s", "GET", Bytes::new(), 100.0, true),
        ("forward+replay 1,723 B 50/s", "POST", small, 50.0, true),
        ("forward+replay 234,183 B 50/s", "POST", large, 50.0, true),
    ];
    for (suite, method, body, rate, mirror) in suites {
        steps.set_message(suite.to_string());
        let mut targets: Vec<(&str, SocketAddr)> =
            vec![("weir", if mirror { b.weir_mirror } else { b.weir_plain })];
        if let Some((_, plain, m, _)) = &b.nginx {
            targets.push(("nginx", if mirror { *m } else { *plain }));
        }
        if !mirror {
            targets.push(("direct", b.primary));
        }
        for (name, addr) in targets {
            let l = open_loop(&url(addr, "/bench"), method, body.clone(), rate, p.seconds).await?;
            latency.rows.push(row(suite, name, &l));
        }
        steps.inc(1);
    }
    notes(&mut latency);
    steps.set_message("replay cost, rounds in rotating order".to_string());
    let cost = replay_cost(&b, p).await?;
    steps.inc(1);
    steps.set_message("throughput, 64 connections".to_string());
    let throughput = throughput(&b, p).await?;
    steps.inc(1);
    steps.set_message("memory over time".to_string());
    let rss = soak(&b, p).await?;
    steps.inc(1);
    drop(b);
    steps.set_message("concurrent slow uploads".to_string());
    let uploads = crate::proxy_upload::run(bins, &p.uploads).await?;
    steps.inc(1);
    Ok(vec![latency, cost, throughput, rss, uploads])
}

/// What replay to the silent shadows costs a client: forward GET at 100/s through
/// weir's route without shadows, through its route with them, and to the primary
/// directly, `rounds` times in rotating order (a single 10 s run's p99 is its tenth
/// worst request, and this machine's drift between runs is larger than the effect);
/// the medians of the rounds' p99s are compared.
async fn replay_cost(b: &Bench, p: &ProxyParams) -> Result<Report> {
    let mut r = Report::new(
        "proxy-replay-cost",
        format!(
            "proxy: forward GET 100/s p99 without and with replay to 2 silent shadows, {} rounds in rotating order",
            p.rounds
        ),
    );
    let contenders = [
        ("weir", b.weir_plain),
        ("weir+replay", b.weir_mirror),
        ("direct", b.primary),
    ];
    let mut p99s: [Vec<f64>; 3] = Default::default();
    for round in 0..p.rounds {
        for k in 0..contenders.len() {
            let i = (round + k) % contenders.len();
            let (name, addr) = contenders[i];
            let url = format!("http://{addr}/bench");
            let l = open_loop(&url, "GET", Bytes::new(), 100.0, p.seconds).await?;
            p99s[i].push(l.ms(0.99));
            r.rows.push(
                Row::new()
                    .with("round", round as u64 + 1)
                    .with("target", name)
                    .with("ok", l.ok)
                    .with("p50_ms", f(l.ms(0.5), 3))
                    .with("p99_ms", f(l.ms(0.99), 3)),
            );
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let [mut plain, mut replay, mut direct] = p99s;
    let (plain, replay, direct) = (median(&mut plain), median(&mut replay), median(&mut direct));
    r.notes.push(format!(
        "median p99: weir {plain:.3} ms, weir with replay {replay:.3} ms ({:+.1}%, goal <= +5%), direct {direct:.3} ms",
        100.0 * (replay / plain - 1.0)
    ));
    Ok(r)
}

/// The goals, from the rows.
fn notes(r: &mut Report) {
    let p99 = |suite: &str, target: &str| {
        r.rows
            .iter()
            .find(|x| {
                x.get("suite").is_some_and(|c| c.text() == suite)
                    && x.get("target").is_some_and(|c| c.text() == target)
            })
            .and_then(|x| x.get("p99_ms").and_then(|c| c.as_f64()))
    };
    if let (Some(fwd), Some(rep)) = (
        p99("forward GET 100/s", "weir"),
        p99("forward+replay GET 100/s", "weir"),
    ) {
        r.notes.push(format!("weir forward p99 {fwd:.3} ms (goal <= 2 ms; rocky 19 ms here, seed 41.9 ms); with replay to 2 silent shadows {rep:.3} ms: {:+.1}% (goal <= +5%)", 100.0 * (rep / fwd - 1.0)));
    }
}

async fn throughput(b: &Bench, p: &ProxyParams) -> Result<Report> {
    let mut r = Report::new(
        "proxy-throughput",
        format!(
            "proxy: closed loop, {} connections, GET, replay to 2 silent shadows",
            p.throughput_connections
        ),
    );
    let mut targets = vec![("weir", b.weir_mirror)];
    if let Some((_, _, m, _)) = &b.nginx {
        targets.push(("nginx", *m));
    }
    let mut rates = Vec::new();
    for (name, addr) in targets {
        let l = closed_loop(
            &format!("http://{addr}/bench"),
            p.throughput_connections,
            p.throughput_seconds,
        )
        .await?;
        let rate = l.ok as f64 / l.seconds;
        rates.push(rate);
        r.rows.push(
            Row::new()
                .with("target", name)
                .with("requests", l.sent)
                .with("ok", l.ok)
                .with("req/s", f(rate, 0))
                .with("p50_ms", f(l.ms(0.5), 3))
                .with("p99_ms", f(l.ms(0.99), 3)),
        );
    }
    if rates.len() == 2 {
        r.notes.push(format!(
            "weir / nginx with mirror: {:.2} (goal >= 0.8)",
            rates[0] / rates[1]
        ));
    }
    Ok(r)
}

/// weir's RSS every tenth of the soak while 100 req/s go through the mirror route.
async fn soak(b: &Bench, p: &ProxyParams) -> Result<Report> {
    let mut r = Report::new(
        "proxy-rss",
        format!(
            "proxy: weir's RSS at 100 req/s with 2 silent shadows, {:.0} s",
            p.soak_seconds
        ),
    );
    let url = format!("http://{}/bench", b.weir_mirror);
    let seconds = p.soak_seconds;
    let load =
        tokio::spawn(async move { open_loop(&url, "GET", Bytes::new(), 100.0, seconds).await });
    let started = Instant::now();
    let step = p.soak_seconds / 10.0;
    for i in 0..=10 {
        let at = Duration::from_secs_f64(step * i as f64);
        tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
        r.rows.push(
            Row::new()
                .with("target", "weir")
                .with("second", f(started.elapsed().as_secs_f64(), 0))
                .with("rss_bytes", b.weir.rss_bytes())
                .with("rss_mib", mib(b.weir.rss_bytes())),
        );
    }
    let l = load.await??;
    let rss: Vec<f64> = r
        .rows
        .iter()
        .filter_map(|x| x.get("rss_bytes").and_then(|c| c.as_f64()))
        .collect();
    let spread =
        rss.iter().cloned().fold(f64::MIN, f64::max) - rss.iter().cloned().fold(f64::MAX, f64::min);
    r.notes.push(format!(
        "RSS spread {:.1} MiB over the run (goal <= 5 MB); {} of {} requests ok",
        spread / 1048576.0,
        l.ok,
        l.sent
    ));
    Ok(r)
}
