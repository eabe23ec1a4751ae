use std::time::Duration;

use weir::Durability;

use super::settings::CoreShare;
use super::*;

#[test]
fn the_doors_share_the_cores() {
    let shares = |cpus, doors| {
        let s = CoreShare::new(cpus, doors);
        (s.memcache, s.other)
    };
    assert_eq!(shares(8, 1), (8, 8));
    assert_eq!(shares(8, 2), (4, 4));
    assert_eq!(shares(8, 3), (4, 2));
    assert_eq!(shares(16, 3), (6, 5));
    // Fewer cores than doors: one thread each, never none.
    assert_eq!(shares(2, 3), (1, 1));
    assert_eq!(shares(1, 3), (1, 1));
    for cpus in 1..=64 {
        for doors in 1..=3 {
            let (memcache, other) = shares(cpus, doors);
            assert!(memcache >= 1 && other >= 1);
            assert!(memcache + other * (doors - 1) <= cpus.max(doors));
        }
    }
}

#[test]
fn threads_set_in_the_config_are_kept_and_the_rest_shared() {
    let text = "[bus]\nthreads = 3\n[[proxy.listen]]\nname = \"p\"\naddr = \"127.0.0.1:0\"\n[[proxy.routes]]\nname = \"a\"\npath = \"/\"\ntargets = [\"http://127.0.0.1:1\"]\n";
    let file: FileConfig = toml::from_str(text).unwrap();
    let s = resolve(&file, &Overrides::default()).unwrap();
    let share = CoreShare::new(cpus(), 3);
    assert_eq!(s.bus.as_ref().unwrap().threads, 3, "set: kept");
    assert_eq!(s.proxy.as_ref().unwrap().threads, share.other);
    assert_eq!(s.threads, share.memcache);
    let o = Overrides {
        threads: Some(7),
        ..Overrides::default()
    };
    assert_eq!(resolve(&file, &o).unwrap().threads, 7, "--threads wins");
    // The memcache door alone keeps every core.
    let alone = resolve(&FileConfig::default(), &Overrides::default()).unwrap();
    assert_eq!(alone.threads, cpus());
}

#[test]
fn globs() {
    assert!(glob_match(b"jobs_*", b"jobs_1"));
    assert!(glob_match(b"jobs_*", b"jobs_"));
    assert!(!glob_match(b"jobs_*", b"job"));
    assert!(glob_match(b"*", b"anything"));
    assert!(glob_match(b"a?c", b"abc"));
    assert!(!glob_match(b"a?c", b"ac"));
    assert!(glob_match(b"*_x_*", b"q_x_y"));
    assert!(!glob_match(b"a", b"ab"));
}

#[test]
fn file_and_patterns() {
    let file: FileConfig = toml::from_str(
        r#"
        [server]
        max_open_reads = 4
        max_queues = 7
        shutdown_enabled = true
        [defaults]
        durability = "periodic"
        sync_interval_ms = 50
        max_items = 1000
        [queues."jobs_*"]
        durability = "synced"
        open_timeout_ms = 30000
        [queues."jobs_special"]
        max_items = 5
        expire_to = "dead"
        deliveries_max = 3
        dead_letter_to = "jobs_dead"
        priority_default = 65536
        priorities_max = 8
        [queues."*"]
        discard_old_when_full = true
        "#,
    )
    .unwrap();
    let settings = resolve(&file, &Overrides::default()).unwrap();
    assert_eq!(settings.limits.open_reads_max, 4);
    assert_eq!(settings.limits.queues_max, 7);
    assert_eq!(Limits::default().queues_max, QUEUES_MAX_DEFAULT);
    assert!(settings.limits.shutdown_enabled);
    assert_eq!(settings.listen, LISTEN_DEFAULT);
    let d = settings.store.config("other");
    assert_eq!(
        d.durability,
        Durability::Periodic(Duration::from_millis(50))
    );
    assert_eq!(d.max_items, 1000);
    assert!(d.discard_old_when_full);
    let j = settings.store.config("jobs_1");
    assert_eq!(j.durability, Durability::Synced);
    assert_eq!(j.open_timeout, Some(Duration::from_secs(30)));
    assert!(!j.discard_old_when_full);
    let s = settings.store.config("jobs_special");
    assert_eq!(s.max_items, 5);
    assert_eq!(s.expire_to.as_deref(), Some("dead"));
    assert_eq!(s.max_deliveries, Some(3));
    assert_eq!(s.dead_letter_to.as_deref(), Some("jobs_dead"));
    assert_eq!((s.priority_default, s.priorities_max), (65536, 8));
    assert_eq!(j.priorities_max, 32);
    assert_eq!(j.max_deliveries, None);
    assert_eq!(
        s.durability,
        Durability::Periodic(Duration::from_millis(50))
    );
}

