//! `mailsplit dkim keygen|list|delete`.

use crate::cli::args::{DkimCommand, Global};
use crate::cli::exit::UsageError;
use crate::cli::out::{error_line, outln};
use crate::dkim::{self as d, DkimAlgorithm, StoredKey};

use super::{open_migrated, open_read_only, Conn, Result};

/// `dkim keygen | list | delete`.
pub fn dkim(g: &Global, cmd: DkimCommand) -> Result {
    match cmd {
        DkimCommand::Keygen {
            domain,
            selector,
            algorithm,
        } => keygen(&mut open_migrated(g)?, &domain, &selector, &algorithm),
        DkimCommand::List => list(&mut open_read_only(g)?),
        DkimCommand::Delete { domain, selector } => {
            delete(&mut open_migrated(g)?, &domain, selector.as_deref())
        }
    }
}

/// Generate and store a key, and print the TXT record to publish.
fn keygen(conn: &mut Conn, domain: &str, selector: &str, algorithm: &str) -> Result {
    let stored = d::keygen(conn, domain, selector, algorithm)?;
    let (domain, algorithm) = (&stored.domain, stored.algorithm);
    let size = match algorithm {
        DkimAlgorithm::Rsa => format!("rsa {} bits", d::RSA_BITS),
        DkimAlgorithm::Ed25519 => "ed25519".to_string(),
    };
    // The note first: it is on stderr, and stdout may be closed.
    let note = (algorithm == DkimAlgorithm::Ed25519).then(|| {
        format!(
            "mailsplit: note: not every receiver checks ed25519 signatures yet; keep an rsa \
             key for {domain} too (`mailsplit dkim keygen {domain} --selector OTHER`)"
        )
    });
    let printed = print_keygen(domain, &size, &stored);
    if let Some(note) = note {
        error_line(&note);
    }
    printed
}

fn print_keygen(domain: &str, size: &str, stored: &StoredKey) -> Result {
    outln!(
        "stored a new DKIM key for {domain} ({size}, selector {}).",
        stored.selector
    )?;
    outln!("Publish this DNS TXT record; receivers verify the signatures with it:\n")?;
    print_txt(stored)?;
    outln!(
        "\nWorkers sign mail from {domain} for campaigns they load from now on \
         (restart running workers to sign campaigns already in progress)."
    )?;
    Ok(())
}

/// Every key with its TXT record.
fn list(conn: &mut Conn) -> Result {
    let keys = d::keys(conn)?;
    if keys.is_empty() {
        outln!("no DKIM keys; make one with `mailsplit dkim keygen DOMAIN`")?;
    }
    for key in keys {
        outln!(
            "{}  selector {}  {}",
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
        "deleted {deleted} DKIM key(s) of {domain}; workers sign nothing more with them once they restart; \
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
