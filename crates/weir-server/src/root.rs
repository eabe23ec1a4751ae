//! The composition root: opens the backend, starts the doors the settings ask for
//! (the memcache door, the beanstalkd door, the event bus, the proxy) and the HTTP
//! port, waits for
//! SIGTERM, SIGINT or an enabled memcache `shutdown` command, and stops them in the
//! order that loses nothing acknowledged: the backend is told first (an item a
//! closing connection gives back is not handed to another), the memcache and
//! beanstalkd doors drain their connections, the HTTP port ends, then the bus and the proxy stop (their
//! leased items go back to their queues), and the backend closes last.
//!
//! `weir serve` runs every configured door; `weir proxy` the proxy alone, with the
//! HTTP port only when asked. Each door is started and stopped through its own handle
//! (`doors.rs`); none holds another's.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use weir_memcache::{BoundListener, MemcacheDoor};
use weir_proxy::tools::captures::CaptureApi;

use crate::config::{self, BackendSettings, Settings};
use crate::doors::Door;
use crate::http::{HttpLimits, HttpPort};
use crate::signals::Signals;

/// Which doors a run starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `weir serve`: the memcache door, the HTTP port, and the bus and the proxy when
    /// configured.
    Serve,
    /// `weir proxy`: the proxy alone; the HTTP port when `http` is set.
    ProxyOnly { http: bool },
}

/// What a start opens after the store, before it serves the first client.
struct Opened {
    memcache: Option<BoundListener>,
    beanstalk: Option<weir_beanstalk::BoundListener>,
    http: Option<TcpListener>,
    bus: Option<weir_bus::BusHandle>,
    proxy: Option<weir_proxy::ProxyHandle>,
}

/// Binds the listeners and starts the bus and the proxy, as `plan` says.
async fn open_doors(
    settings: &Settings,
    backend: &Arc<weir_backend::Backend>,
    plan: Plan,
) -> anyhow::Result<Opened> {
    let memcache = match plan {
        Plan::Serve => Some(BoundListener::bind(&settings.listen).await?),
        Plan::ProxyOnly { .. } => None,
    };
    let beanstalk = match (plan, &settings.beanstalk) {
        (Plan::Serve, Some(b)) => Some(weir_beanstalk::BoundListener::bind(&b.listen).await?),
        _ => None,
    };
    let http = match plan {
        Plan::Serve | Plan::ProxyOnly { http: true } => Some(
            TcpListener::bind(&settings.http_listen)
                .await
                .with_context(|| format!("listening on {} (HTTP)", settings.http_listen))?,
        ),
        Plan::ProxyOnly { http: false } => None,
    };
    let bus = match plan {
        Plan::Serve => start_bus(settings, backend).await?,
        Plan::ProxyOnly { .. } => None,
    };
    let proxy = start_proxy(settings, backend).await?;
    Ok(Opened {
        memcache,
        beanstalk,
        http,
        bus,
        proxy,
    })
}

/// Opens the store and the doors. A signal meanwhile does not cut the start short
/// (an open cancelled half-way would go on on the blocking pool, unclosed, and a
/// bus or proxy starting would race the store's close): it is returned, and the
/// process shuts down as soon as it is started, by the graceful path. A failed
/// start closes the store.
async fn start(
    settings: &Settings,
    files_open_max: usize,
    plan: Plan,
    signals: &mut Signals,
) -> anyhow::Result<(Arc<weir_backend::Backend>, Opened, Option<&'static str>)> {
    let work = async {
        let backend = Arc::new(open_backend(settings, files_open_max).await?);
        match open_doors(settings, &backend, plan).await {
            Ok(opened) => Ok((backend, opened)),
            Err(e) => {
                if let Err(closing) = backend.close().await {
                    tracing::warn!(error = %closing, "closing the store after a failed start");
                }
                Err(e)
            }
        }
    };
    tokio::pin!(work);
    let mut signalled = None;
    loop {
        tokio::select! {
            biased;
            started = &mut work => {
                let (backend, opened) = started?;
                return Ok((backend, opened, signalled));
            }
            why = signals.recv(), if signalled.is_none() => {
                tracing::info!("{why} during start-up: stopping as soon as started");
                signalled = Some(why);
            }
        }
    }
}