#[test]
fn refusals() {
    for bad in [
        "[server]\nnope = 1",
        "[defaults]\ndurability = \"fast\"",
        "[defaults]\nsync_interval_ms = 0",
        "[defaults]\nexpire_to = \"a/b\"",
        "[defaults]\ndead_letter_to = \"a b\"",
        "[defaults]\ndeliveries_max = -1",
        "[defaults]\npriorities_max = 0",
        "[defaults]\npriorities_max = 5000",
        "[queues.\"a/b\"]\nmax_items = 1",
        "[server]\nline_bytes_max = 10",
        "[server]\nmax_open_reads = 0",
        "[server]\nmax_queues = 0",
        "[server]\nadmin_key = \"short\"",
        "[server]\nadmin_key = \"sixteen chars with spaces\"",
    ] {
        let refused = match FileConfig::parse(bad) {
            Ok(f) => resolve(&f, &Overrides::default()).is_err(),
            Err(_) => true,
        };
        assert!(refused, "{bad}");
    }
}

/// A build without the cargo feature `jetstream` refuses the JetStream backend,
/// asked for in the file or by the flag, with an error that says why; a build
/// with it takes it.
#[test]
fn the_jetstream_backend_needs_the_feature() {
    let text = "[backend]\nkind = \"jetstream\"\n[backend.jetstream]\nservers = [\"nats://127.0.0.1:4222\"]\n";
    let by_file: FileConfig = toml::from_str(text).unwrap();
    let flag = Overrides {
        backend: Some("jetstream".into()),
        nats_servers: Some("nats://127.0.0.1:4222".into()),
        ..Overrides::default()
    };
    let asked = [
        resolve(&by_file, &Overrides::default()),
        resolve(&FileConfig::default(), &flag),
    ];
    for resolved in asked {
        if cfg!(feature = "jetstream") {
            let settings = resolved.unwrap();
            assert!(matches!(settings.backend, BackendSettings::JetStream(_)));
        } else {
            let error = format!("{:#}", resolved.unwrap_err());
            assert!(error.contains("no JetStream support"), "{error}");
            assert!(error.contains("cargo feature `jetstream`"), "{error}");
        }
    }
    let embedded = resolve(&FileConfig::default(), &Overrides::default()).unwrap();
    assert_eq!(embedded.backend, BackendSettings::Embedded);
}

#[cfg(feature = "jetstream")]
#[test]
fn on_jetstream_a_proxy_may_shadow_and_record_and_the_bus_runs() {
    let backend = "[backend]\nkind = \"jetstream\"\n[backend.jetstream]\nservers = [\"nats://127.0.0.1:4222\"]\n";
    let route = |extra: &str| {
        format!(
            "{backend}[[proxy.listen]]\nname = \"m\"\naddr = \"127.0.0.1:0\"\n[[proxy.routes]]\nname = \"api\"\ntargets = [\"http://127.0.0.1:1\"]\n{extra}[[proxy.routes.shadows]]\nname = \"s\"\nurl = \"http://127.0.0.1:2\"\n"
        )
    };
    let resolved = |text: &str| -> anyhow::Result<Settings> {
        let file = FileConfig::parse(text)?;
        Ok(resolve(&file, &Overrides::default())?)
    };
    let shadowing = resolved(&route("")).unwrap();
    assert!(matches!(shadowing.backend, BackendSettings::JetStream(_)));
    assert!(shadowing.proxy.is_some());
    let recording = resolved(&route("record = true\n")).unwrap();
    let proxy = recording.proxy.as_ref().unwrap();
    assert!(proxy.routes[0].record);
    let bus = resolved(&format!("{backend}[bus]\ntakeover_ms = 3000\n")).unwrap();
    let bus = bus.bus.as_ref().unwrap();
    assert_eq!(bus.takeover, Duration::from_millis(3000));
    let short = resolved(&format!("{backend}[bus]\ntakeover_ms = 999\n")).unwrap_err();
    assert!(format!("{short:#}").contains("takeover_ms"), "{short:#}");
}

