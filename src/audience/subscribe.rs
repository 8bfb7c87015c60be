//! `/subscribe` and `/confirm/TOKEN`: people joining public lists by
//! themselves. Single-opt-in lists take the member at once (through the
//! import's writer, so nobody unsubscribed or bounced becomes active
//! again); double-opt-in lists get a sign-up row and a confirmation mail
//! (the user's message template `confirm`, else the built-in one, see
//! [`super::confirm_mail`]), and the member only when the link's page is
//! POSTed. What the form answers never
//! depends on whether the address was known, nor on a cap being reached.

use serde_json::json;

use crate::messages::{self, MessageError, Queue, Submit};
use crate::store::imports::Row;
use crate::store::lists::{self, PublicList};
use crate::store::{forgotten, now_ms, signups, subscribers, suppressions, Conn, StoreError};
use crate::tokens::Signer;

/// Confirmation mails one address may get in a day.
pub const MAILS_PER_DAY: i64 = 3;
/// Longest name a form may give.
pub const MAX_NAME: usize = 200;
const DAY_MS: i64 = 24 * 3600 * 1000;

#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// What to show next to the form's fields: (field, message).
    #[error("the form has mistakes")]
    Fields(Vec<(&'static str, String)>),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot send the confirmation mail: {0}")]
    Message(#[from] MessageError),
}

/// What a filled form asks.
#[derive(Debug, Clone, Default)]
pub struct Form {
    pub email: String,
    pub name: String,
    /// List names.
    pub lists: Vec<String>,
}

/// How confirmation mails are made.
#[derive(Debug, Clone)]
pub struct Mailer {
    pub queue: Queue,
    /// `MAILSPLIT_PUBLIC_URL`, no trailing `/`.
    pub public_url: String,
    pub signer: Signer,
    /// The built-in confirmation mail's sender (`MAILSPLIT_CONFIRM_FROM`,
    /// else [`super::confirm_mail::default_from`]).
    pub from: String,
}

/// The lists `/subscribe` offers.
pub fn public_lists(conn: &mut Conn) -> Result<Vec<PublicList>, SubscribeError> {
    Ok(lists::public(conn)?)
}

/// Act on a form; `Ok` whatever the address's state (the page says
/// "check your inbox" either way).
pub fn subscribe(
    conn: &mut Conn,
    form: &Form,
    mailer: Option<&Mailer>,
) -> Result<(), SubscribeError> {
    let offered = lists::public(conn)?;
    let (key, chosen) = check(form, &offered)?;
    let (email, name) = (form.email.trim(), form.name.trim());
    let now = now_ms();
    let single: Vec<String> = chosen
        .iter()
        .filter(|l| !l.double_opt_in)
        .map(|l| l.name.clone())
        .collect();
    if !single.is_empty() {
        subscribers::upsert(conn, &row(email, &key, name), &single)?;
    }
    let double: Vec<&PublicList> = chosen.iter().copied().filter(|l| l.double_opt_in).collect();
    if double.is_empty() {
        return Ok(());
    }
    let Some(mailer) = mailer else {
        tracing::warn!("a double-opt-in sign-up dropped: serve has no MAILSPLIT_PUBLIC_URL for the confirmation link");
        return Ok(());
    };
    send_confirmation(conn, mailer, email, &key, name, &double, now)
}

/// The form's fields checked: the address's key and the chosen lists
/// among those `offered`, or every mistake beside its field.
fn check<'a>(
    form: &Form,
    offered: &'a [PublicList],
) -> Result<(String, Vec<&'a PublicList>), SubscribeError> {
    let mut mistakes = Vec::new();
    let email = form.email.trim();
    let key = match crate::mailbox::key(email) {
        Ok(k) if messages::submit::parse_to(email).is_ok() => Some(k),
        _ => {
            mistakes.push((
                "email",
                "Enter an email address, like name@example.com.".into(),
            ));
            None
        }
    };
    let name = form.name.trim();
    if name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        mistakes.push(("name", format!("Use at most {MAX_NAME} characters.")));
    }
    let chosen: Vec<&PublicList> = offered
        .iter()
        .filter(|l| form.lists.iter().any(|n| n == &l.name))
        .collect();
    if chosen.is_empty() {
        mistakes.push(("list", "Choose at least one list.".into()));
    }
    match key.filter(|_| mistakes.is_empty()) {
        Some(key) => Ok((key, chosen)),
        None => Err(SubscribeError::Fields(mistakes)),
    }
}

