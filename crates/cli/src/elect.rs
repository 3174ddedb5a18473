//! `stategate elect`: leader election from the command line, over any door, on the same
//! records the service's election API uses (`docs/election.md`):
//!
//! - campaign: take the lease NAME exactly as `stategate lock` does (the AIO leased lock's `SET
//!   NAME holder NEX PX ttl`, waiting on the door's watch for a release), then record the
//!   leadership in the companion key `NAME.proclaimed` (`engine::proclamation`: the service's
//!   encoder and parser, so both read it alike) written with the fencing token, as the
//!   service's campaign does, over nothing or an earlier proclamation only (never over an
//!   ordinary key of that name);
//! - lead: run COMMAND, renewing the lease every ttl/3; when a renewal finds the lease gone or
//!   taken, COMMAND gets SIGTERM (SIGKILL after a grace) and elect exits 3;
//! - resign when COMMAND ends: `VDEL NAME holder`, then the proclamation goes if it is still
//!   this leadership's (its holder and token), by a `VDEL` of the bytes just read.

use bytes::Bytes;

use crate::engine::proclamation::{self, Proclamation, proclaimed_key};
use crate::hlc::Hlc;

use super::args::Wait;
use super::lock::{self, Lease, Signals};
use super::output::{Output, escape};
use super::{CliError, Condition, Door, Exit, Format, SetOutcome, Write};

/// Writes the proclamation `p` into `companion` with its token: where nothing is, or over an
/// earlier proclamation (fenced, so only a holder of a token may have replaced it meanwhile).
/// `false`: the key holds something else, left as it is.
async fn write_proclamation(door: &dyn Door, companion: &Bytes, p: &Proclamation) -> Result<bool, CliError> {
    // A creation that loses to another write looks again (a few times: writers of this key
    // are leaders, one at a time).
    for _ in 0..8 {
        let stored = door.get(companion).await?;
        if !proclamation::may_replace(stored.as_ref().map(|f| &f.value)) {
            return Ok(false);
        }
        let write = Write {
            key: companion.clone(),
            value: p.encode(),
            condition: match stored {
                None => Condition::Nx,
                Some(_) => Condition::Always,
            },
            ttl: None,
            sliding: false,
            fencing: Some(p.token.to_string()),
        };
        if let SetOutcome::Applied { .. } = door.set(&write).await? {
            return Ok(true);
        }
    }
    Err(CliError::conflict(format!(
        "{} kept changing while elect wrote it",
        escape(companion)
    )))
}

/// Campaigns for `lease` (its name is the election's), runs `command` while leading.
pub async fn elect(
    door: &dyn Door,
    lease: &Lease,
    value: Option<&Bytes>,
    wait: Wait,
    command: &[std::ffi::OsString],
    out: Output,
    signals: &mut Signals,
) -> Result<i32, CliError> {
    if lease.holder.contains(&b'\n') {
        return Err(CliError::usage("the holder may not contain a newline"));
    }
    let token = lock::acquire(door, lease, wait, out, signals).await?;
    let companion = proclaimed_key(&lease.name);
    let written = match token.parse::<Hlc>() {
        Ok(hlc) => {
            let p = Proclamation {
                token: hlc,
                holder: lease.holder.clone(),
                value: value.cloned(),
            };
            match write_proclamation(door, &companion, &p).await {
                Ok(true) => Ok(p),
                Ok(false) => Err(CliError::conflict(format!(
                    "{} holds a key that is not this election's proclamation: elect does not overwrite it \
                     (delete or rename it)",
                    escape(&companion)
                ))),
                Err(e) => Err(e),
            }
        }
        Err(_) => Err(CliError::unavailable(format!(
            "the service answered a fencing token that is no version: {token:?}"
        ))),
    };
    let written = match written {
        Ok(w) => w,
        Err(e) => {
            // Leading without having said so would mislead observers: give the lease back.
            let _ = door.vdel(&lease.name, &lease.holder, None).await;
            return Err(e);
        }
    };
    out.progress(|| format!("leading {}: fencing token {token}", escape(&lease.name)));
    let code = lock::run_under_lease(door, lease, &token, command, out, signals).await?;
    // Resigned (run_under_lease released the lease): the proclamation goes too if it is still
    // this leadership's (its holder and token; a proclaim through the service may have changed
    // the value). `VDEL` of the bytes read: anything written since stays.
    if let Ok(Some(found)) = door.get(&companion).await
        && Proclamation::parse(&found.value).is_some_and(|p| p.token == written.token && p.holder == written.holder)
    {
        let _ = door.vdel(&companion, &found.value, Some(token.as_str())).await;
    }
    Ok(code)
}

/// Prints who leads NAME: exit 0, or 1 when nobody does.
pub async fn print_leader(door: &dyn Door, name: &Bytes, out: Output) -> Result<i32, CliError> {
    let Some(lease) = door.get(name).await? else {
        match out.format {
            Format::Json => println!("{}", serde_json::json!({ "name": text(name), "leader": null })),
            Format::Human | Format::Raw => eprintln!("nobody leads {}", escape(name)),
        }
        return Ok(Exit::NotFound as i32);
    };
    // The proclamation counts only for the lease it belongs to (the service's rule, through
    // the same parser): its holder's, with a token not newer than the lease.
    let lease_version = lease.version.as_deref().and_then(|v| v.parse::<Hlc>().ok());
    let value = match (door.get(&proclaimed_key(name)).await?, &lease_version) {
        (Some(p), Some(version)) => Proclamation::parse(&p.value)
            .filter(|p| p.belongs_to(&lease.value, version))
            .and_then(|p| p.value),
        _ => None,
    };
    let version = lease.version.unwrap_or_default();
    match out.format {
        Format::Json => println!(
            "{}",
            serde_json::json!({
                "name": text(name),
                "leader": text(&lease.value),
                "value": value.as_deref().map(text),
                "lease_version": version,
            })
        ),
        Format::Raw => println!("{}", text(&lease.value)),
        Format::Human => {
            println!("{}", escape(&lease.value));
            if let Some(v) = &value {
                println!("value: {}", escape(v));
            }
            if out.verbose {
                println!("lease version: {version}");
            }
        }
    }
    Ok(Exit::Done as i32)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
