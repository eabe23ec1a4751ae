//! The HTTP port's capture endpoints, what `weir capture export/import` and `weir
//! replay --server` talk to while weir runs (the data directory is locked then, so
//! the command line cannot open it):
//!
//! - `GET /captures/{queue}?since=MS&limit=N` streams the kept captures of a capture
//!   queue as JSON lines (`crate::capture_file`), without consuming anything:
//!   those received at or after `since` (Unix ms), at most `limit`. An export that
//!   fails midway (an I/O error, a shutdown) breaks the response off, so a client
//!   never takes a partial export for a whole one.
//! - `POST /captures/{queue}` appends the captures of a JSON-lines body, checked
//!   first: a bad line is a 400 that names it, and then nothing is appended; a good
//!   body is appended in one batch, all or nothing. The queue is created if needed.
//! - `GET /proxy/diffs`: what the proxy's diffing shadows found (JSON, see
//!   `crate::RouteReport`), for `weir diff report`; 404 when no proxy runs.
//! - `POST /proxy/dead-letters/{route}/{shadow}/redrive`: starts replaying again the
//!   dead letters of a shadow (`{"redriving": N, "queue": ...}`); 404 for a shadow
//!   the running proxy does not have, 409 while one runs for it.
//!
//! Both go through the backend interface, so they work alike on either backend. An
//! export walks the queue (on JetStream a queue that does not exist exports nothing,
//! and each line costs a round trip). An import ([`append_captures`]) gives the queue
//! a `record` reader that keeps what is imported, as a recording route's does, and
//! appends the captures: one all-or-nothing batch on the embedded engine, one
//! publish each on JetStream (a failure part-way says how many went in).
//!
//! Captures hold what clients sent, cookies and tokens included (and diff samples,
//! pieces of answers), so the endpoints are
//! off (403, saying why) unless an admin key is set (`[server] admin_key` or
//! `WEIR_ADMIN_KEY`), and then want `Authorization: Bearer KEY` (401 otherwise; the
//! key is compared in time that does not depend on the guess). Only queues named
//! `proxy:capture:*` are served. Limits: a body of at most [`IMPORT_BYTES_MAX`]
//! (413), read within [`IMPORT_BODY_TIMEOUT`] (408), lines of at most
//! `capture_file::LINE_BYTES_MAX`; one import at a time (the others wait their
//! turn); [`EXPORTS_MAX`] exports at once (503 past it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::capture_file::{self, LineError, LINE_BYTES_MAX};
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http_body_util::{BodyExt, Limited};
use serde_json::json;
use tokio::sync::{mpsc, Semaphore};

use crate::ProxyHandle;

/// The queues these endpoints serve: the proxy's capture queues.
pub const CAPTURE_QUEUE_PREFIX: &str = "proxy:capture:";
/// Largest import body: `weir capture import` sends a file in pieces under it.
pub const IMPORT_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Time an import body has to arrive whole.
pub const IMPORT_BODY_TIMEOUT: Duration = Duration::from_secs(120);
/// Exports running at once.
pub const EXPORTS_MAX: usize = 4;
/// Lines an export reads ahead of a slow client.
const EXPORT_LINES_AHEAD: usize = 16;

static IMPORTS: Semaphore = Semaphore::const_new(1);
static EXPORTS: Semaphore = Semaphore::const_new(EXPORTS_MAX);

/// What the endpoints need of the process they run in: the backend, the admin key
/// and the proxy, if one runs. Its own type, so the endpoints need nothing of the
/// other doors.
pub struct CaptureApi {
    pub backend: Arc<weir_backend::Backend>,
    /// The key the endpoints want; none turns them off (403).
    pub admin_key: Option<String>,
    pub proxy: Option<Arc<ProxyHandle>>,
    /// Set by [`CaptureApi::begin_shutdown`]: exports in flight break off.
    stopping: AtomicBool,
}

impl CaptureApi {
    pub fn new(
        backend: Arc<weir_backend::Backend>,
        admin_key: Option<String>,
        proxy: Option<Arc<ProxyHandle>>,
    ) -> Arc<CaptureApi> {
        Arc::new(CaptureApi {
            backend,
            admin_key,
            proxy,
            stopping: AtomicBool::new(false),
        })
    }

