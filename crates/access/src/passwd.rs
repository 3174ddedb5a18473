//! `stategate passwd FILE USER`: adds or replaces a user's entry in an MQTT password file (like
//! `mosquitto_passwd`), or removes it with `--delete`. The password is read from standard
//! input (one line; not echoed on a terminal). The file is rewritten whole (a temporary file
//! renamed over it, mode 0600), keeping every other line as it was.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use super::identity::hash_entry;

/// Arguments of `stategate passwd`.
#[derive(Debug, Clone, Args)]
pub struct PasswdArgs {
    /// The password file (created if missing).
    pub file: PathBuf,
    /// The MQTT username.
    pub user: String,
    /// Remove the user instead of setting a password.
    #[arg(long)]
    pub delete: bool,
}

/// Runs the command; returns the process exit status (0, or 64 for bad input, 1 for I/O).
pub fn run(args: &PasswdArgs) -> i32 {
    match apply(args) {
        Ok(msg) => {
            eprintln!("{msg}");
            0
        }
        Err((code, msg)) => {
            eprintln!("stategate passwd: {msg}");
            code
        }
    }
}

fn apply(args: &PasswdArgs) -> Result<String, (i32, String)> {
    let existing = match std::fs::read_to_string(&args.file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !args.delete => String::new(),
        Err(e) => return Err((1, format!("{}: {e}", args.file.display()))),
    };
    // Refuse to rewrite a file that would not load.
    super::Passwords::parse(&args.file, &existing).map_err(|e| (64, e.to_string()))?;
    let prefix = format!("{}:", args.user);
    let (mut lines, found) = without_user(&existing, &prefix);
    if args.delete {
        if !found {
            return Err((1, format!("no user {:?} in {}", args.user, args.file.display())));
        }
        write(&args.file, &lines).map_err(|e| (1, e))?;
        return Ok(format!("removed {}", args.user));
    }
    let password = read_password().map_err(|e| (1, e))?;
    if password.is_empty() {
        return Err((64, "the password is empty".into()));
    }
    let entry = hash_entry(&args.user, password.as_bytes()).map_err(|e| (64, e))?;
    lines.push(entry);
    write(&args.file, &lines).map_err(|e| (1, e))?;
    Ok(format!("{} {}", if found { "updated" } else { "added" }, args.user))
}

/// The file's lines without `user`'s entry, and whether it had one.
fn without_user(text: &str, prefix: &str) -> (Vec<String>, bool) {
    let mut found = false;
    let lines = text
        .lines()
        .filter(|l| {
            let mine = l.trim_start().starts_with(prefix);
            found |= mine;
            !mine
        })
        .map(str::to_owned)
        .collect();
    (lines, found)
}

fn write(path: &Path, lines: &[String]) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let fail = |e: std::io::Error| format!("{}: {e}", tmp.display());
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp).map_err(fail)?;
    for l in lines {
        writeln!(f, "{l}").map_err(fail)?;
    }
    f.sync_all().map_err(fail)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// One line of standard input, without echo when it is a terminal.
fn read_password() -> Result<String, String> {
    let stdin = std::io::stdin();
    let terminal = stdin.is_terminal();
    if terminal {
        eprint!("password: ");
    }
    let _echo = terminal.then(EchoOff::new);
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("reading the password: {e}"))?;
    if terminal {
        eprintln!();
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

/// Turns terminal echo off until dropped.
struct EchoOff {
    #[cfg(unix)]
    saved: Option<libc::termios>,
}

impl EchoOff {
    fn new() -> EchoOff {
        #[cfg(unix)]
        {
            // SAFETY: tcgetattr/tcsetattr on fd 0 with a zeroed termios they fill in.
            unsafe {
                let mut t: libc::termios = std::mem::zeroed();
                if libc::tcgetattr(0, &mut t) != 0 {
                    return EchoOff { saved: None };
                }
                let saved = t;
                t.c_lflag &= !libc::ECHO;
                libc::tcsetattr(0, libc::TCSANOW, &t);
                EchoOff { saved: Some(saved) }
            }
        }
        #[cfg(not(unix))]
        EchoOff {}
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(t) = &self.saved {
            // SAFETY: restores the settings read in `new`.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, t);
            }
        }
    }
}
