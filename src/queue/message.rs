//! The job of one transactional message: `{"v":2,"db":"db-…","message":ID,
//! "mac":"…"}`, on the same tubes as campaign jobs, at a priority in a band
//! no campaign's can reach (see [`MESSAGE_PRIORITY`]), so the workers
//! reserve it before any campaign job that is ready. The signature is the
//! job signature over campaign 0 (no campaign has id 0) and the message
//! id, so no campaign job's signature is ever a message job's.

use serde::{Deserialize, Serialize};

use super::{BadJob, JOB_VERSION};
use crate::tokens::Identity;

/// beanstalkd priority of every message job: lower is more urgent, and
/// campaign priorities are clamped to [`super::CAMPAIGN_PRIORITY_MIN`] and
/// above.
pub const MESSAGE_PRIORITY: u32 = 0;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    v: u32,
    db: String,
    message: i64,
    mac: String,
}

/// Whether `bytes` is meant as a message job (it names a `message`), so
/// it is read by [`MessageJob::decode`] rather than as a campaign's job.
pub fn is_message_job(bytes: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        message: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(bytes).is_ok_and(|p| p.message.is_some())
}

/// One message to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageJob {
    pub message: i64,
}

impl MessageJob {
    /// The signed body for database `id`.
    pub fn encode(&self, id: &Identity) -> Vec<u8> {
        let wire = Wire {
            v: JOB_VERSION,
            db: id.database_id.clone(),
            message: self.message,
            mac: id.signer.job_mac(&id.database_id, 0, &[self.message]),
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
        if !id
            .signer
            .verify_job(&id.database_id, 0, &[wire.message], &wire.mac)
        {
            return Err(BadJob::BadSignature);
        }
        if wire.message <= 0 {
            return Err(BadJob::BadId(wire.message));
        }
        Ok(MessageJob {
            message: wire.message,
        })
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
        let job = MessageJob { message: 42 };
        let body = job.encode(&id);
        assert!(is_message_job(&body));
        assert_eq!(MessageJob::decode(&body, &id), Ok(job));
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