    /// The process is stopping: exports in flight break off (so a client never
    /// takes a partial export for a whole one).
    pub fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

/// The endpoints, to merge into the HTTP port's router.
pub fn router(api: Arc<CaptureApi>) -> Router {
    Router::new()
        .route("/captures/{queue}", get(export).post(import))
        .route("/proxy/diffs", get(diffs))
        .route(
            "/proxy/dead-letters/{route}/{shadow}/redrive",
            axum::routing::post(redrive),
        )
        .with_state(api)
}

/// `POST /proxy/dead-letters/{route}/{shadow}/redrive`: a re-drive of a shadow's
/// dead letters, started.
async fn redrive(
    State(shared): State<Arc<CaptureApi>>,
    Path((route, shadow)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = authorize(&shared, &headers) {
        return refused.into_response();
    }
    let Some(proxy) = &shared.proxy else {
        return refuse(StatusCode::NOT_FOUND, "no proxy runs in this weir").into_response();
    };
    match proxy.redrive(&route, &shadow).await {
        Ok(n) => Json(json!({
            "redriving": n,
            "queue": crate::dead_queue(&route, &shadow),
        }))
        .into_response(),
        Err(e) => {
            let status = match e {
                crate::RedriveError::NotFound => StatusCode::NOT_FOUND,
                crate::RedriveError::Running => StatusCode::CONFLICT,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            refuse(status, &e.to_string()).into_response()
        }
    }
}

/// `GET /proxy/diffs`: the diff report of the running proxy.
async fn diffs(State(shared): State<Arc<CaptureApi>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&shared, &headers) {
        return refused.into_response();
    }
    match &shared.proxy {
        Some(proxy) => Json(proxy.diff_report()).into_response(),
        None => refuse(StatusCode::NOT_FOUND, "no proxy runs in this weir").into_response(),
    }
}

/// A refusal: a status and a JSON body that says why.
struct Refusal {
    status: StatusCode,
    body: serde_json::Value,
    /// Set on 401s.
    challenge: bool,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body)).into_response();
        if self.challenge {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

fn refuse(status: StatusCode, reason: &str) -> Refusal {
    Refusal {
        status,
        body: json!({ "error": reason }),
        challenge: false,
    }
}

/// The admin key's check: 403 when none is set, 401 without the right one.
fn authorize(shared: &CaptureApi, headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(key) = &shared.admin_key else {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "the capture endpoints are off: no admin key is set ([server] admin_key or WEIR_ADMIN_KEY)",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let reason = match given {
        Some(token) if same_secret(token.as_bytes(), key.as_bytes()) => return Ok(()),
        Some(_) => "wrong admin key",
        None => "the admin key is needed: Authorization: Bearer KEY",
    };
    Err(Refusal {
        challenge: true,
        ..refuse(StatusCode::UNAUTHORIZED, reason)
    })
}

/// Compares a guess with the key in a time that depends on the key's length only.
fn same_secret(given: &[u8], key: &[u8]) -> bool {
    let mut diff = given.len() ^ key.len();
    for (i, k) in key.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(0) ^ k);
    }
    diff == 0
}

fn check_queue(queue: &str) -> Result<(), Refusal> {
    let ok = queue
        .strip_prefix(CAPTURE_QUEUE_PREFIX)
        .is_some_and(|route| !route.is_empty())
        && weir::validate_queue_name(queue).is_ok();
    if ok {
        Ok(())
    } else {
        Err(refuse(
            StatusCode::NOT_FOUND,
            &format!("only capture queues ({CAPTURE_QUEUE_PREFIX}ROUTE) are served, not {queue:?}"),
        ))
    }
}

/// A backend failure as a refusal (a cluster out of reach is a 503).
fn backend_error(e: &weir_backend::Error) -> Refusal {
    use weir_backend::Kind as K;
    let status = match e.kind() {
        K::InvalidName | K::InvalidArgument => StatusCode::BAD_REQUEST,
        K::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        K::Full | K::DiskFull => StatusCode::INSUFFICIENT_STORAGE,
        K::Closed | K::TooManyQueues | K::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        K::Unsupported => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refuse(status, &e.to_string())
}

/// `since` and `limit` from an export's query.
fn export_params(query: Option<&str>) -> Result<(Option<u64>, Option<u64>), String> {
    let (mut since, mut limit) = (None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let number = value
            .parse::<u64>()
            .map_err(|_| format!("{key}: a whole number, not {value:?}"))?;
        match key {
            "since" => since = Some(number),
            "limit" if number > 0 => limit = Some(number),
            "limit" => return Err("limit: at least 1".into()),
            _ => return Err(format!("unknown parameter {key:?} (since, limit)")),
        }
    }
    Ok((since, limit))
}

async fn export(
    State(shared): State<Arc<CaptureApi>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    authorize(&shared, &headers)?;
    check_queue(&queue)?;
    let (since, limit) =
        export_params(query.as_deref()).map_err(|r| refuse(StatusCode::BAD_REQUEST, &r))?;
    let permit = EXPORTS.try_acquire().map_err(|_| {
        refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("{EXPORTS_MAX} exports are running; try again when one is done"),
        )
    })?;
    let scan = shared
        .backend
        .scan(&queue, capture_file::scan_from(since))
        .await
        .map_err(|e| match e.kind() {
            weir_backend::Kind::NotFound => {
                refuse(StatusCode::NOT_FOUND, &format!("no queue {queue}"))
            }
            _ => backend_error(&e),
        })?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(EXPORT_LINES_AHEAD);
    tokio::spawn(async move {
        let _permit = permit;
        let mut stopped = false;
        let result = capture_file::walk_scan(scan, &queue, since, limit, |line| {
            stopped = shared.is_stopping();
            let tx = &tx;
            let stop = stopped;
            async move { !stop && tx.send(Ok(Bytes::from(line))).await.is_ok() }
        })
        .await;
        let failure = match result {
            Err(e) => Some(e.to_string()),
            Ok(_) if stopped => Some("weir is stopping".to_string()),
            Ok(_) => None,
        };
        if let Some(reason) = failure {
            tracing::warn!(queue, "export broken off: {reason}");
            let _ = tx.send(Err(std::io::Error::other(reason))).await;
        }
    });
    let lines = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|line| (line, rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

async fn import(
    State(shared): State<Arc<CaptureApi>>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    authorize(&shared, &headers)?;
    check_queue(&queue)?;
    let _turn = IMPORTS
        .acquire()
        .await
        .map_err(|_| refuse(StatusCode::SERVICE_UNAVAILABLE, "imports are closed"))?;
    let text = read_body(body).await?;
    // Every line is checked before anything is appended.
    let items = tokio::task::spawn_blocking(move || capture_file::items_of(&text, LINE_BYTES_MAX))
        .await
        .map_err(|_| refuse(StatusCode::INTERNAL_SERVER_ERROR, "the import failed"))?
        .map_err(bad_line)?;
    let first = append_captures(&shared.backend, &queue, &items)
        .await
        .map_err(|e| backend_error(&e))?;
    Ok(Json(json!({ "imported": items.len(), "first_seq": first })).into_response())
}

/// Appends checked captures (`capture_file::items_of`) to the capture queue `queue`,
/// created if missing, and returns the first one's sequence number (`None` for no
/// capture, when nothing is made). What is imported is kept by the queue's `record`
/// reader (made at the queue's oldest item if missing, before the append: a refused
/// import can leave it), as a recording route's captures are, so it stays until
/// dropped by hand (`delete QUEUE.record`), by the queue's limits, or on the engine by
/// a proxy whose route over the queue does not record (on JetStream nothing would be
/// stored without a reader). The queue's leases never time out, as every capture
/// queue's. One batch on the engine, all or nothing; one publish each on JetStream, a
/// failure part-way saying how many went in (see [`weir_backend::Queue::append_batch`]).
pub async fn append_captures(
    backend: &weir_backend::Backend,
    queue: &str,
    items: &[Vec<u8>],
) -> weir_backend::Result<Option<u64>> {
    if items.is_empty() {
        return Ok(None);
    }
    let (q, _) = backend
        .queue_for_readers_with(
            queue,
            &[crate::RECORD_READER],
            false,
            weir_backend::QueueOptions::NO_LEASE_TIMEOUT,
        )
        .await?;
    let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
    let first = q
        .append_batch(&refs, weir_backend::AppendOptions::default())
        .await?;
    Ok(Some(first))
}

/// An import's body, whole, within the size and time limits.
async fn read_body(body: Body) -> Result<Bytes, Refusal> {
    let over = || {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("a body over the limit of {IMPORT_BYTES_MAX} bytes: send the captures in several requests (weir capture import does)"),
        )
    };
    // A declared length says it before a byte is read.
    if axum::body::HttpBody::size_hint(&body).lower() > IMPORT_BYTES_MAX as u64 {
        return Err(over());
    }
    let read = Limited::new(body, IMPORT_BYTES_MAX).collect();
    match tokio::time::timeout(IMPORT_BODY_TIMEOUT, read).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(over()),
        Ok(Err(_)) => Err(refuse(StatusCode::BAD_REQUEST, "the body broke off")),
        Err(_) => Err(refuse(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the body did not arrive within {} s",
                IMPORT_BODY_TIMEOUT.as_secs()
            ),
        )),
    }
}

fn bad_line(e: LineError) -> Refusal {
    let reason = format!("{e}; nothing was imported");
    Refusal {
        status: StatusCode::BAD_REQUEST,
        body: json!({ "error": reason, "line": e.line }),
        challenge: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same_secret(b"0123456789abcdeX", b"0123456789abcdef"));
        assert!(!same_secret(b"0123456789abcde", b"0123456789abcdef"));
        assert!(!same_secret(b"0123456789abcdef0", b"0123456789abcdef"));
        assert!(!same_secret(b"", b"0123456789abcdef"));
    }

    #[test]
    fn only_capture_queues_and_known_parameters() {
        assert!(check_queue("proxy:capture:api").is_ok());
        for bad in ["proxy:capture:", "jobs", "bus:topic:x", "proxy:capture:a/b"] {
            assert!(check_queue(bad).is_err(), "{bad}");
        }
        assert_eq!(export_params(None).unwrap(), (None, None));
        assert_eq!(
            export_params(Some("since=5&limit=2")).unwrap(),
            (Some(5), Some(2))
        );
        for bad in ["since=x", "limit=0", "limit=-1", "other=1", "since"] {
            assert!(export_params(Some(bad)).is_err(), "{bad}");
        }
    }
}
