//! Why a point is noisy, in one line: the host's CPU time that other processes took while it
//! ran (a CPU adapter runs the kernels on those cores, and a GPU's host submits and waits on
//! them), or one round apart from the others.

use crate::measure::{NOISY_SPREAD, Row};
use crate::timing::median;

/// The host's CPU time counters and this process's, in clock ticks (Linux `/proc`).
#[derive(Clone, Copy)]
pub struct CpuTimes {
    /// Ticks every core spent busy (not idle, not waiting for I/O).
    busy: u64,
    /// Ticks of every core.
    total: u64,
    /// Ticks this process's threads ran (the CPU adapter's workers among them).
    ours: u64,
}

/// Another process's share of the host's CPU past which it is named as a point's noise.
const BUSY_HOST: f64 = 0.15;

impl CpuTimes {
    /// The counters now; None where `/proc` does not have them (not Linux).
    pub fn now() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat
            .lines()
            .next()?
            .strip_prefix("cpu ")?
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let total: u64 = cpu.iter().take(8).sum();
        let idle = cpu.get(3)? + cpu.get(4).unwrap_or(&0);
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
        let after = own.rsplit_once(')')?.1;
        let f: Vec<u64> = after
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        Some(CpuTimes {
            busy: total - idle,
            total,
            ours: f.get(11)? + f.get(12)?,
        })
    }

    /// The share (0 to 1) of the host's CPU time since `earlier` that other processes used.
    pub fn others_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let busy = self.busy.checked_sub(earlier.busy)?;
        let ours = self.ours.checked_sub(earlier.ours)?;
        (total > 0).then(|| busy.saturating_sub(ours) as f64 / total as f64)
    }
}

/// Why `row`'s rounds disagree past [`NOISY_SPREAD`], in one line; `cpu_adapter`: the device
/// runs on the host's cores.
pub fn why(row: &Row, cpu_adapter: bool) -> String {
    let rounds = &row.rounds;
    let busiest = row
        .others_cpu
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.map(|s| (i, s)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((i, share)) = busiest.filter(|&(_, s)| s >= BUSY_HOST) {
        return format!(
            "other processes used {:.0} % of the host's CPU in round {} of {}{}",
            100.0 * share,
            i + 1,
            rounds.len(),
            if cpu_adapter {
                ", the cores this CPU adapter runs the kernels on"
            } else {
                ""
            }
        );
    }
    if rounds.len() < 3 {
        return format!(
            "its {} rounds differ by {:.0} %, too few to tell a slow stretch from drift (--rounds 3 or more)",
            rounds.len(),
            100.0 * row.spread()
        );
    }
    // The round farthest from the median of the others.
    let (i, ratio) = (0..rounds.len())
        .map(|i| {
            let mut others: Vec<f64> = rounds
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, &r)| r)
                .collect();
            (i, rounds[i] / median(&mut others))
        })
        .max_by(|a, b| (a.1 - 1.0).abs().total_cmp(&(b.1 - 1.0).abs()))
        .unwrap_or((0, 1.0));
    if (ratio - 1.0).abs() > NOISY_SPREAD {
        format!(
            "round {} of {} took {ratio:.2}x the others' time: one slow stretch{}",
            i + 1,
            rounds.len(),
            match busiest {
                Some((_, s)) => format!(
                    ", not other processes (at most {:.0} % of the host's CPU)",
                    100.0 * s
                ),
                None => String::new(),
            }
        )
    } else {
        let ms: Vec<String> = rounds.iter().map(|r| format!("{r:.3}")).collect();
        format!(
            "its rounds drift ({} ms) rather than one standing out",
            ms.join(" / ")
        )
    }
}