#[test]
fn the_admin_key_is_checked_and_never_shown() {
    let file: FileConfig =
        toml::from_str("[server]\nadmin_key = \"0123456789abcdef-xyz\"").unwrap();
    let settings = resolve(&file, &Overrides::default()).unwrap();
    let key = settings.admin_key.as_ref().unwrap();
    assert_eq!(key.expose(), "0123456789abcdef-xyz");
    assert!(!format!("{settings:?}").contains("0123456789abcdef"));
}

#[test]
fn flags_override_the_file() {
    let file: FileConfig = toml::from_str("[server]\nlisten = \"0.0.0.0:1\"").unwrap();
    let o = Overrides {
        listen: Some("127.0.0.1:2".into()),
        ..Overrides::default()
    };
    assert_eq!(resolve(&file, &o).unwrap().listen, "127.0.0.1:2");
    assert_eq!(
        resolve(&file, &Overrides::default()).unwrap().listen,
        "0.0.0.0:1"
    );
}

/// The text of a file that sets `key` to 7 in the section `pattern` names.
fn file_setting(pattern: &str, key: &str) -> String {
    if pattern == "proxy.routes[].shadows[]" {
        return format!(
            "[[proxy.routes]]\nname = \"r\"\ntargets = [\"http://127.0.0.1:1\"]\n[[proxy.routes.shadows]]\nname = \"s\"\nurl = \"http://127.0.0.1:2\"\n{key} = 7\n"
        );
    }
    let table = match pattern.strip_suffix(".*") {
        Some(parent) => format!("{parent}.\"jobs*\""),
        None => pattern.to_string(),
    };
    format!("[{table}]\n{key} = 7\n")
}

/// Every renamed key still works under its old name, means the same as under the new
/// one, is reported for the start's warning, and may not be set under both names.
#[test]
fn every_old_key_name_is_read_as_its_new_one_and_reported() {
    for r in renamed::RENAMED {
        let old_text = file_setting(r.section, r.old);
        let new_text = file_setting(r.section, r.new);
        let mut old = FileConfig::parse(&old_text).unwrap_or_else(|e| panic!("{old_text}: {e}"));
        let new = FileConfig::parse(&new_text).unwrap_or_else(|e| panic!("{new_text}: {e}"));
        assert_eq!(old.old_names.len(), 1, "{old_text}");
        assert_eq!((old.old_names[0].old, old.old_names[0].new), (r.old, r.new));
        assert!(new.old_names.is_empty(), "{new_text}");
        old.old_names.clear();
        assert_eq!(format!("{old:?}"), format!("{new:?}"), "{old_text}");
        let both = format!("{old_text}{} = 7\n", r.new);
        assert!(FileConfig::parse(&both).is_err(), "both names: {both}");
    }
}

#[test]
fn a_refused_value_names_its_key() {
    let refused = |text: &str| {
        let file = FileConfig::parse(text).unwrap();
        resolve(&file, &Overrides::default()).unwrap_err()
    };
    let e = refused("[server]\nopen_reads_max = 0");
    assert_eq!(e.key(), "server.open_reads_max");
    assert_eq!(e.to_string(), "server.open_reads_max must be 1 to 1024");
    assert_eq!(
        refused("[server]\nmax_queues = 0").key(),
        "server.queues_max"
    );
    let e = refused("[queues.\"jobs*\"]\ndurability = \"fast\"");
    assert_eq!(e.key(), "queues.\"jobs*\".durability");
    assert_eq!(
        refused("[defaults]\nsync_interval_ms = 0").key(),
        "defaults.sync_interval_ms"
    );
    assert_eq!(refused("[bus]\nattempts_max = 0").key(), "bus.attempts_max");
    assert_eq!(refused("[backend]\nkind = \"cloud\"").key(), "backend.kind");
}

/// Every secret from the environment wins over the file's (the admin key and the
/// bus's root key; the cluster's password and token come only from the environment).
#[test]
fn secrets_from_the_environment_win_over_the_file() {
    let file = FileConfig::parse(
        "[server]\nadmin_key = \"file-key-0123456789\"\n[bus]\nroot_key = \"file-root-key\"\n",
    )
    .unwrap();
    let env = |name: &str| match name {
        "WEIR_ADMIN_KEY" => Some("env-key-0123456789".to_string()),
        "ROUTEMASTER_ROOT_KEY" => Some("env-root-key".to_string()),
        _ => None,
    };
    let s = resolve_with_env(&file, &Overrides::default(), &env).unwrap();
    assert_eq!(
        s.admin_key.as_ref().map(AdminKey::expose),
        Some("env-key-0123456789")
    );
    let bus = s.bus.as_ref().unwrap();
    assert_eq!(bus.root_key.as_deref(), Some("env-root-key"));
    let none = |_: &str| None;
    let s = resolve_with_env(&file, &Overrides::default(), &none).unwrap();
    assert_eq!(
        s.admin_key.as_ref().map(AdminKey::expose),
        Some("file-key-0123456789")
    );
    assert_eq!(
        s.bus.as_ref().unwrap().root_key.as_deref(),
        Some("file-root-key")
    );
}

