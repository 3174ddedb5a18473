//! CPU time per request of each party to a row (daprd, the store behind it, the load
//! generator), from the kernel's per-thread run time (`/proc/.../task/*/schedstat`, in ns).
//! On a machine where every party shares the same cores, the CPU a request costs decides
//! throughput at saturation, and this says whose it is.

use std::path::Path;

/// Whose CPU time to count.
#[derive(Clone, Debug)]
pub enum Source {
    /// Every thread of another process (daprd, redis-server).
    Process(u32),
    /// This process's threads whose name starts with the prefix: the runtimes are named
    /// (`stategate` serves, `load` loads), and stategate's own threads are `stategate-*`.
    Threads(&'static str),
}

fn run_ns(task: &Path) -> u64 {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn sum_tasks(dir: &Path, name_prefix: Option<&str>) -> u64 {
    let Ok(tasks) = std::fs::read_dir(dir) else { return 0 };
    tasks
        .filter_map(Result::ok)
        .map(|t| t.path())
        .filter(|t| {
            name_prefix
                .is_none_or(|p| std::fs::read_to_string(t.join("comm")).is_ok_and(|c| c.trim_end().starts_with(p)))
        })
        .map(|t| run_ns(&t))
        .sum()
}

impl Source {
    /// CPU time so far, in ns (threads that exited are not counted: the runtimes' threads and
    /// Go's do not exit during a row).
    pub fn ns(&self) -> u64 {
        match self {
            Source::Process(pid) => sum_tasks(&Path::new("/proc").join(pid.to_string()).join("task"), None),
            Source::Threads(prefix) => sum_tasks(Path::new("/proc/self/task"), Some(prefix)),
        }
    }
}

/// Named sources, read together.
pub fn snapshot(sources: &[(&'static str, Source)]) -> Vec<u64> {
    sources.iter().map(|(_, s)| s.ns()).collect()
}
