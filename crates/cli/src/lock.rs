//! `stategate lock`: a lease taken exactly as the Azure IoT Operations leased lock takes one, so
//! that the CLI and SDK clients exclude each other:
//!
//! - acquire and renew: `SET name holder NEX PX ttl` (the holder is the value; NEX lets the
//!   holder renew its own lease); the version of that SET is the fencing token;
//! - wait: observe the name (KEYNOTIFY over MQTT, the door's watch elsewhere), try again on a
//!   delete or expiry, and every [`RETRY_WHILE_WAITING`] in case a notification is missed;
//! - release: `VDEL name holder` (deletes only our own lease).

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::args::Wait;
use super::output::{self, Output, escape};
use super::{CliError, Condition, Door, Event, Exit, SetOutcome, Watch, Write};

/// The environment variable the command run under a lease finds its fencing token in.
pub const FENCING_TOKEN_ENV: &str = "STATEGATE_FENCING_TOKEN";
/// While waiting for a held lease, try again this often even without a notification.
const RETRY_WHILE_WAITING: Duration = Duration::from_secs(1);
/// After a lost lease, how long the command has to exit after SIGTERM before it gets SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(10);

/// One lease: its name (the key), who holds it (the value) and how long it lasts.
#[derive(Debug, Clone)]
pub struct Lease {
    pub name: Bytes,
    pub holder: Bytes,
    pub ttl: Duration,
}

impl Lease {
    fn write(&self) -> Write {
        Write {
            key: self.name.clone(),
            value: self.holder.clone(),
            condition: Condition::Nex,
            ttl: Some(self.ttl),
            sliding: false,
            fencing: None,
        }
    }
}

/// SIGINT and SIGTERM, caught from the moment this is created.
pub struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caught {
    Interrupt,
    Terminate,
}

impl Signals {
    pub fn new() -> Result<Signals, CliError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let err = |e| CliError::unavailable(format!("cannot catch signals: {e}"));
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt()).map_err(err)?,
                terminate: signal(SignalKind::terminate()).map_err(err)?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    pub async fn recv(&mut self) -> Caught {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => Caught::Interrupt,
                _ = self.terminate.recv() => Caught::Terminate,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Caught::Interrupt
        }
    }
}

/// One attempt: the fencing token when the lease is ours, `None` when another holder has it.
async fn try_acquire(door: &dyn Door, lease: &Lease) -> Result<Option<String>, CliError> {
    match door.set(&lease.write()).await? {
        SetOutcome::Applied { version: Some(v) } => Ok(Some(v)),
        SetOutcome::Applied { version: None } => Err(CliError::unavailable(
            "the service took the lease but returned no version (no fencing token)",
        )),
        SetOutcome::NotApplied => Ok(None),
    }
}

/// Who holds the lease now, for messages.
async fn holder_of(door: &dyn Door, lease: &Lease) -> String {
    match door.get(&lease.name).await {
        Ok(Some(f)) => format!("held by {}", escape(&f.value)),
        Ok(None) => "released meanwhile".into(),
        Err(_) => "held by another holder".into(),
    }
}

/// Takes the lease, then runs `command` under it, or prints the fencing token without one.
pub async fn lock(
    door: &dyn Door,
    lease: &Lease,
    wait: Wait,
    command: &[std::ffi::OsString],
    out: Output,
    signals: &mut Signals,
) -> Result<i32, CliError> {
    let token = acquire(door, lease, wait, out, signals).await?;
    if command.is_empty() {
        out.print(output::locked(out.format, &lease.name, &lease.holder, &token))?;
        return Ok(Exit::Done as i32);
    }
    out.progress(|| format!("locked {}: fencing token {token}", escape(&lease.name)));
    run_under_lease(door, lease, &token, command, out, signals).await
}

/// Why waiting for a release ended.
enum WaitEnded {
    Released,
    WatchGone,
}

async fn released(watch: &mut Watch) -> WaitEnded {
    loop {
        match watch.events.recv().await {
            Some(Ok(Event::Delete { .. } | Event::Expire { .. })) => return WaitEnded::Released,
            // A live watch never resets; a reset would mean "look again", as a release does.
            Some(Ok(Event::Reset)) => return WaitEnded::Released,
            Some(Ok(Event::Set { .. } | Event::Synced { .. })) => {}
            Some(Ok(Event::Overflow) | Err(_)) | None => return WaitEnded::WatchGone,
        }
    }
}

