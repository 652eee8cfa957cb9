//! A process's memory and CPU time, from Linux's /proc.

use anyhow::{Context, Result};
use std::time::Instant;

/// CPU time and memory of one process (or a set) at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: Instant,
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    pub rss_kib: u64,
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a process, in ticks. Fields 14 and 15 of /proc/<pid>/stat, counted after
/// the parenthesised command name (which may itself contain spaces or parentheses).
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat (has the process exited?)"))?;
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("unexpected /proc/<pid>/stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so utime (14) is index 11 and stime (15) index 12.
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

fn status_kib(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One process.
pub fn sample(pid: u32) -> Result<Sample> {
    let cpu_ticks = cpu_ticks(pid)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    Ok(Sample {
        at: Instant::now(),
        cpu_ticks,
        rss_kib: status_kib(&status, "VmRSS:"),
    })
}

/// Every process whose command name is `comm` (e.g. all PostgreSQL backends), summed.
/// Processes that exit between two samples take their CPU time with them.
pub fn sample_all(comm: &str) -> Sample {
    let mut total = Sample {
        at: Instant::now(),
        cpu_ticks: 0,
        rss_kib: 0,
    };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return total;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let is_match = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim_end() == comm)
            .unwrap_or(false);
        if is_match {
            if let Ok(t) = cpu_ticks(pid) {
                total.cpu_ticks += t;
            }
        }
    }
    total
}

/// CPU used between two samples, as a percentage of one core (200% = both cores of a 2-core
/// machine).
pub fn cpu_percent(a: &Sample, b: &Sample) -> f64 {
    let wall = b.at.duration_since(a.at).as_secs_f64();
    if wall <= 0.0 {
        return 0.0;
    }
    let secs = b.cpu_ticks.saturating_sub(a.cpu_ticks) as f64 / clock_ticks_per_sec();
    100.0 * secs / wall
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
