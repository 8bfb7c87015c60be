//! Webhook rows: the receivers, their lease (one delivering process at a
//! time), and what delivering did (counts, the last error, when to try
//! again). The events themselves wait in [`super::outbox`].

use diesel::prelude::*;

use super::outbox::EventKind;
use super::schema::{
    campaign_links, campaigns, messages, recipients, webhook_outbox as o, webhooks as w,
};
use super::{now_ms, on, Conn, Result};

/// One webhook as `webhook ls` shows it (never its secret).
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = w)]
pub struct Webhook {
    pub id: i64,
    pub url: String,
    pub events: String,
    pub created_at: i64,
    pub next_at: i64,
    pub attempts: i64,
    pub delivered: i64,
    pub failed: i64,
    pub posts: i64,
    pub last_error: Option<String>,
    pub last_error_at: Option<i64>,
    pub last_ok_at: Option<i64>,
}

/// What a deliverer needs of a webhook it holds.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = w)]
pub struct Target {
    pub id: i64,
    pub url: String,
    pub secret: String,
    pub attempts: i64,
    /// Whether its host may be this machine or its link (`--allow-local`).
    pub allow_local: bool,
}

/// One event of a batch, as the receiver gets it.
#[derive(Debug, Clone, Queryable)]
pub struct Pending {
    pub id: i64,
    pub kind: EventKind,
    pub campaign: Option<String>,
    pub email: Option<String>,
    pub at: i64,
    /// A click's link.
    pub url: Option<String>,
    /// An event about a transactional message: its id and recipient.
    pub message: Option<i64>,
    pub message_to: Option<String>,
}

/// Store a webhook (`allow_local`: it may point at loopback or link-local
/// addresses); returns its id.
pub fn add(
    conn: &mut Conn,
    url: &str,
    events: &[EventKind],
    secret: &str,
    allow_local: bool,
) -> Result<i64> {
    let events: Vec<&str> = events.iter().map(|k| k.as_str()).collect();
    let id = on!(conn, |c| diesel::insert_into(w::table)
        .values((
            w::url.eq(url),
            w::events.eq(events.join(",")),
            w::secret.eq(secret),
            w::created_at.eq(now_ms()),
            w::allow_local.eq(allow_local),
        ))
        .returning(w::id)
        .get_result(c))?;
    super::outbox::forget_subscribers(conn);
    Ok(id)
}

/// Every webhook, oldest first, with the events waiting for it.
pub fn list(conn: &mut Conn) -> Result<Vec<(Webhook, i64)>> {
    let hooks: Vec<Webhook> = on!(conn, |c| w::table
        .order(w::id)
        .select(Webhook::as_select())
        .load(c))?;
    let pending: Vec<(i64, i64)> = on!(conn, |c| o::table
        .group_by(o::webhook_id)
        .select((o::webhook_id, diesel::dsl::count_star()))
        .load(c))?;
    let pending: std::collections::HashMap<i64, i64> = pending.into_iter().collect();
    Ok(hooks
        .into_iter()
        .map(|h| {
            let n = pending.get(&h.id).copied().unwrap_or(0);
            (h, n)
        })
        .collect())
}

/// Remove a webhook and the events waiting for it; false if no such id.
pub fn remove(conn: &mut Conn, id: i64) -> Result<bool> {
    let removed = conn.transaction(|conn| {
        let n = on!(conn, |c| diesel::delete(w::table.find(id)).execute(c))?;
        on!(conn, |c| diesel::delete(
            o::table.filter(o::webhook_id.eq(id))
        )
        .execute(c))?;
        Ok::<_, super::StoreError>(n == 1)
    })?;
    super::outbox::forget_subscribers(conn);
    Ok(removed)
}

/// Webhooks due for a try (`next_at` passed) with events waiting, whose
/// lease is free, over, or already `owner`'s.
pub fn due(conn: &mut Conn, owner: &str, now: i64) -> Result<Vec<i64>> {
    Ok(on!(conn, |c| w::table
        .filter(w::next_at.le(now))
        .filter(
            w::lease_until
                .lt(now)
                .or(w::lease_owner.eq(owner))
                .or(w::lease_owner.is_null())
        )
        .filter(diesel::dsl::exists(
            o::table.filter(o::webhook_id.eq(w::id))
        ))
        .order(w::id)
        .select(w::id)
        .load(c))?)
}

