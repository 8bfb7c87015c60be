//! `mailsplit apikey create | ls | revoke`. A key is printed once, by
//! `create`; nothing else can show it (only its hash is stored).

use serde_json::json;

use crate::cli::args::{ApikeyCommand, Global, ScopeArg};
use crate::cli::out::outln;
use crate::clock::{self, Precision};
use crate::serve::api::keys;

use super::{open_migrated, open_read_only, Result};

/// `apikey create | ls | revoke`.
pub fn apikey(g: &Global, cmd: ApikeyCommand) -> Result {
    match cmd {
        ApikeyCommand::Create { name, scopes } => create(g, &name, &scopes),
        ApikeyCommand::Ls { json } => ls(g, json),
        ApikeyCommand::Revoke { name } => {
            keys::revoke(&mut open_migrated(g)?, &name)?;
            outln!("revoked API key {name:?}: requests with it are refused from now on")?;
            Ok(())
        }
    }
}

fn create(g: &Global, name: &str, scopes: &[ScopeArg]) -> Result {
    let names: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    let scopes = keys::parse_scopes(&names.join(","))?;
    let key = keys::create(&mut open_migrated(g)?, name, &scopes)?;
    let shown: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    outln!("created API key {name:?} with scopes {}", shown.join(","))?;
    outln!("key (shown only now; send it as `Authorization: Bearer KEY`):")?;
    outln!("{key}")?;
    Ok(())
}

fn ls(g: &Global, json: bool) -> Result {
    let all = keys::list(&mut open_read_only(g)?)?;
    if all.is_empty() && !json {
        outln!("no API keys; make one with `mailsplit apikey create NAME --scopes read`")?;
    }
    for k in all {
        let scopes: Vec<&str> = k.scopes.iter().map(|s| s.as_str()).collect();
        let used = k
            .last_used_at
            .map(|ms| clock::rfc3339(ms, Precision::AsNeeded));
        if json {
            let row = json!({
                "name": k.name,
                "scopes": scopes,
                "created_at": clock::rfc3339(k.created_at, Precision::AsNeeded),
                "last_used_at": used,
            });
            outln!("{row}")?;
        } else {
            outln!(
                "{}  scopes {}  created {}  last used {}",
                k.name,
                scopes.join(","),
                clock::rfc3339(k.created_at, Precision::AsNeeded),
                used.as_deref().unwrap_or("never")
            )?;
        }
    }
    Ok(())
}