/// Send the confirmation mail for the double-opt-in lists, unless the
/// address had its day's share of them.
fn send_confirmation(
    conn: &mut Conn,
    mailer: &Mailer,
    email: &str,
    key: &str,
    name: &str,
    double: &[&PublicList],
    now: i64,
) -> Result<(), SubscribeError> {
    signups::expire(conn, now - signups::KEEP_MS)?;
    if signups::count_since(conn, key, now - DAY_MS)? >= MAILS_PER_DAY {
        tracing::info!(
            "a sign-up dropped: its address had {MAILS_PER_DAY} confirmation mails today"
        );
        return Ok(());
    }
    let ids: Vec<i64> = double.iter().map(|l| l.id).collect();
    let id = signups::insert(conn, email, key, name, &ids, now)?;
    let token = mailer.signer.confirm_token(id, now);
    let titles: Vec<&str> = double.iter().map(|l| l.label()).collect();
    let template = super::confirm_mail::template(conn, &mailer.from)?;
    let sent = messages::submit_as(
        conn,
        &mailer.queue,
        Submit {
            template: template.into(),
            to: email.to_string(),
            data: Some(json!({
                "confirm_url": format!("{}/confirm/{token}", mailer.public_url),
                "lists": titles,
                "name": name,
            })),
            // With the time: SQLite reuses the id of a deleted (expired
            // or forgotten) last sign-up, and the key must stay unique.
            idempotency_key: Some(format!("signup-{id}-{now}")),
        },
        messages::AskedBy::Recipient,
    );
    match sent {
        // The same page either way: a suppressed address learns nothing.
        Err(MessageError::Refused(why)) => tracing::info!("a confirmation mail not sent: {why}"),
        other => {
            other?;
        }
    }
    Ok(())
}

fn row(email: &str, key: &str, name: &str) -> Row {
    Row {
        line: 1,
        email: email.to_string(),
        email_key: key.to_string(),
        name: (!name.is_empty()).then(|| name.to_string()),
        attributes: Default::default(),
        status: None,
        new_id: None,
    }
}

/// The sign-up a genuine, unexpired token names, if it still waits or
/// was confirmed (the page is the same).
pub fn pending(
    conn: &mut Conn,
    signer: &Signer,
    token: &str,
) -> Result<Option<signups::Signup>, SubscribeError> {
    let Some((id, made)) = signer.read_confirm(token) else {
        return Ok(None);
    };
    if now_ms() - made > signups::KEEP_MS {
        return Ok(None);
    }
    Ok(signups::find(conn, id)?.filter(|s| s.created_at == made))
}

/// Confirm the sign-up the token names: its lists get the member. True
/// when the token is genuine (a second confirm changes nothing).
pub fn confirm(conn: &mut Conn, signer: &Signer, token: &str) -> Result<bool, SubscribeError> {
    let Some(s) = pending(conn, signer, token)? else {
        return Ok(false);
    };
    conn.transaction(|conn| {
        if !signups::mark_confirmed(conn, s.id, now_ms())? {
            return Ok(true);
        }
        let names: Vec<String> = lists::public(conn)?
            .into_iter()
            .filter(|l| s.lists().contains(&l.id))
            .map(|l| l.name)
            .collect();
        // The person asked again and proved the address is theirs: an
        // erasure no longer holds (a suppression from before it does).
        if forgotten::lift(conn, &s.email_key)? == Some(true) {
            let entry = [s.email_key.clone()];
            suppressions::add(conn, &entry, "suppressed before it was forgotten", now_ms())?;
        }
        if !names.is_empty() {
            subscribers::upsert(conn, &row(&s.email, &s.email_key, &s.name), &names)?;
        }
        Ok(true)
    })
}
