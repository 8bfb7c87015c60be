//! `mailsplit dkim keygen|list|delete|rotate|activate`.

use crate::cli::args::{DkimCommand, Global};
use crate::cli::exit::UsageError;
use crate::cli::out::{error_line, outln};
use crate::dkim::{self as d, DkimAlgorithm, KeyState, StoredKey};

use super::{open_migrated, open_read_only, Conn, Result};

/// `dkim keygen | list | delete | rotate | activate`.
pub fn dkim(g: &Global, cmd: DkimCommand) -> Result {
    match cmd {
        DkimCommand::Keygen {
            domain,
            selector,
            algorithm,
        } => keygen(
            &mut open_migrated(g)?,
            &domain,
            selector.as_deref(),
            algorithm.into(),
        ),
        DkimCommand::List => list(&mut open_read_only(g)?),
        DkimCommand::Delete { domain, selector } => {
            delete(&mut open_migrated(g)?, &domain, selector.as_deref())
        }
        DkimCommand::Rotate {
            domain,
            algorithm,
            selector,
        } => rotate(
            &mut open_migrated(g)?,
            &domain,
            algorithm.map(Into::into),
            selector.as_deref(),
        ),
        DkimCommand::Activate { domain, selector } => {
            activate(&mut open_migrated(g)?, &domain, &selector)
        }
    }
}

/// Generate and store a key, and print the TXT record to publish.
fn keygen(
    conn: &mut Conn,
    domain: &str,
    selector: Option<&str>,
    algorithm: DkimAlgorithm,
) -> Result {
    let stored = d::keygen(conn, domain, selector, algorithm)?;
    let (domain, algorithm) = (&stored.domain, stored.algorithm);
    let size = size(algorithm);
    // The note first: it is on stderr, and stdout may be closed.
    let note = (algorithm == DkimAlgorithm::Ed25519).then(|| {
        format!(
            "mailsplit: note: not every receiver checks ed25519 signatures yet; keep an rsa \
             key for {domain} too (`mailsplit dkim keygen {domain}`)"
        )
    });
    let printed = print_keygen(domain, &size, &stored);
    if let Some(note) = note {
        error_line(&note);
    }
    printed
}

fn size(algorithm: DkimAlgorithm) -> String {
    match algorithm {
        DkimAlgorithm::Rsa => format!("rsa {} bits", d::RSA_BITS),
        DkimAlgorithm::Ed25519 => "ed25519".to_string(),
    }
}

fn print_keygen(domain: &str, size: &str, stored: &StoredKey) -> Result {
    outln!(
        "stored a new DKIM key for {domain} ({size}, selector {}).",
        stored.selector
    )?;
    outln!("Publish this DNS TXT record; receivers verify the signatures with it:\n")?;
    print_txt(stored)?;
    outln!("\nRunning workers sign mail from {domain} with it within seconds.")?;
    Ok(())
}

/// Make a pending key and print its TXT record; the active one signs on.
fn rotate(
    conn: &mut Conn,
    domain: &str,
    algorithm: Option<DkimAlgorithm>,
    selector: Option<&str>,
) -> Result {
    let d::Rotated { key, signing } = d::rotate(conn, domain, algorithm, selector)?;
    let domain = &key.domain;
    outln!(
        "stored a new pending DKIM key for {domain} ({}, selector {}).",
        size(key.algorithm),
        key.selector
    )?;
    outln!("Publish this DNS TXT record:\n")?;
    print_txt(&key)?;
    outln!(
        "\nMail from {domain} is still signed with selector {signing}. Once the record \
         resolves: `mailsplit dkim activate {domain} {}`; keep {signing}'s record until \
         the mail it signed is delivered.",
        key.selector
    )?;
    Ok(())
}

/// Make a key the active one of its algorithm.
fn activate(conn: &mut Conn, domain: &str, selector: &str) -> Result {
    let (key, retired) = d::activate(conn, domain, selector)?;
    let domain = &key.domain;
    outln!(
        "{domain}: selector {} ({}) is active; workers sign with it within seconds.",
        key.selector,
        key.algorithm
    )?;
    if let Some(old) = retired {
        outln!(
            "selector {old} is retired (signs nothing; `mailsplit dkim activate {domain} {old}` \
             switches back, `mailsplit dkim delete {domain} --selector {old}` removes it)."
        )?;
    }
    Ok(())
}

/// Every key with its TXT record.
fn list(conn: &mut Conn) -> Result {
    let keys = d::keys(conn)?;
    if keys.is_empty() {
        outln!("no DKIM keys; make one with `mailsplit dkim keygen DOMAIN`")?;
    }
    for key in keys {
        let state = match key.state {
            KeyState::Active => "active (signs)",
            KeyState::Pending => "pending (`dkim activate` it once its record resolves)",
            KeyState::Retired => "retired",
        };
        outln!(
            "{}  selector {}  {}  {state}",
            key.domain,
            key.selector,
            key.algorithm
        )?;
        print_txt(&key)?;
    }
    Ok(())
}

/// Delete a domain's keys (or one selector's).
fn delete(conn: &mut Conn, domain: &str, selector: Option<&str>) -> Result {
    let (domain, deleted) = d::delete_keys(conn, domain, selector)?;
    if deleted == 0 {
        return Err(UsageError(format!(
            "no DKIM key for {domain}{}; `mailsplit dkim list` shows them",
            selector
                .map(|s| format!(" with selector {s}"))
                .unwrap_or_default()
        ))
        .into());
    }
    outln!(
        "deleted {deleted} DKIM key(s) of {domain}; workers sign nothing more with them within seconds; \
         remove the TXT record only after the last signed messages are delivered"
    )?;
    Ok(())
}

/// A key's TXT record, as it is entered in a DNS provider's form and as a
/// zone-file line.
fn print_txt(key: &StoredKey) -> Result {
    let name = d::txt_name(&key.selector, &key.domain);
    let value = d::txt_value(key.algorithm, &key.public_key);
    outln!("  name:  {name}")?;
    outln!("  type:  TXT")?;
    outln!("  value: {value}")?;
    outln!("  zone:  {name}. IN TXT {}", d::zone_strings(&value))?;
    Ok(())
}
