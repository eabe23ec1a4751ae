//! Keys with a new name. weir's keys name the thing, then its unit, then a qualifier
//! such as `_max` for a cap (`connections_max`, `age_ms_max`, `item_size_bytes_max`),
//! as the engine's constants do; keys written before that scheme still work under their old name (a
//! serde alias on the field) and are listed here, so that the one reader of the file
//! warns once per old name at start, and so that a test checks every alias is read.
//! A file that sets both names of one key is refused (a duplicate key).

/// A key renamed in `section`: a table name (`server`), `queues.*` for every
/// `[queues."PATTERN"]` table, a dotted path (`backend.jetstream`), with `[]` after
/// a part that is an array of tables (`proxy.routes[].shadows[]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renamed {
    pub section: &'static str,
    pub old: &'static str,
    pub new: &'static str,
}

const fn renamed(section: &'static str, old: &'static str, new: &'static str) -> Renamed {
    Renamed { section, old, new }
}

/// Every renamed key (docs/configuration.md, "Renamed keys").
pub const RENAMED: &[Renamed] = &[
    renamed("server", "max_connections", "connections_max"),
    renamed("server", "max_open_reads", "open_reads_max"),
    renamed("server", "max_queues", "queues_max"),
    renamed("server", "http_max_connections", "http_connections_max"),
    renamed("defaults", "max_items", "items_max"),
    renamed("defaults", "max_bytes", "bytes_max"),
    renamed("defaults", "max_item_size_bytes", "item_size_bytes_max"),
    renamed("defaults", "max_age_ms", "age_ms_max"),
    renamed("queues.*", "max_items", "items_max"),
    renamed("queues.*", "max_bytes", "bytes_max"),
    renamed("queues.*", "max_item_size_bytes", "item_size_bytes_max"),
    renamed("queues.*", "max_age_ms", "age_ms_max"),
    renamed(
        "backend.jetstream",
        "door_timeout_ms",
        "instance_timeout_ms",
    ),
    renamed(
        "backend.jetstream",
        "doors_stream_bytes",
        "instances_stream_bytes",
    ),
    renamed("backend.jetstream", "max_consumers", "consumers_max"),
    renamed("backend.jetstream", "max_ack_pending", "ack_pending_max"),
    renamed("backend.jetstream", "max_waiting", "waiting_max"),
    renamed("bus", "retry_max_ms", "retry_ms_max"),
    renamed("proxy", "body_memory_max", "body_memory_bytes_max"),
    renamed(
        "proxy.routes[].shadows[]",
        "retry_backoff_max_ms",
        "retry_backoff_ms_max",
    ),
    renamed(
        "proxy.routes[].shadows[]",
        "retry_after_max_ms",
        "retry_after_ms_max",
    ),
];

/// A renamed key a file uses: where (`queues."jobs*"`), under which old name, and
/// its new one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OldName {
    pub section: String,
    pub old: &'static str,
    pub new: &'static str,
}

/// The old names `text` uses (a file that already parsed: a text that does not
/// parse has none).
pub fn old_names_in(text: &str) -> Vec<OldName> {
    let Ok(root) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for r in RENAMED {
        for (section, table) in tables(&root, r.section) {
            if table.contains_key(r.old) {
                found.push(OldName {
                    section,
                    old: r.old,
                    new: r.new,
                });
            }
        }
    }
    found
}

/// The tables `pattern` names in `root`, with how to name each in a message.
fn tables<'a>(root: &'a toml::Table, pattern: &str) -> Vec<(String, &'a toml::Table)> {
    let mut found = vec![(String::new(), root)];
    for part in pattern.split('.') {
        let mut next = Vec::new();
        for (name, table) in found {
            let at = |key: &str| match name.is_empty() {
                true => key.to_string(),
                false => format!("{name}.{key}"),
            };
            if part == "*" {
                let children = table.iter().filter_map(|(k, v)| Some((k, v.as_table()?)));
                next.extend(children.map(|(k, t)| (at(&format!("{k:?}")), t)));
            } else if let Some(array) = part.strip_suffix("[]") {
                let Some(list) = table.get(array).and_then(|v| v.as_array()) else {
                    continue;
                };
                let elements = list.iter().filter_map(|v| v.as_table()).enumerate();
                next.extend(elements.map(|(i, t)| (at(&format!("{array}[{i}]")), t)));
            } else if let Some(t) = table.get(part).and_then(|v| v.as_table()) {
                next.push((at(part), t));
            }
        }
        found = next;
    }
    found
}
