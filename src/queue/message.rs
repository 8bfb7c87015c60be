//! The job of transactional messages: `{"v":2,"db":"db-…","message":ID,
//! "mac":"…"}` for one (the API's), `"messages":[ID,…]` for a batch (a
//! flow's due steps, up to [`MAX_BATCH`]), on the same tubes as campaign
//! jobs. A job travels in its [`Band`]: the API's at [`MESSAGE_PRIORITY`],
//! a flow's batches (`"band":"flow"`) at [`FLOW_PRIORITY`], both above
//! every campaign's (see [`super::CAMPAIGN_PRIORITY_MIN`]), so the workers
//! reserve a ready message before any campaign job, and an order
//! confirmation before a burst of welcome mail. The band is in the body
//! so a worker that releases the job for a retry keeps it there without
//! asking beanstalkd. The signature is the job signature over campaign 0
//! (or -1 for a flow's batch; no campaign has an id below 1) and the
//! message ids, so no campaign job's signature is ever a message job's,
//! and a band changed by hand breaks it.

use serde::{Deserialize, Serialize};

use super::{BadJob, JOB_VERSION};
use crate::tokens::Identity;

/// beanstalkd priority of a transactional message's job (the API's,
/// `send`'s): lower is more urgent, and nothing is more urgent than this.
pub const MESSAGE_PRIORITY: u32 = 0;
/// beanstalkd priority of a flow's batch: behind every transactional
/// message, so a burst of due steps never delays an order confirmation,
/// and ahead of every campaign, whose priorities are clamped to
/// [`super::CAMPAIGN_PRIORITY_MIN`] and above.
pub const FLOW_PRIORITY: u32 = 1;

// The bands in order: transactional, flows, then every campaign.
const _: () =
    assert!(MESSAGE_PRIORITY < FLOW_PRIORITY && FLOW_PRIORITY < super::CAMPAIGN_PRIORITY_MIN);

/// Which band a message job travels in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Band {
    /// A message the shop asked for (the API, `send`).
    #[default]
    Transactional,
    /// A flow's due steps.
    Flow,
}

impl Band {
    /// The beanstalkd priority of the band's jobs.
    pub fn priority(self) -> u32 {
        match self {
            Band::Transactional => MESSAGE_PRIORITY,
            Band::Flow => FLOW_PRIORITY,
        }
    }

    /// The campaign id the job signature covers: none that exists, and
    /// one per band.
    fn signed_as(self) -> i64 {
        match self {
            Band::Transactional => 0,
            Band::Flow => -1,
        }
    }
}

/// Most messages one job carries (as a campaign job's recipients).
pub const MAX_BATCH: usize = 100;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    v: u32,
    db: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    messages: Option<Vec<i64>>,
    /// Absent for a transactional message (jobs put before bands were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    band: Option<Band>,
    mac: String,
}

/// Whether `bytes` is meant as a message job (it names a `message` or
/// `messages`), so it is read by [`MessageJob::decode`] rather than as a
/// campaign's job.
pub fn is_message_job(bytes: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        message: Option<serde::de::IgnoredAny>,
        messages: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(bytes)
        .is_ok_and(|p| p.message.is_some() || p.messages.is_some())
}

/// The band of a message job's body, read without checking it (`None`:
/// not a message job): what the sweep for lost jobs learns from the job
/// at the head of the queue.
pub fn band_of(bytes: &[u8]) -> Option<Band> {
    #[derive(Deserialize)]
    struct Probe {
        band: Option<Band>,
    }
    if !is_message_job(bytes) {
        return None;
    }
    let band = serde_json::from_slice::<Probe>(bytes).ok()?.band;
    Some(band.unwrap_or_default())
}

/// Messages to send: one, or a batch, and the band they travel in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageJob {
    pub messages: Vec<i64>,
    pub band: Band,
}

impl MessageJob {
    /// The job of one transactional message.
    pub fn one(message: i64) -> MessageJob {
        MessageJob {
            messages: vec![message],
            band: Band::Transactional,
        }
    }

    /// The signed body for database `id`.
    pub fn encode(&self, id: &Identity) -> Vec<u8> {
        let (message, messages) = match self.messages.as_slice() {
            [one] => (Some(*one), None),
            many => (None, Some(many.to_vec())),
        };
        let wire = Wire {
            v: JOB_VERSION,
            db: id.database_id.clone(),
            message,
            messages,
            band: (self.band != Band::Transactional).then_some(self.band),
            mac: id
                .signer
                .job_mac(&id.database_id, self.band.signed_as(), &self.messages),
        };
        // Serialising integers and strings cannot fail.
        serde_json::to_vec(&wire).unwrap_or_default()
    }