/// The running doors, held by the root.
struct Running {
    backend: Arc<weir_backend::Backend>,
    memcache: Option<Arc<MemcacheDoor>>,
    beanstalk: Option<weir_beanstalk::BeanstalkDoor>,
    bus: Option<Arc<weir_bus::BusHandle>>,
    proxy: Option<Arc<weir_proxy::ProxyHandle>>,
    http: Option<tokio::task::JoinHandle<io::Result<()>>>,
    /// Tells the HTTP port to stop.
    stopping: watch::Sender<bool>,
}

/// Runs `plan` until it is shut down; returns once the store is closed. `config_path`
/// is what the memcache door's `reload` reads again.
pub async fn run(
    settings: Settings,
    plan: Plan,
    config_path: Option<PathBuf>,
) -> anyhow::Result<()> {
    // First of all: a signal from here on stops the start gracefully.
    let mut signals = Signals::install().context("installing the SIGTERM and SIGINT handlers")?;
    let files_open_max = match plan {
        Plan::Serve => files_open_max(settings.connections_max),
        Plan::ProxyOnly { .. } => settings.store.files_open_max,
    };
    let (backend, opened, signalled) = start(&settings, files_open_max, plan, &mut signals).await?;
    let reload = config_path.map(config::reload_from);
    let (running, failed) = compose(&settings, backend, opened, files_open_max, reload);
    if let Some(e) = failed {
        // The bus and the proxy may run already, and the store is open: stop them
        // all in order, then say why the start failed.
        if let Err(stop_error) = stop(running, plan).await {
            tracing::error!(error = %stop_error, "stopping after a failed start");
        }
        return Err(e);
    }
    // Signalled during the start: the graceful stop at once (a connection already
    // waiting may get its requests answered first).
    if signalled.is_none() {
        wait_for_stop(&running, &mut signals, plan).await;
    }
    stop(running, plan).await
}

/// Starts the memcache door on its bound listener and the HTTP port, and logs where
/// they listen. What runs is returned even when the memcache door could not start
/// (with the error, and no HTTP port), so that the caller stops it in order.
fn compose(
    settings: &Settings,
    backend: Arc<weir_backend::Backend>,
    opened: Opened,
    files_open_max: usize,
    reload: Option<weir_memcache::Reload>,
) -> (Running, Option<anyhow::Error>) {
    let bus = opened.bus.map(Arc::new);
    let proxy = opened.proxy.map(Arc::new);
    let (stopping, stopping_rx) = watch::channel(false);
    let memcache = match opened.memcache {
        Some(listener) => match MemcacheDoor::start(
            listener,
            Arc::clone(&backend),
            settings.memcache(files_open_max),
            reload,
        ) {
            Ok(door) => Some(Arc::new(door)),
            Err(e) => {
                let running = Running {
                    backend,
                    memcache: None,
                    beanstalk: None,
                    bus,
                    proxy,
                    http: None,
                    stopping,
                };
                return (running, Some(e));
            }
        },
        None => None,
    };
    if let Err(e) = log_listening(memcache.as_deref(), opened.http.as_ref(), settings) {
        tracing::warn!(error = %e, "could not read a listening address");
    }
    let http = opened.http.map(|listener| {
        let mut doors: Vec<Arc<dyn Door>> = Vec::new();
        if let Some(bus) = &bus {
            doors.push(Arc::clone(bus) as Arc<dyn Door>);
        }
        if let Some(proxy) = &proxy {
            doors.push(Arc::clone(proxy) as Arc<dyn Door>);
        }
        let port = HttpPort {
            backend: Arc::clone(&backend),
            memcache: memcache.clone(),
            doors,
            captures: CaptureApi::new(
                Arc::clone(&backend),
                settings.admin_key.as_ref().map(|k| k.expose().to_owned()),
                proxy.clone(),
            ),
            stopping: stopping_rx,
            evicted: Default::default(),
            gathering: Default::default(),
        };
        spawn_http(listener, port, settings)
    });
    let running = Running {
        beanstalk: start_beanstalk(opened.beanstalk, &backend, settings),
        backend,
        memcache,
        bus,
        proxy,
        http,
        stopping,
    };
    (running, None)
}

