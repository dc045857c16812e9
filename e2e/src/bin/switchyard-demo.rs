//! The local demo: Switchyard in standalone mode, three real Envoys on 127.0.0.41–43,
//! local backends, bounded load through every Envoy, and a series of traffic shifts, each
//! to a brand-new Service. Prints a live progress line and a final table.
//!
//! Run it through `e2e/demo.sh`, which installs Envoy first.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, Load, Switchyard, free_port, write_route};

const ENVOYS: [(&str, &str, Protocol); 3] = [
    ("envoy-a", "127.0.0.41", Protocol::Delta),
    ("envoy-b", "127.0.0.42", Protocol::Delta),
    ("envoy-c", "127.0.0.43", Protocol::Sotw),
];

struct Args {
    shifts: usize,
    rate: u32,
    unordered: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        shifts: 8,
        rate: 300,
        unordered: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--shifts" => args.shifts = it.next().context("--shifts needs a number")?.parse()?,
            "--rate" => args.rate = it.next().context("--rate needs a number")?.parse()?,
            "--unordered" => args.unordered = true,
            "-h" | "--help" => {
                println!("switchyard-demo [--shifts N (8)] [--rate REQ_PER_S (300)] [--unordered]");
                println!(
                    "  --unordered  turn off make-before-break, to see the requests a naive control plane drops"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other:?} (try --help)"),
        }
    }
    anyhow::ensure!((1..=100).contains(&args.shifts), "--shifts must be 1..=100");
    anyhow::ensure!((1..=2000).contains(&args.rate), "--rate must be 1..=2000");
    Ok(args)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let dir = tempfile::tempdir()?;
    let work = dir.path();
    let config = work.join("config");
    std::fs::create_dir(&config)?;
    let (http_port, probe_port) = (free_port(), free_port());

    println!(
        "Switchyard demo: 3 Envoys, {} shifts, {} req/s",
        args.shifts, args.rate
    );
    let backends = [
        Backend::start("blue", "127.0.0.51").await,
        Backend::start("green", "127.0.0.52").await,
        Backend::start("yellow", "127.0.0.53").await,
    ];
    write_route(
        &config,
        "demo.local",
        http_port,
        probe_port,
        &[("shop-0", &backends[0])],
    );
    let extra: &[&str] = if args.unordered {
        &["--unordered-xds"]
    } else {
        &[]
    };
    let switchyard = Switchyard::start_standalone(work, &config, extra);
    let envoys: Vec<Envoy> = ENVOYS
        .iter()
        .map(|(name, ip, protocol)| Envoy::start(work, name, ip, switchyard.xds_port, *protocol))
        .collect();
    switchyard
        .wait_synced(envoys.len(), Duration::from_secs(60))
        .await;
    let targets: Vec<String> = envoys
        .iter()
        .map(|e| format!("http://{}:{http_port}", e.address))
        .collect();
    for target in &targets {
        wait_for_ok(target).await?;
    }
    println!(
        "ready: Envoys at {} (Host: demo.local), switchyard admin at {}",
        targets.join(", "),
        switchyard.admin_url("/debug/nodes")
    );

    let live = std::io::stdout().is_terminal();
    let load = Load::start(targets, "demo.local", args.rate, Duration::from_secs(600));
    let mut shifts = Vec::new();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 1..=args.shifts {
        let service = format!("shop-{i}");
        let backend = &backends[i % backends.len()];
        let previous = switchyard.desired_version().await;
        let started = Instant::now();
        write_route(
            &config,
            "demo.local",
            http_port,
            probe_port,
            &[(&service, backend)],
        );
        switchyard
            .wait_for_new_version(previous.as_deref(), Duration::from_secs(10))
            .await;
        switchyard
            .wait_synced(envoys.len(), Duration::from_secs(30))
            .await;
        let ready = started.elapsed();
        shifts.push((service, backend.name.clone(), ready));
        // Let traffic flow on the new backend for a while: on a terminal one line that
        // updates itself, elsewhere (a CI log, a pipe) one plain line per shift.
        let until = Instant::now() + Duration::from_millis(900);
        while Instant::now() < until {
            if live {
                let report = load.snapshot();
                print!(
                    "\rshift {i}/{} → {:<7} requests {:>6}  non-2xx {:>3}  ",
                    args.shifts,
                    backend.name,
                    report.sent,
                    report.non_2xx()
                );
                std::io::stdout().flush().ok();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !live {
            let report = load.snapshot();
            println!(
                "shift {i}/{} → {}: Ready on every Envoy in {} ms; requests {}, non-2xx {}",
                args.shifts,
                backend.name,
                ready.as_millis(),
                report.sent,
                report.non_2xx()
            );
        }
    }
    let report = load.finish().await;
    if live {
        // End the line that updated itself.
        println!();
    }
    println!();
    println!("| shift | new Service | backend | time to Ready on all 3 Envoys |");
    println!("|---|---|---|---|");
    for (i, (service, backend, ready)) in shifts.iter().enumerate() {
        println!(
            "| {} | {service} | {backend} | {:.0} ms |",
            i + 1,
            ready.as_secs_f64() * 1000.0
        );
    }
    println!();
    println!("| requests | 2xx | non-2xx | duration | by backend |");
    println!("|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {:.1} s | {:?} |",
        report.sent,
        report.sent - report.non_2xx(),
        report.non_2xx(),
        report.elapsed.as_secs_f64(),
        report.by_backend
    );
    for failure in report.failures.iter().take(5) {
        println!("  failed: {failure:?}");
    }
    drop(envoys);
    drop(switchyard);
    if report.non_2xx() > 0 && !args.unordered {
        anyhow::bail!("{} requests failed", report.non_2xx());
    }
    Ok(())
}

async fn wait_for_ok(target: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    for _ in 0..250 {
        if let Ok(r) = client
            .get(format!("{target}/"))
            .header("host", "demo.local")
            .send()
            .await
            && r.status().is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("{target} never answered")
}
