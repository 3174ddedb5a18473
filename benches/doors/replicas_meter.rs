//! What a row of the replicas section measures besides throughput and latency: the CPU time
//! per request of each party over the row's measured window (`common/cpu.rs`), and Redis's own
//! account of the commands it ran in that window (`INFO commandstats`: calls and the time spent
//! inside each command, which leaves out reading, parsing and answering the requests).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::direct::Direct;
use crate::{Opts, Row, cpu, median};

/// CPU time per request of each party, µs, in the order of [`Meter::new`]'s parties.
pub(super) type PerRequest = [f64; 4];

/// Redis commands per request: name, calls, µs inside the command.
pub(super) type Commands = Vec<(String, f64, f64)>;

/// Whose CPU a row counts, and where Redis's command statistics are read.
pub(super) struct Meter {
    parties: [Vec<cpu::Source>; 4],
    redis: Option<Direct>,
}

/// One row, measured.
pub(super) struct Measured {
    pub(super) row: Row,
    pub(super) cpu: PerRequest,
    pub(super) commands: Commands,
}

impl Meter {
    /// The parties: stategate (every replica: the `serve` runtime they run on, their own
    /// `stategate-*` threads, the rate limiter's timer thread; the echo responder runs there
    /// too), redis-server, Mosquitto, and the load generator's runtime.
    pub(super) fn new(redis_pid: u32, mosquitto_pid: u32, redis: Option<Direct>) -> Meter {
        Meter {
            parties: [
                vec![
                    cpu::Source::Threads("serve"),
                    cpu::Source::Threads("stategate"),
                    cpu::Source::Threads("futures-timer"),
                ],
                vec![cpu::Source::Process(redis_pid)],
                vec![cpu::Source::Process(mosquitto_pid)],
                vec![cpu::Source::Threads("load")],
            ],
            redis,
        }
    }

    fn ns(&self) -> [u64; 4] {
        self.parties
            .each_ref()
            .map(|sources| sources.iter().map(cpu::Source::ns).sum())
    }

    /// Runs `row` (closed loop or fixed rate) and measures over its measured window, which
    /// starts after `o.warmup` s and lasts `o.secs`, per request sent in it (`sent` counts them).
    pub(super) async fn run(&self, o: &Opts, sent: &AtomicU64, row: impl Future<Output = Row>) -> Measured {
        let warm_end = tokio::time::Instant::now() + Duration::from_secs(o.warmup);
        let meter = async {
            tokio::time::sleep_until(warm_end).await;
            let (before, n0) = (self.ns(), sent.load(Ordering::Relaxed));
            if let Some(r) = &self.redis {
                r.reset_stats().await;
            }
            tokio::time::sleep_until(warm_end + Duration::from_secs(o.secs)).await;
            let (after, n1) = (self.ns(), sent.load(Ordering::Relaxed));
            let ops = n1.saturating_sub(n0).max(1) as f64;
            let cpu = std::array::from_fn(|p| after[p].saturating_sub(before[p]) as f64 / 1000.0 / ops);
            let mut commands = Vec::new();
            if let Some(r) = &self.redis {
                for (name, calls, us) in r.command_stats().await {
                    commands.push((name, calls as f64 / ops, us as f64 / ops));
                }
            }
            commands.sort_by(|a, b| b.2.total_cmp(&a.2));
            (cpu, commands)
        };
        let (row, (cpu, commands)) = tokio::join!(row, meter);
        Measured { row, cpu, commands }
    }
}

impl Measured {
    /// The rounds of one row: the median-throughput run, each party's median CPU per request,
    /// and the last round's commands (counts per request hardly vary).
    pub(super) fn median(runs: Vec<Measured>) -> Measured {
        let cpus: Vec<PerRequest> = runs.iter().map(|m| m.cpu).collect();
        let commands = runs.last().map(|m| m.commands.clone()).unwrap_or_default();
        let cpu = std::array::from_fn(|p| {
            let mut v: Vec<f64> = cpus.iter().map(|c| c[p]).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        });
        let row = median(runs.into_iter().map(|m| m.row).collect());
        Measured { row, cpu, commands }
    }

    /// The row, its CPU line (`first` names the serving party: stategate, the echo responder,
    /// or nothing in a straight row) and the Redis commands that cost most.
    pub(super) fn print(&self, first: &str, baseline: Option<&Row>) {
        self.row.print(baseline);
        let c = self.cpu;
        println!(
            "{:<34} µs CPU/req: {first} {:.1}  redis {:.1}  mosquitto {:.1}  load {:.1}",
            "", c[0], c[1], c[2], c[3]
        );
        let frequent: Vec<&(String, f64, f64)> = self.commands.iter().filter(|(_, calls, _)| *calls >= 0.005).collect();
        let mut shown: Vec<String> = frequent
            .iter()
            .take(8)
            .map(|(name, calls, us)| format!("{name} {calls:.2} ({us:.1} µs)"))
            .collect();
        if frequent.len() > 8 {
            let (calls, us) = frequent[8..].iter().fold((0.0, 0.0), |(c, u), x| (c + x.1, u + x.2));
            shown.push(format!("{} others {calls:.2} ({us:.1} µs)", frequent.len() - 8));
        }
        if !shown.is_empty() {
            println!("{:<34} redis commands/req (µs inside): {}", "", shown.join(", "));
        }
    }
}