/// Starts the beanstalkd door on its bound listener, when there is one.
fn start_beanstalk(
    listener: Option<weir_beanstalk::BoundListener>,
    backend: &Arc<weir_backend::Backend>,
    settings: &Settings,
) -> Option<weir_beanstalk::BeanstalkDoor> {
    let listener = listener?;
    let door_settings = settings.beanstalk.clone().unwrap_or_default();
    let door = weir_beanstalk::BeanstalkDoor::start(listener, Arc::clone(backend), door_settings);
    tracing::info!(beanstalk = %door.local_addr(), "listening");
    Some(door)
}

/// Serves the HTTP port on `listener` within the settings' limits.
fn spawn_http(
    listener: TcpListener,
    port: HttpPort,
    settings: &Settings,
) -> tokio::task::JoinHandle<io::Result<()>> {
    let limits = HttpLimits {
        max_connections: settings.http_connections_max,
        header_timeout: Duration::from_millis(settings.http_header_timeout_ms),
    };
    tokio::spawn(crate::http::serve(listener, Arc::new(port), limits))
}

/// Waits for SIGTERM, SIGINT, or an enabled memcache `shutdown` command.
async fn wait_for_stop(running: &Running, signals: &mut Signals, plan: Plan) {
    let requested = async {
        match &running.memcache {
            Some(memcache) => memcache.shutdown_requested().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        why = signals.recv() => match plan {
            Plan::Serve => tracing::info!("{why}: shutting down"),
            Plan::ProxyOnly { .. } => tracing::info!("{why}: stopping the proxy"),
        },
        () = requested => {}
    }
}

/// The stop, in order: the backend told first, the memcache door drained, the HTTP
/// port ended, the bus and the proxy stopped, the backend closed.
async fn stop(running: Running, plan: Plan) -> anyhow::Result<()> {
    running.backend.begin_shutdown();
    if let Some(memcache) = &running.memcache {
        Door::begin_shutdown(memcache.as_ref());
    }
    if let Some(beanstalk) = &running.beanstalk {
        beanstalk.begin_shutdown();
    }
    running.stopping.send_replace(true);
    if let Some(memcache) = running.memcache {
        memcache.stopped().await;
    }
    if let Some(beanstalk) = running.beanstalk {
        beanstalk.stopped().await;
    }
    // The HTTP port began its drain at the shutdown, and ends it within its grace.
    if let Some(http) = running.http {
        match tokio::time::timeout(crate::http::STOP_WAIT, http).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP server"),
            Err(_) => tracing::warn!("HTTP server did not stop in time"),
            _ => {}
        }
    }
    if plan == Plan::Serve && (running.bus.is_some() || running.proxy.is_some()) {
        tracing::info!("stopping the bus and the proxy");
    }
    // Each stops itself, the bus first: deliveries and replays in flight end, leased
    // items go back to their queues, before the store closes.
    if let Some(bus) = running.bus {
        stop_door(bus).await;
    }
    if let Some(proxy) = running.proxy {
        stop_door(proxy).await;
    }
    tracing::info!(backend = running.backend.kind_name(), "closing the store");
    running.backend.close().await.context("closing the store")?;
    tracing::info!("stopped");
    Ok(())
}

async fn stop_door(door: Arc<dyn Door>) {
    door.begin_shutdown();
    door.stopped().await;
}

/// The one `listening` line, once the ports are bound.
fn log_listening(
    memcache: Option<&MemcacheDoor>,
    http: Option<&TcpListener>,
    settings: &Settings,
) -> io::Result<()> {
    match (memcache, http) {
        (Some(memcache), Some(http)) => tracing::info!(
            memcache = %memcache.local_addr(),
            http = %http.local_addr()?,
            data_dir = %settings.data_dir.display(),
            threads = settings.threads,
            connections_max = settings.connections_max,
            "listening"
        ),
        (None, Some(http)) => tracing::info!(http = %http.local_addr()?, "listening"),
        _ => {}
    }
    Ok(())
}