pub(crate) async fn acquire(
    door: &dyn Door,
    lease: &Lease,
    wait: Wait,
    out: Output,
    signals: &mut Signals,
) -> Result<String, CliError> {
    if let Some(token) = try_acquire(door, lease).await? {
        return Ok(token);
    }
    let deadline = match wait {
        Wait::AtMost(d) if d.is_zero() => {
            let who = holder_of(door, lease).await;
            return Err(CliError::new(
                Exit::NotFound,
                format!("the lock {} is {who}", escape(&lease.name)),
            ));
        }
        Wait::AtMost(d) => Some(Instant::now() + d),
        Wait::Forever => None,
    };
    // Observe first, then try again, so a release in between is not missed (as the SDK does).
    let mut watch = match door.watch(std::slice::from_ref(&lease.name), &[], None).await {
        Ok(w) => Some(w),
        Err(e) => {
            out.progress(|| format!("cannot observe the lock ({}); retrying every second", e.message));
            None
        }
    };
    let mut reported = String::new();
    let result = loop {
        match try_acquire(door, lease).await {
            Ok(Some(token)) => break Ok(token),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        if out.verbose {
            let who = holder_of(door, lease).await;
            if who != reported {
                eprintln!("waiting: the lock {} is {who}", escape(&lease.name));
                reported = who;
            }
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            let who = holder_of(door, lease).await;
            break Err(CliError::new(
                Exit::NotFound,
                format!("the lock {} is {who}; gave up waiting", escape(&lease.name)),
            ));
        }
        let retry_at = deadline.map_or(now + RETRY_WHILE_WAITING, |d| d.min(now + RETRY_WHILE_WAITING));
        let gone = tokio::select! {
            _ = signals.recv() => break Err(CliError::new(Exit::NotFound, "interrupted while waiting for the lock")),
            _ = tokio::time::sleep_until(retry_at) => false,
            ended = async {
                match watch.as_mut() {
                    Some(w) => released(w).await,
                    None => std::future::pending().await,
                }
            } => matches!(ended, WaitEnded::WatchGone),
        };
        if gone && let Some(w) = watch.take() {
            door.unwatch(w).await;
        }
    };
    if let Some(w) = watch {
        door.unwatch(w).await;
    }
    result
}

/// Runs the command with the fencing token, renewing the lease every ttl/3; releases it after.
pub(crate) async fn run_under_lease(
    door: &dyn Door,
    lease: &Lease,
    token: &str,
    command: &[std::ffi::OsString],
    out: Output,
    signals: &mut Signals,
) -> Result<i32, CliError> {
    let mut child = match tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env(FENCING_TOKEN_ENV, token)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            release(door, lease, out).await;
            return Err(CliError::usage(format!(
                "cannot run {}: {e}",
                command[0].to_string_lossy()
            )));
        }
    };
    let renew_every = (lease.ttl / 3).max(Duration::from_millis(1));
    let mut next_renewal = Instant::now() + renew_every;
    let mut last_renewed = Instant::now();
    let mut lost: Option<CliError> = None;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = tokio::time::sleep_until(next_renewal), if lost.is_none() => {
                match try_acquire(door, lease).await {
                    Ok(Some(_)) => last_renewed = Instant::now(),
                    Ok(None) => {
                        let who = holder_of(door, lease).await;
                        lost = Some(CliError::conflict(format!(
                            "lost the lock {}: it is {who}; the command was stopped",
                            escape(&lease.name)
                        )));
                    }
                    Err(e) if last_renewed.elapsed() >= lease.ttl => {
                        lost = Some(CliError::conflict(format!(
                            "lost the lock {}: no renewal succeeded within its ttl ({}); the command was stopped",
                            escape(&lease.name),
                            e.message
                        )));
                    }
                    Err(e) => out.progress(|| format!("renewing the lease failed, trying again: {}", e.message)),
                }
                next_renewal = Instant::now() + renew_every;
                if lost.is_some() {
                    pass_on(&child, Caught::Terminate);
                    kill_at = Some(Instant::now() + TERM_GRACE);
                }
            }
            _ = async {
                match kill_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => {
                let _ = child.start_kill();
                kill_at = None;
            }
            caught = signals.recv() => {
                // At a terminal Ctrl-C already reached the command (same process group); pass
                // on only what was sent to this process alone.
                use std::io::IsTerminal;
                if caught == Caught::Terminate || !std::io::stdin().is_terminal() {
                    pass_on(&child, caught);
                }
            }
        }
    };
    let status = status.map_err(|e| CliError::unavailable(format!("waiting for the command: {e}")))?;
    if let Some(e) = lost {
        return Err(e);
    }
    release(door, lease, out).await;
    Ok(exit_code(status))
}

/// Releases the lease; a failure is reported, not fatal (the lease then ends with its ttl).
async fn release(door: &dyn Door, lease: &Lease, out: Output) {
    match door.vdel(&lease.name, &lease.holder, None).await {
        Ok(super::DelOutcome::Deleted) => out.progress(|| format!("released {}", escape(&lease.name))),
        Ok(_) => eprintln!(
            "stategate: the lock {} was no longer ours when the command ended",
            escape(&lease.name)
        ),
        Err(e) => eprintln!(
            "stategate: could not release the lock {} ({}); it ends when its ttl runs out",
            escape(&lease.name),
            e.message
        ),
    }
}

/// The command's status as ours: its exit code, or 128+N when signal N ended it (as shells do).
fn exit_code(status: std::process::ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return 128 + sig;
        }
    }
    Exit::Unavailable as i32
}

/// Sends the signal to the command, if it still runs.
fn pass_on(child: &tokio::process::Child, caught: Caught) {
    #[cfg(unix)]
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let sig = match caught {
            Caught::Interrupt => libc::SIGINT,
            Caught::Terminate => libc::SIGTERM,
        };
        // SAFETY: kill(2) has no memory effects; `pid` is our own child, not yet reaped (tokio
        // reaps it only in `wait`, which is not running while this arm runs).
        unsafe {
            libc::kill(pid, sig);
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (child, caught);
    }
}
