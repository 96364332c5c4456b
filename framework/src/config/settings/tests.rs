use std::collections::HashMap;

use super::*;

/// Variables named before the table, kept for compatibility.
const OLD_NAMES: [&str; 12] = [
    "TENURE_ETCD_CA_FILE",
    "TENURE_ETCD_CERT_FILE",
    "TENURE_ETCD_KEY_FILE",
    "TENURE_NATS_CA_FILE",
    "TENURE_NATS_CERT_FILE",
    "TENURE_NATS_KEY_FILE",
    "TENURE_NATS_USER",
    "TENURE_NATS_PASSWORD",
    "TENURE_NATS_TOKEN",
    "TENURE_NATS_CREDS_FILE",
    "TENURE_NATS_NKEY",
    "TENURE_LEASE_TTL_MS",
];

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn setting(var: &str) -> &'static Setting {
    SETTINGS.iter().find(|s| s.var == var).expect(var)
}

#[test]
fn every_variable_follows_the_naming_rule_and_is_unique() {
    let mut seen = std::collections::HashSet::new();
    for s in SETTINGS {
        assert!(seen.insert(s.var), "{} twice", s.var);
        let rule = format!("TENURE_{}", s.field.to_uppercase().replace('.', "_"));
        assert!(
            s.var == rule || OLD_NAMES.contains(&s.var),
            "{} sets {}: name it {rule}",
            s.var,
            s.field
        );
    }
}

/// A text of the setting's kind that differs from `default`.
fn other_value(s: &Setting, default: &str) -> String {
    let pick = |a: &str, b: &str| if default == a { b } else { a }.to_string();
    match s.kind() {
        "duration" => pick("1234ms", "4321ms"),
        "duration or `none`" => pick("none", "1234ms"),
        "number" | "number or `none`" => pick("77", "78"),
        "`true` or `false`" => pick("true", "false"),
        "`cancel_jobs` or `abort_process`" => pick("abort_process", "cancel_jobs"),
        "comma-separated list" => "http://127.0.0.1:1,http://127.0.0.1:2".into(),
        "secret" => "s3cret".into(),
        "file path" => "/etc/tenure/x.pem".into(),
        _ => pick("t_x", "t_y"),
    }
}

#[test]
fn every_setting_changes_its_field() {
    for s in SETTINGS {
        let mut cfg = Config::new("tenure");
        if s.var == "TENURE_NATS_PASSWORD" {
            setting("TENURE_NATS_USER").apply(&mut cfg, "u").unwrap();
        }
        let before = format!("{cfg:?}");
        let text = other_value(s, &s.show(&cfg));
        s.apply(&mut cfg, &text).unwrap();
        if s.var == "TENURE_NATS_PASSWORD" {
            let want = NatsAuth::UserPassword {
                user: "u".into(),
                password: Secret::new(text.as_str()),
            };
            assert_eq!(cfg.nats_auth, want);
        } else {
            assert_ne!(format!("{cfg:?}"), before, "{} changed nothing", s.var);
        }
        let shown = s.show(&cfg);
        if s.kind() != "secret" {
            assert_eq!(shown, text, "{} reads back otherwise", s.var);
        }
    }
}

#[test]
fn every_default_reads_back_as_itself() {
    let defaults = Config::new("tenure");
    for s in SETTINGS.iter().filter(|s| s.kind() != "secret") {
        let text = s.show(&defaults);
        if text.is_empty() {
            continue;
        }
        let mut cfg = defaults.clone();
        s.apply(&mut cfg, &text).unwrap();
        assert_eq!(format!("{cfg:?}"), format!("{defaults:?}"), "{}", s.var);
    }
}

#[test]
fn a_value_not_of_its_kind_is_refused_naming_the_variable() {
    for (var, bad) in [
        ("TENURE_LEASE_TTL", "5"),
        ("TENURE_TUNING_FETCH_WAIT", "fast"),
        ("TENURE_PREFETCH", "many"),
        ("TENURE_PARTITIONS", "-1"),
        ("TENURE_ALLOW_INSECURE_TRANSPORT", "yes"),
        ("TENURE_WATCHDOG", "panic"),
        ("TENURE_RETENTION_DONE_AFTER", "30 days"),
    ] {
        let mut cfg = Config::new("tenure");
        let err = cfg.apply_vars(vars(&[(var, bad)])).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { name, .. } if *name == var),
            "{var}={bad}: {err:?}"
        );
        assert!(err.to_string().contains(var), "{err}");
    }
}