/// Starts the event bus when the settings enable it, on its own runtime (started
/// from the blocking pool: a runtime cannot be built on this one's thread). Its
/// queues are the backend's; its metadata is a file in the data directory on the
/// embedded engine, and in the cluster on JetStream (where one door serves it).
async fn start_bus(
    settings: &Settings,
    backend: &Arc<weir_backend::Backend>,
) -> anyhow::Result<Option<weir_bus::BusHandle>> {
    let Some(bus_settings) = settings.bus.clone() else {
        return Ok(None);
    };
    let backend = Arc::clone(backend);
    let meta_dir = settings.data_dir.clone();
    let handle =
        tokio::task::spawn_blocking(move || weir_bus::start(backend, meta_dir, bus_settings))
            .await
            .context("starting the bus")??;
    Ok(Some(handle))
}

/// Starts the proxy when the settings configure it (from the blocking pool, as
/// the bus).
async fn start_proxy(
    settings: &Settings,
    backend: &Arc<weir_backend::Backend>,
) -> anyhow::Result<Option<weir_proxy::ProxyHandle>> {
    let Some(proxy_settings) = settings.proxy.clone() else {
        return Ok(None);
    };
    let backend = Arc::clone(backend);
    let handle = tokio::task::spawn_blocking(move || weir_proxy::start(backend, proxy_settings))
        .await
        .context("starting the proxy")??;
    Ok(Some(handle))
}

/// Opens the backend the settings name: the embedded store on the blocking pool
/// (recovery reads the disk), or a connection to the JetStream cluster.
pub async fn open_backend(
    settings: &Settings,
    files_open_max: usize,
) -> anyhow::Result<weir_backend::Backend> {
    let mut options = settings.store.clone();
    options.files_open_max = files_open_max;
    if let BackendSettings::JetStream(js) = &settings.backend {
        return connect_jetstream(settings, js, options).await;
    }
    let dir = settings.data_dir.clone();
    let store = tokio::task::spawn_blocking(move || weir::Store::open_with(&dir, options))
        .await
        .context("opening the store")?
        .with_context(|| format!("opening the data directory {}", settings.data_dir.display()))?;
    Ok(weir_backend::Backend::Embedded(
        weir_backend::Embedded::new(store),
    ))
}

/// A connection to the JetStream cluster the settings name.
#[cfg(feature = "jetstream")]
async fn connect_jetstream(
    settings: &Settings,
    js: &weir_backend::JetStreamConfig,
    options: weir::StoreOptions,
) -> anyhow::Result<weir_backend::Backend> {
    for key in &settings.ignored {
        tracing::warn!(
            key,
            "ignored on the jetstream backend: the cluster's settings decide"
        );
    }
    let servers = js.servers.join(",");
    let backend = weir_backend::jetstream::JetStream::connect(js.clone(), options)
        .await
        .with_context(|| format!("connecting to JetStream at {servers}"))?;
    Ok(weir_backend::Backend::JetStream(backend))
}

/// A build without JetStream: the settings are refused when resolved
/// (`config::BackendSection::resolve`); this is never reached, but answers as they do.
#[cfg(not(feature = "jetstream"))]
async fn connect_jetstream(
    _settings: &Settings,
    _js: &weir_backend::JetStreamConfig,
    _options: weir::StoreOptions,
) -> anyhow::Result<weir_backend::Backend> {
    anyhow::bail!(weir_backend::NO_JETSTREAM)
}

/// Descriptors the process keeps for other things than queue files and memcache
/// connections: the listeners, HTTP connections, the log, short-lived opens.
const FILES_RESERVED: usize = 256;
/// The least budget of queue files, however few descriptors are left.
const FILES_FOR_QUEUES_MIN: usize = 64;

/// The store's descriptor budget (`StoreOptions::files_open_max`): the open-files
/// limit (raised to the hard limit at start) less what `connections_max` and the rest
/// of the server may need, so that queues and clients cannot together run out.
fn files_open_max(max_connections: usize) -> usize {
    let limit = weir::open_files_limit();
    let left = limit.saturating_sub(max_connections.saturating_add(FILES_RESERVED));
    if left < FILES_FOR_QUEUES_MIN {
        tracing::warn!(
            open_files_limit = limit,
            max_connections,
            "few descriptors left for queue files, which will close and reopen often: raise the hard limit or lower max_connections"
        );
    }
    let budget = left.max(FILES_FOR_QUEUES_MIN);
    tracing::info!(
        open_files_limit = limit,
        queue_files_max = budget,
        "descriptor budget"
    );
    budget
}