    /// Parse and check a body that came over the wire.
    pub fn decode(bytes: &[u8], id: &Identity) -> Result<MessageJob, BadJob> {
        let wire: Wire = serde_json::from_slice(bytes).map_err(|e| BadJob::Parse(e.to_string()))?;
        if wire.v != JOB_VERSION {
            return Err(BadJob::Version(wire.v));
        }
        if wire.db != id.database_id {
            return Err(BadJob::Foreign(wire.db));
        }
        let messages = match (wire.message, wire.messages) {
            (Some(one), None) => vec![one],
            (None, Some(many)) if !many.is_empty() && many.len() <= MAX_BATCH => many,
            _ => {
                return Err(BadJob::Parse(format!(
                    "a message job names `message` or 1 to {MAX_BATCH} `messages`"
                )))
            }
        };
        let band = wire.band.unwrap_or_default();
        if !id
            .signer
            .verify_job(&id.database_id, band.signed_as(), &messages, &wire.mac)
        {
            return Err(BadJob::BadSignature);
        }
        if let Some(&bad) = messages.iter().find(|&&m| m <= 0) {
            return Err(BadJob::BadId(bad));
        }
        Ok(MessageJob { messages, band })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::JobBody;
    use crate::tokens::Signer;

    #[test]
    fn message_jobs_are_signed_and_told_from_campaign_jobs() {
        let id = Identity {
            database_id: "db-1".into(),
            signer: Signer::new(&[1; 32]),
        };
        let job = MessageJob::one(42);
        let body = job.encode(&id);
        assert!(is_message_job(&body));
        assert_eq!(MessageJob::decode(&body, &id), Ok(job));
        // A batch, signed over all its ids: one more id is a forgery.
        let batch = MessageJob {
            messages: vec![42, 43, 44],
            band: Band::Transactional,
        };
        let body3 = batch.encode(&id);
        assert!(is_message_job(&body3));
        assert_eq!(MessageJob::decode(&body3, &id), Ok(batch));
        let grown = String::from_utf8(body3).unwrap().replace("44]", "44,45]");
        assert_eq!(
            MessageJob::decode(grown.as_bytes(), &id),
            Err(BadJob::BadSignature)
        );
        let campaign = JobBody::new(7, vec![1]).encode(&id);
        assert!(!is_message_job(&campaign));
        // Another message id under the same signature: forged.
        let forged = String::from_utf8(body).unwrap().replace("42", "43");
        assert_eq!(
            MessageJob::decode(forged.as_bytes(), &id),
            Err(BadJob::BadSignature)
        );
        // A campaign job's signature over (0, [42]) can never be made by
        // `enqueue`: campaign 0 does not exist, and decode refuses it.
        assert!(JobBody::decode(&JobBody::new(0, vec![42]).encode(&id), &id).is_err());
    }

    #[test]
    fn a_flow_batch_carries_its_band_under_the_signature() {
        let id = Identity {
            database_id: "db-1".into(),
            signer: Signer::new(&[1; 32]),
        };
        let flow = MessageJob {
            messages: vec![7, 8],
            band: Band::Flow,
        };
        let body = flow.encode(&id);
        assert!(String::from_utf8_lossy(&body).contains(r#""band":"flow""#));
        assert_eq!(band_of(&body), Some(Band::Flow));
        assert_eq!(MessageJob::decode(&body, &id), Ok(flow.clone()));
        // One message of a flow is still a flow's job.
        let single = MessageJob {
            messages: vec![9],
            band: Band::Flow,
        };
        assert_eq!(MessageJob::decode(&single.encode(&id), &id), Ok(single));
        // A transactional job's body is as before bands (no `band`).
        let tx = MessageJob::one(7).encode(&id);
        assert!(!String::from_utf8_lossy(&tx).contains("band"));
        assert_eq!(band_of(&tx), Some(Band::Transactional));
        assert_eq!(band_of(&JobBody::new(7, vec![1]).encode(&id)), None);
        // The band is signed: moved by hand into another band, or taken
        // out, the job is a forgery.
        let text = String::from_utf8(body).unwrap();
        for forged in [
            text.replace(r#""band":"flow","#, ""),
            text.replace("flow", "transactional"),
        ] {
            assert_eq!(
                MessageJob::decode(forged.as_bytes(), &id),
                Err(BadJob::BadSignature),
                "{forged}"
            );
        }
        let raised = String::from_utf8(MessageJob::one(7).encode(&id))
            .unwrap()
            .replace(r#","mac""#, r#","band":"flow","mac""#);
        assert_eq!(
            MessageJob::decode(raised.as_bytes(), &id),
            Err(BadJob::BadSignature)
        );
    }

    #[test]
    fn bands_in_order_transactional_flows_campaigns() {
        assert_eq!(Band::Transactional.priority(), MESSAGE_PRIORITY);
        assert_eq!(Band::Flow.priority(), FLOW_PRIORITY);
        for p in [i64::MIN, -1, 0, 1, 2, 100, i64::MAX] {
            assert!(crate::queue::priority(p) > FLOW_PRIORITY, "{p}");
        }
        assert_eq!(crate::queue::priority(2), 2);
    }
}
