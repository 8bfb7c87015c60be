//! The integration tests, one binary (linked once) with a module per area,
//! as ripgrep's tests/ are. Run one area or one test:
//!
//! ```sh
//! cargo test --test it worker::              # one area
//! cargo test --test it worker::sqlite::      # one area, one backend
//! cargo nextest run --test it -E 'test(/^limiter::/)'
//! scripts/test.sh                            # everything, as CI runs it
//! ```
//!
//! `util` holds the helpers: real servers on free ports (beanstalkd,
//! smtp-sink, a scripted SMTP peer, Postfix), a fresh database per test,
//! `Env` for running the binary. `tests/chaos.rs` (the crash/restart
//! suite behind `scripts/chaos.sh`) is its own binary, built in release,
//! and shares `util`.

#[macro_use]
mod util;

mod ab;
mod ab_html;
mod accessibility;
mod admin;
mod api;
mod api_flows;
mod audience;
mod audience_mysql;
mod audience_sync;
mod bounce;
mod bounce_trust;
mod budgets;
mod campaign_browser;
mod campaign_form;
mod campaign_page;
mod charts;
mod cli;
mod closed_pipe;
mod complaint_guard;
mod connections;
mod content;
mod dashboard;
mod delay_proxy;
mod dkim;
mod dkim_rotate;
mod doctor;
mod edit;
mod eta;
mod fencing;
mod fleet;
mod flow_sql;
mod flow_tracking;
mod flows;
mod forget;
mod headers;
mod manage;
mod manage_content;
mod messages;
mod messages_batch;
mod messages_lost;
mod messages_tx;
mod mx_rollup;
mod operator_mistakes;
mod pages;
mod pages_browser;
mod people;
mod people_browser;
mod pipelining;
mod postfix;
mod prune;
mod rate_group;
mod ratelimit;
mod report;
mod requeue;
mod resource_limits;
mod schedule;
mod secrets;
mod serve;
mod smtp_wire;
mod source_safety;
mod store_contract;
mod subscribe;
mod supervisord;
mod suppress;
mod template_links;
mod throttle;
mod tracking;
mod warmup;
mod webhooks;
mod worker;
mod worker_in_process;

/// `free_port` hands out ports that no `bind(0)` and no outgoing
/// connection can take (below the ephemeral range), never the same one
/// twice, and each stays reserved: another test process (here, another
/// open file, which `flock` tells apart the same way) cannot reserve it.
#[test]
fn free_ports_are_outside_the_ephemeral_range_and_reserved_until_exit() {
    let ephemeral_low = util::ephemeral_start();
    let ports: Vec<u16> = (0..100).map(|_| util::free_port()).collect();
    let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        ports.len(),
        "a port handed out twice: {ports:?}"
    );
    for &port in &ports {
        assert!(
            port < ephemeral_low && port > 1024,
            "port {port} in the ephemeral range"
        );
        assert!(
            util::reserve_port(port).is_none(),
            "port {port} handed out but not reserved"
        );
        // Handed out free: a server can bind it.
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }
}

/// Every test that takes `util::alone()` is named in `.config/nextest.toml`'s
/// override that gives it every thread: nextest runs each test in a process
/// of its own, where the in-process lock keeps nothing apart.
#[test]
fn nextest_runs_every_alone_test_alone() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(root.join(".config/nextest.toml")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("tests/it")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("main.rs") {
            continue;
        }
        let area = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut current = String::new();
        for line in text.lines() {
            let head = line.trim_start_matches("async ");
            if let Some(rest) = head.strip_prefix("fn ") {
                current = rest
                    .split(['(', '<'])
                    .next()
                    .unwrap_or_default()
                    .to_string();
            }
            // why: a `both!` pair is named area::sqlite::NAME and
            // area::postgres::NAME, one filter for both
            let named = config.contains(&format!("^{area}::{current}"))
                || config.contains(&format!("^{area}::(sqlite|postgres)::{current}"));
            if line.contains("util::alone()") && !named {
                missing.push(format!("{area}::{current}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "take alone() but not alone under nextest: {missing:?}"
    );
}
