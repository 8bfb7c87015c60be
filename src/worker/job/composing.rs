//! Composing a job's recipients' messages: in batches on the blocking
//! pool when they are DKIM-signed or rendered from the user's templates,
//! inline otherwise (see [`compose_batch`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::super::flags::CampaignInfo;
use super::super::pipeline::Msg;
use super::super::shared::Shared;
use crate::compose::{self, Unsendable};
use crate::store::recipients;

/// DKIM-signed messages composed per hand-off to the blocking pool: enough
/// that the hand-off costs little beside the signatures, few enough that a
/// batch of RSA signatures (a few milliseconds of one core) keeps the
/// senders fed. Smaller when the senders' queue has less room
/// ([`sign_batch`]).
pub(super) const SIGN_BATCH: usize = 16;

/// A recipient's id and address, and its composed message (or why there
/// is none).
pub(super) type Composing = (i64, String, Result<crate::mail::Composed, Unsendable>);

/// [`SIGN_BATCH`], but no more than the senders' queue has room for, so a
/// batch never waits composed (with a key a `dkim activate` may have just
/// retired) for room in the queue; at least one.
pub(super) fn sign_batch(to_send: &async_channel::Sender<Msg>) -> usize {
    let room = to_send
        .capacity()
        .map_or(SIGN_BATCH, |cap| cap.saturating_sub(to_send.len()));
    room.clamp(1, SIGN_BATCH)
}

/// Whether a campaign's messages are composed on the runtime's own thread:
/// unsigned and without stored templates (a campaign older than stored
/// content: literal subject, built-in template), whose cost is small and
/// known. Stored templates (even a subject alone) render on the blocking
/// pool: one may use its whole render budget for some recipient's data,
/// and must not hold the thread the SMTP sessions, the reporter and the
/// shutdown run on.
pub(super) fn inline(info: &CampaignInfo) -> bool {
    info.mail.dkim.is_empty() && info.mail.content.is_none()
}

/// Compose a batch of recipients' messages, each beside its recipient. A
/// DKIM-signed batch, or one of the user's own templates (up to
/// [`SIGN_BATCH`]), is composed in one task on tokio's blocking pool, at
/// most one batch per core at a time ([`Shared::signers`]): an RSA
/// signature is a fraction of a millisecond of CPU, and a render may use
/// its whole budget, that would otherwise stall the SMTP sessions sharing
/// this thread; one hand-off per batch rather than per message saves the
/// thread wake-ups that cost more than an ed25519 signature. An unsigned
/// message from a built-in template is composed here ([`inline`]).
pub(super) async fn compose_batch(
    shared: &Shared,
    info: &Arc<CampaignInfo>,
    variants: &Arc<HashMap<i64, i64>>,
    batch: Vec<recipients::Recipient>,
) -> Vec<Composing> {
    let variants = Arc::clone(variants);
    let abort = shared.scheduler.abort().clone();
    // After an abort the rest of the batch is left unrendered (the caller
    // hands it back): a batch of renders that each use their whole budget
    // must not hold the exit.
    let compose_all = move |info: &CampaignInfo, batch: Vec<recipients::Recipient>| {
        batch
            .into_iter()
            .take_while(|_| !abort.is_cancelled())
            .map(|r| {
                let mail = info.mail_for(variants.get(&r.id).copied());
                let composed = compose::compose(mail, &r);
                (r.id, r.email, composed)
            })
            .collect::<Vec<Composing>>()
    };
    if inline(info) {
        return compose_all(info, batch);
    }
    let Ok(permit) = Arc::clone(&shared.signers).acquire_owned().await else {
        // Never closed; should it be, compose here.
        return compose_all(info, batch);
    };
    // Kept to give each recipient an outcome should the task fail.
    let kept: Vec<(i64, String)> = batch.iter().map(|r| (r.id, r.email.clone())).collect();
    let info = Arc::clone(info);
    match tokio::task::spawn_blocking(move || {
        let composed = compose_all(&info, batch);
        drop(permit);
        composed
    })
    .await
    {
        Ok(composed) => composed,
        Err(e) => kept
            .into_iter()
            .map(|(rid, email)| {
                let why = format!("composing failed: {e}");
                (rid, email, Err(Unsendable::Invalid(why)))
            })
            .collect(),
    }
}
