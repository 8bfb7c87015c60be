//! The job of transactional messages: `{"v":2,"db":"db-…","message":ID,
//! "mac":"…"}` for one (the API's), `"messages":[ID,…]` for a batch (a
//! flow's due steps, up to [`MAX_BATCH`]), on the same tubes as campaign
//! jobs, at a priority in a band no campaign's can reach (see
//! [`MESSAGE_PRIORITY`]), so the workers reserve it before any campaign job
//! that is ready. The signature is the job signature over campaign 0 (no
//! campaign has id 0) and the message ids, so no campaign job's signature
//! is ever a message job's.

use serde::{Deserialize, Serialize};

use super::{BadJob, JOB_VERSION};
use crate::tokens::Identity;

/// beanstalkd priority of every message job: lower is more urgent, and
/// campaign priorities are clamped to [`super::CAMPAIGN_PRIORITY_MIN`] and
/// above.
pub const MESSAGE_PRIORITY: u32 = 0;

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

/// Messages to send: one, or a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageJob {
    pub messages: Vec<i64>,
}

impl MessageJob {
    /// The job of one message.
    pub fn one(message: i64) -> MessageJob {
        MessageJob {
            messages: vec![message],
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
            mac: id.signer.job_mac(&id.database_id, 0, &self.messages),
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
        if !id
            .signer
            .verify_job(&id.database_id, 0, &messages, &wire.mac)
        {
            return Err(BadJob::BadSignature);
        }
        if let Some(&bad) = messages.iter().find(|&&m| m <= 0) {
            return Err(BadJob::BadId(bad));
        }
        Ok(MessageJob { messages })
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
    fn no_campaign_priority_reaches_the_message_band() {
        for p in [i64::MIN, -1, 0, 1, 100, i64::MAX] {
            assert!(crate::queue::priority(p) > MESSAGE_PRIORITY, "{p}");
        }
    }
}