#[test]
fn contradicting_variables_are_refused() {
    for pair in [
        [("TENURE_NATS_USER", "u"), ("TENURE_NATS_TOKEN", "t")],
        [("TENURE_NATS_CREDS_FILE", "/c"), ("TENURE_NATS_NKEY", "SU")],
        [("TENURE_LEASE_TTL", "6s"), ("TENURE_LEASE_TTL_MS", "6000")],
    ] {
        let err = Config::new("tenure").apply_vars(vars(&pair)).unwrap_err();
        assert!(
            matches!(err, ConfigError::Invalid { .. }),
            "{pair:?}: {err}"
        );
    }
    let lone_password = vars(&[("TENURE_NATS_PASSWORD", "pw")]);
    let err = Config::new("tenure").apply_vars(lone_password).unwrap_err();
    assert!(err.to_string().contains("TENURE_NATS_USER"), "{err}");
}

#[test]
fn variables_override_the_code_and_leave_the_rest() {
    let mut cfg = Config::new("tenure")
        .with_nats_auth(NatsAuth::Token(Secret::new("code")))
        .with_prefetch(7);
    let env = vars(&[
        ("TENURE_NATS_USER", "w"),
        ("TENURE_NATS_PASSWORD", "pw"),
        ("TENURE_LEASE_TTL_MS", "6000"),
        ("TENURE_TUNING_STAND_DOWN_AFTER", "2s"),
        ("TENURE_RETENTION_DONE_AFTER", "none"),
        ("TENURE_SCHEMA", "  "),
    ]);
    cfg.apply_vars(env).unwrap();
    let want = NatsAuth::UserPassword {
        user: "w".into(),
        password: Secret::new("pw"),
    };
    assert_eq!(cfg.nats_auth, want);
    assert_eq!(cfg.prefetch, 7, "untouched by the variables");
    assert_eq!(cfg.schema, "tenure", "a blank variable is unset");
    assert_eq!(cfg.lease_ttl, Duration::from_secs(6));
    assert_eq!(cfg.tuning.stand_down_after, Some(Duration::from_secs(2)));
    assert_eq!(cfg.retention.done_after, None);
}

#[test]
fn from_vars_needs_the_servers_and_names_the_variable_out_of_bounds() {
    let servers = [
        ("TENURE_ETCD_ENDPOINTS", "http://127.0.0.1:2379"),
        ("TENURE_NATS_URL", "nats://127.0.0.1:4222"),
        ("TENURE_DATABASE_URL", "postgres://postgres@127.0.0.1/t"),
    ];
    let cfg = Config::from_vars(vars(&servers)).unwrap();
    assert_eq!(cfg.namespace, "tenure");
    let err = Config::from_vars(vars(&servers[1..])).unwrap_err();
    assert_eq!(err, ConfigError::Missing("TENURE_ETCD_ENDPOINTS"));
    for (var, bad) in [
        ("TENURE_PARTITIONS", "0"),
        ("TENURE_TUNING_FETCH_WAIT", "0s"),
        ("TENURE_RETENTION_BATCH", "0"),
    ] {
        let env = [&servers[..], &[(var, bad)]].concat();
        let err = Config::from_vars(vars(&env)).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { name, .. } if *name == var),
            "{var}={bad}: {err:?}"
        );
    }
}

/// `guide::configuration` holds [`reference`]; `TENURE_BLESS=1` rewrites it.
#[test]
fn the_configuration_guide_lists_every_setting() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/docs/configuration.md");
    let (begin, end) = ("<!-- settings:begin -->\n", "<!-- settings:end -->");
    let text = std::fs::read_to_string(path).expect(path);
    let start = text.find(begin).expect("begin marker") + begin.len();
    let stop = text.find(end).expect("end marker");
    let table = reference();
    if std::env::var_os("TENURE_BLESS").is_some() {
        let fresh = format!("{}{table}{}", &text[..start], &text[stop..]);
        std::fs::write(path, fresh).expect("write the guide");
        return;
    }
    assert_eq!(
        text[start..stop],
        table,
        "the configuration guide is stale: run with TENURE_BLESS=1"
    );
}