/// Take (or renew) the lease on a webhook until `until`; the target when
/// this process holds it now.
pub fn lease(
    conn: &mut Conn,
    id: i64,
    owner: &str,
    now: i64,
    until: i64,
) -> Result<Option<Target>> {
    let taken = on!(conn, |c| diesel::update(
        w::table.find(id).filter(
            w::lease_until
                .lt(now)
                .or(w::lease_owner.eq(owner))
                .or(w::lease_owner.is_null())
        )
    )
    .set((w::lease_owner.eq(Some(owner)), w::lease_until.eq(until)))
    .execute(c))?;
    if taken == 0 {
        return Ok(None);
    }
    Ok(on!(conn, |c| w::table
        .find(id)
        .select(Target::as_select())
        .first(c)
        .optional())?)
}

/// Give up the leases `owner` holds (a deliverer stopping).
pub fn release(conn: &mut Conn, owner: &str) -> Result<()> {
    on!(conn, |c| diesel::update(
        w::table.filter(w::lease_owner.eq(owner))
    )
    .set((w::lease_owner.eq(None::<String>), w::lease_until.eq(0)))
    .execute(c))?;
    Ok(())
}

/// The oldest `limit` events waiting for a webhook, in the order written.
pub fn batch(conn: &mut Conn, id: i64, limit: i64) -> Result<Vec<Pending>> {
    Ok(on!(conn, |c| o::table
        .left_join(campaigns::table.on(campaigns::id.nullable().eq(o::campaign_id)))
        .left_join(recipients::table.on(recipients::id.nullable().eq(o::recipient_id)))
        .left_join(
            campaign_links::table.on(campaign_links::campaign_id
                .nullable()
                .eq(o::campaign_id)
                .and(campaign_links::version.nullable().eq(o::link_version))
                .and(campaign_links::n.nullable().eq(o::link_n))),
        )
        .left_join(messages::table.on(messages::id.nullable().eq(o::message_id)))
        .filter(o::webhook_id.eq(id))
        .order(o::id)
        .limit(limit)
        .select((
            o::id,
            o::kind,
            campaigns::name.nullable(),
            recipients::email.nullable(),
            o::at,
            campaign_links::url.nullable(),
            o::link_url,
            o::message_id,
            messages::to_addr.nullable(),
        ))
        .load::<(
            i64,
            EventKind,
            Option<String>,
            Option<String>,
            i64,
            Option<String>,
            Option<String>,
            Option<i64>,
            Option<String>,
        )>(c))?
    .into_iter()
    .map(
        |(id, kind, campaign, email, at, numbered, written, message, message_to)| Pending {
            id,
            kind,
            campaign,
            email,
            at,
            // A numbered link's URL from its table, else the URL the template
            // wrote, carried by the event itself.
            url: numbered.or(written),
            message,
            message_to,
        },
    )
    .collect())
}

/// The receiver took these events: they leave the outbox and count as
/// delivered; the next try is due at once.
pub fn delivered(conn: &mut Conn, id: i64, events: &[i64], now: i64) -> Result<()> {
    conn.transaction(|conn| {
        let mut n = 0;
        for chunk in events.chunks(1_000) {
            n += on!(conn, |c| diesel::delete(
                o::table
                    .filter(o::webhook_id.eq(id))
                    .filter(o::id.eq_any(chunk))
            )
            .execute(c))? as i64;
        }
        on!(conn, |c| diesel::update(w::table.find(id))
            .set((
                w::delivered.eq(w::delivered + n),
                w::posts.eq(w::posts + 1),
                w::attempts.eq(0),
                w::next_at.eq(0),
                w::last_ok_at.eq(Some(now)),
            ))
            .execute(c))?;
        Ok(())
    })
}

/// A try failed: remember why, try again at `next_at`, and give up (drop
/// and count as failed) the events written before `give_up_before`.
pub fn attempt_failed(
    conn: &mut Conn,
    id: i64,
    error: &str,
    now: i64,
    next_at: i64,
    give_up_before: i64,
) -> Result<i64> {
    let error = super::clip_line(error, 300);
    conn.transaction(|conn| {
        let dropped = on!(conn, |c| diesel::delete(
            o::table
                .filter(o::webhook_id.eq(id))
                .filter(o::at.lt(give_up_before))
        )
        .execute(c))? as i64;
        on!(conn, |c| diesel::update(w::table.find(id))
            .set((
                w::failed.eq(w::failed + dropped),
                w::posts.eq(w::posts + 1),
                w::attempts.eq(w::attempts + 1),
                w::next_at.eq(next_at),
                w::last_error.eq(Some(&error)),
                w::last_error_at.eq(Some(now)),
            ))
            .execute(c))?;
        Ok(dropped)
    })
}