/// A flag replaces the file's value, which is then not checked; a bad value is named
/// as the flag or as the file's key, whichever gave it.
#[test]
fn a_flag_over_a_bad_file_value_starts_and_a_bad_flag_is_named() {
    let file = FileConfig::parse("[server]\nthreads = 0\nconnections_max = 0\n").unwrap();
    let flags = Overrides {
        threads: Some(2),
        connections_max: Some(10),
        ..Overrides::default()
    };
    let s = resolve(&file, &flags).unwrap();
    assert_eq!((s.threads, s.connections_max), (2, 10));
    let e = resolve(&file, &Overrides::default()).unwrap_err();
    assert_eq!(e.key(), "server.threads");
    let bad_flag = Overrides {
        threads: Some(0),
        ..Overrides::default()
    };
    let e = resolve(&FileConfig::default(), &bad_flag).unwrap_err();
    assert_eq!(e.key(), "--threads");
    let bad_flag = Overrides {
        connections_max: Some(0),
        ..Overrides::default()
    };
    let e = resolve(&FileConfig::default(), &bad_flag).unwrap_err();
    assert_eq!(e.key(), "--connections-max");
}

#[test]
fn the_bus_and_proxy_queues_get_no_delivery_limit_or_lease_timeout() {
    let file = FileConfig::parse(
        "[defaults]\ndeliveries_max = 3\ndead_letter_to = \"dead\"\nopen_timeout_ms = 500\n",
    )
    .unwrap();
    let settings = resolve(&file, &Overrides::default()).unwrap();
    let jobs = settings.store.config("jobs");
    assert_eq!(jobs.max_deliveries, Some(3));
    assert_eq!(jobs.dead_letter_to.as_deref(), Some("dead"));
    for reserved in ["bus:topic:t", "proxy:capture:r"] {
        let c = settings.store.config(reserved);
        assert_eq!(c.max_deliveries, None, "{reserved}");
        assert_eq!(c.dead_letter_to, None, "{reserved}");
        assert_eq!(c.open_timeout, None, "{reserved}");
    }
    // 0 and "" turn them off.
    let off = FileConfig::parse("[defaults]\ndeliveries_max = 0\ndead_letter_to = \"\"\n").unwrap();
    let c = resolve(&off, &Overrides::default())
        .unwrap()
        .store
        .config("q");
    assert_eq!((c.max_deliveries, c.dead_letter_to), (None, None));
}

/// `[beanstalk]` or `--beanstalk-listen` turns the beanstalkd door on (port 11300 by
/// default, the flag winning over the file); a bad value is named with its section;
/// with the JetStream backend the door is refused before anything starts.
#[test]
fn the_beanstalk_section_and_flag() {
    let none = resolve(&FileConfig::default(), &Overrides::default()).unwrap();
    assert!(none.beanstalk.is_none());
    let file = FileConfig::parse("[beanstalk]\nreserved_max = 3\n").unwrap();
    let s = resolve(&file, &Overrides::default()).unwrap();
    let b = s.beanstalk.unwrap();
    assert_eq!((b.listen.as_str(), b.reserved_max), ("127.0.0.1:11300", 3));
    let flag = Overrides {
        beanstalk_listen: Some("127.0.0.1:1".into()),
        ..Overrides::default()
    };
    let s = resolve(&file, &flag).unwrap();
    assert_eq!(s.beanstalk.unwrap().listen, "127.0.0.1:1");
    let bad = FileConfig::parse("[beanstalk]\nwatched_max = 0\n").unwrap();
    let e = resolve(&bad, &Overrides::default()).unwrap_err();
    assert_eq!(e.key(), "beanstalk.watched_max");
    assert!(FileConfig::parse("[beanstalk]\nnope = 1\n").is_err());
    #[cfg(feature = "jetstream")]
    {
        let jetstream = Overrides {
            backend: Some("jetstream".into()),
            nats_servers: Some("nats://127.0.0.1:4222".into()),
            ..flag
        };
        let e = resolve(&file, &jetstream).unwrap_err();
        assert_eq!(e.key(), "beanstalk");
        assert!(e.problem().contains("needs the embedded backend"));
    }
}
