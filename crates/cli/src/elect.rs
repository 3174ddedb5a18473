//! `stategate elect`: leader election from the command line, over any door, on the same
//! records the service's election API uses (`docs/election.md`):
//!
//! - campaign: take the lease NAME exactly as `stategate lock` does (the AIO leased lock's `SET
//!   NAME holder NEX PX ttl`, waiting on the door's watch for a release), then record the
//!   leadership in the companion key `NAME.proclaimed` (`holder` or `holder\nvalue`) written
//!   with the fencing token, as the service's campaign does;
//! - lead: run COMMAND, renewing the lease every ttl/3; when a renewal finds the lease gone or
//!   taken, COMMAND gets SIGTERM (SIGKILL after a grace) and elect exits 3;
//! - resign when COMMAND ends: `VDEL NAME holder`, then the proclamation goes.

use bytes::Bytes;

use super::args::Wait;
use super::lock::{self, Lease, Signals};
use super::output::{Output, escape};
use super::{CliError, Condition, Door, Exit, Format, Write};

/// What the companion key of an election adds to its name (the service's
/// `election::PROCLAIMED_SUFFIX`; the client imports no service crate).
const PROCLAIMED_SUFFIX: &[u8] = b".proclaimed";

fn proclaimed_key(name: &[u8]) -> Bytes {
    Bytes::from([name, PROCLAIMED_SUFFIX].concat())
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
    let mut proclamation = lease.holder.to_vec();
    if let Some(v) = value {
        proclamation.push(b'\n');
        proclamation.extend_from_slice(v);
    }
    let write = Write {
        key: companion.clone(),
        value: Bytes::from(proclamation),
        condition: Condition::Always,
        ttl: None,
        sliding: false,
        fencing: Some(token.clone()),
    };
    if let Err(e) = door.set(&write).await {
        // Leading without having said so would mislead observers: give the lease back.
        let _ = door.vdel(&lease.name, &lease.holder, None).await;
        return Err(e);
    }
    out.progress(|| format!("leading {}: fencing token {token}", escape(&lease.name)));
    let code = lock::run_under_lease(door, lease, &token, command, out, signals).await?;
    // Resigned (run_under_lease released the lease): the proclamation goes too; a later
    // leader's newer one refuses this token and stays.
    let _ = door.del(&companion, None, Some(token.as_str())).await;
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
    // The proclamation counts only if its holder is the lease's.
    let value = match door.get(&proclaimed_key(name)).await? {
        Some(p) => {
            let (holder, value) = match p.value.iter().position(|b| *b == b'\n') {
                Some(at) => (p.value.slice(..at), Some(p.value.slice(at + 1..))),
                None => (p.value.clone(), None),
            };
            if holder == lease.value { value } else { None }
        }
        None => None,
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
